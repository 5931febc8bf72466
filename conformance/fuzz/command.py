"""`parity fuzz`: its options, and the run (fuzz/campaign.py) started on a findings folder no
other search writes to. The search's modules (hypothesis) are imported only when it runs."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.files import claim_folder
from conformance.formats.log import log
from conformance.formats.scenario import load_scenario
from conformance.gate.options import MAX_EXAMPLES, MAX_FINDINGS, budget_seconds, whole_number


def register(sub) -> None:
    p = sub.add_parser("fuzz", help="search for a scenario on which a candidate differs from the "
                       "oracle, shrink it, write it as a scenario file (make fuzz)")
    p.add_argument("--candidate", required=True, help="the engine to fuzz: a command line, a pin, or "
                   "a pin's TEST DEVICE mutant (0.27.1+mutant:NAME)")
    p.add_argument("--against", help="the oracle pin (default: the gate oracle)")
    p.add_argument("--budget", type=budget_seconds, help="time to search, like 90s, 10m, 1h (default 10m)")
    p.add_argument("--examples", type=whole_number(1, MAX_EXAMPLES, "examples to run"),
                   help="examples to run, instead of a time budget")
    p.add_argument("--seed", type=int, help="the same seed gives the same examples (default: random, printed)")
    p.add_argument("--layers", help="comma-separated layers: stand-in ones (default: steps,outputs, those the "
                   "candidate serves; config,steps,outputs judges config too) or engine ones "
                   "(engine_steps,engine_outputs: the whole engine on the tiny models)")
    p.add_argument("--out", type=Path, help="where findings are written (default: out/fuzz)")
    p.add_argument("--findings", type=whole_number(1, MAX_FINDINGS, "findings"), default=1,
                   help="stop after this many distinct findings (default 1)")
    p.add_argument("--guide", choices=("behaviours", "coverage"), default="behaviours",
                   help="what the search prefers: examples where the oracle's scheduler does more "
                   "(default), or also those reaching branches of the scheduling code not reached "
                   "yet (runs the oracle under coverage.py; progress shows branches reached)")
    p.add_argument("--replay", type=Path, metavar="FILE", help="run one scenario file on both engines "
                   "and print the verdict, as the gate prints it")
    p.set_defaults(handler=command)


def command(args) -> int:
    from conformance.fuzz.campaign import DEFAULT_OUT, check_out, fuzz_command

    if args.replay:
        load_scenario(args.replay)  # a bad file is bad input before any engine starts
        return fuzz_command(args, log)
    folder = args.out or DEFAULT_OUT
    check_out(folder)  # a folder findings can be written to...
    with claim_folder(folder, "--out", "findings"):  # ...that no other search is writing to
        return fuzz_command(args, log)
