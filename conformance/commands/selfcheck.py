"""`parity selfcheck`: does an engine speak the protocol correctly, on every layer its hello
declares?"""

from __future__ import annotations

from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.log import log
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.gate.options import SCENARIO_DIR
from conformance.process.launch import prepare_engine

# `parity selfcheck` runs each of these on the layers it has that the engine declares: the
# steps layer both with speculation (DFlash) and without
SELF_CHECK = ("dflash_27b_gate", "steady_decode", "kv_pressure_no_spec", "method_matrix", "engine_ngram")


def register(sub) -> None:
    p = sub.add_parser("selfcheck", help="check that an engine speaks the protocol correctly, on "
                       "every layer its hello declares")
    p.add_argument("--engine", required=True)
    p.add_argument("--scenario", action="append", type=Path,
                   help="repeatable; each is run on the layers it has that the engine declares "
                   "(default: " + ", ".join(SELF_CHECK) + ")")
    p.set_defaults(handler=selfcheck)


def selfcheck(args) -> int:
    from conformance.judging.judging import scenario_features
    from conformance.process.selfcheck import selfcheck as check

    scenarios = [load_scenario(p) for p in args.scenario or [SCENARIO_DIR / f"{n}.json" for n in SELF_CHECK]]
    pins = load_pins()
    spec = prepare_engine(EngineRef.parse(args.engine, pins), pins, log)
    problems = check(spec, scenarios, log=log, needs=lambda s: scenario_features(s, pins.oracle))
    for problem in problems:
        print(f"FAIL {problem}")
    print("protocol self-check: " + ("passed" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0
