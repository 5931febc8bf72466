"""`parity merge`: every shard's results folder combined into the gate's verdict."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.log import log
from conformance.formats.pins import load_pins
from conformance.gate.context import RunContext
from conformance.gate.options import read_waivers
from conformance.gate.run import merge as run_merge


def register(sub) -> None:
    p = sub.add_parser("merge", help="combine the results folders of every shard into the gate's verdict")
    p.add_argument("results", nargs="+", type=Path, metavar="RESULTS", help="one folder per shard")
    p.add_argument("--waivers", type=Path, help="waived divergences (default: waivers.toml, "
                   "which may be absent; any other path must exist)")
    p.add_argument("--reports", type=Path, help="write junit.xml, summary.md, report.html and annotation.md here")
    p.add_argument("--drift", action="store_true", help="also print the drift across pins and the per-pin tables")
    p.set_defaults(handler=merge)


def merge(args) -> int:
    context = RunContext(load_pins(), log, waivers=read_waivers(args.waivers), reports=args.reports,
                         drift=args.drift)
    return run_merge(context, args.results)
