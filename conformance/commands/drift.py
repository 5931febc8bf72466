"""`parity drift`: where each pin first departs from the previous, per scenario."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.pins import load_pins
from conformance.gate.options import read_scenarios
from conformance.report.drift import drift_rows, render_drift
from conformance.report.methods_table import render_methods_table


def register(sub) -> None:
    p = sub.add_parser("drift", help="where each pin first departs from the previous, per scenario")
    p.add_argument("--scenario", action="append", type=Path, help="default: every scenarios/*.json")
    p.set_defaults(handler=drift)


def drift(args) -> int:
    pins = load_pins()
    print(render_drift(drift_rows([s.name for s in read_scenarios(args.scenario, "library")], pins.releases)))
    print(render_methods_table(pins.releases))
    return 0
