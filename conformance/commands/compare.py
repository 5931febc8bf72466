"""`parity compare`: a trace against a golden, the difference explained."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.log import log
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import load_trace
from conformance.gate.replay import oracle_windows
from conformance.judging.goldens import GOLDENS, lookup
from conformance.judging.judging import judge_trace
from conformance.judging.verdict import CANDIDATE, exit_status
from conformance.report.render_text import render


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare a trace with a golden and explain the difference")
    p.add_argument("--trace", required=True, type=Path)
    p.add_argument("--golden", type=Path, help="default: the gate oracle's golden for the trace's scenario")
    p.add_argument("--replay", type=Path, metavar="SCENARIO",
                   help="a production-scale scenario's file: replay the gate oracle live up to the trace's "
                        "first difference from its golden, to show both sides' records there")
    p.set_defaults(handler=compare)


def compare(args) -> int:
    pins = load_pins()
    trace = load_trace(args.trace)
    if args.replay:
        scenario = load_scenario(args.replay)
        if scenario.name != trace.scenario_name:
            raise InputError(f"--replay {args.replay}: scenario {scenario.name!r}, the trace's is "
                             f"{trace.scenario_name!r}")
        trace = oracle_windows(trace, scenario, pins, log)
    golden = lookup(args.golden) if args.golden else GOLDENS.lookup(trace.scenario_name, pins.oracle)
    engine = trace.engine
    name = engine.get("name")
    if isinstance(name, str) and name and not trace.label.startswith(name):
        # a command's run is named by its hello, as the gate names it, not by its command line
        trace = trace.with_label(f"{name} {engine.get('version') or ''}".strip())
    verdict = judge_trace(trace, golden, CANDIDATE)
    print(render([verdict], pins.oracle))
    return exit_status([verdict])
