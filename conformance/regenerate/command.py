"""The `parity goldens` command (`make goldens` calls it: PINS=, LAYERS=, SCENARIOS=): which
goldens, from the pinned oracles' runs or a gate's results folder (--from-results), written or
only checked (--check), through the golden front door (regenerate/lifecycle.py)."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.errors import InputError
from conformance.formats.log import log
from conformance.formats.pins import load_pins
from conformance.formats.protocol import LAYERS
from conformance.gate.options import read_scenarios
from conformance.judging.goldens import GOLDENS, GoldenRefused
from conformance.regenerate.lifecycle import Selection, oracle_runs, regenerate, report, results_runs


def register(sub) -> None:
    p = sub.add_parser("goldens", help="regenerate every pin's goldens from real oracle runs (make goldens)")
    p.add_argument("--check", action="store_true",
                   help="regenerate in memory; fail if any golden would change or has no scenario")
    p.add_argument("--engine", action="append", help="only these pins (a candidate is refused)")
    p.add_argument("--scenario", action="append", type=Path, help="default: every scenarios/*.json")
    p.add_argument("--layers", help="only the goldens of scenarios with any of these layers (comma-separated; "
                   "`engine`: the engine layers); a golden always holds every layer of its scenario")
    p.add_argument("--from-results", action="append", type=Path, metavar="DIR",
                   help="the oracle's traces from a gate's results folder (`parity gate --results DIR`; "
                   "repeat for every shard's) instead of running it again")
    p.add_argument("--scale", choices=("library", "production", "all"), default="all",
                   help="without --scenario, the goldens of which scenarios/*.json: the library, the "
                        "production-scale scenarios (minutes of oracle time each), or all (default)")
    p.set_defaults(handler=command)


def command(args) -> int:
    return goldens_command(args, read_scenarios(args.scenario, args.scale), read_scenarios(None), log)


def goldens_command(args, scenarios, library, log) -> int:
    """`scenarios`: those asked for (--scenario, or the library's at --scale); `library`: every scenario
    file, whose goldens the orphans are checked against unless --scenario narrows the run."""
    pins = load_pins()
    refs = [EngineRef.parse(text, pins) for text in args.engine or pins.releases]
    for ref in refs:
        if not ref.is_pin:
            raise GoldenRefused(
                f"refusing to regenerate goldens from {ref.text!r}: only a pinned vLLM oracle "
                f"({', '.join(pins.releases)}) writes goldens")
    narrowed = args.scenario or getattr(args, "scale", "all") != "all"  # --scenario, or one scale's
    names = frozenset(s.name for s in scenarios) if narrowed else None
    selection = Selection(tuple(ref.release for ref in refs), goldens_layers(args.layers), names)
    write = not args.check
    if args.from_results:
        runs = results_runs(args.from_results, selection, pins, log, write)
    else:
        runs = oracle_runs(selection, scenarios, pins, log, write)
    outcomes = regenerate(runs, write, say=log)
    orphans = [] if args.scenario else GOLDENS.orphans({s.name for s in library}, pins.declared)
    return report(outcomes, orphans, args.check, log)


def goldens_layers(text: str | None) -> tuple[str, ...]:
    """--layers (LAYERS=): layer names, or `engine` for the engine layers, comma- or
    space-separated; it selects scenarios, never cuts a golden's layers."""
    words = tuple((text or "").replace(",", " ").split())
    unknown = [w for w in words if w != "engine" and w not in LAYERS]
    if unknown:
        raise InputError(f"--layers: unknown layer(s) {unknown}; known: engine (the engine layers), {list(LAYERS)}")
    return words
