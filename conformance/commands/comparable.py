"""`parity comparable`: may two runs' throughput figures be compared?"""

from __future__ import annotations

from pathlib import Path

from conformance.formats.trace import load_trace


def register(sub) -> None:
    p = sub.add_parser("comparable", help="may these two runs' throughput figures be compared?")
    p.add_argument("traces", nargs=2, type=Path, metavar="TRACE")
    p.set_defaults(handler=comparable)


def comparable(args) -> int:
    from conformance.judging.comparability import NotComparable, check_comparable

    a, b = (load_trace(p) for p in args.traces)
    try:
        check_comparable(a, b)
    except NotComparable as exc:
        print(f"NOT COMPARABLE: {exc}")
        return 1
    print(f"comparable: {a.label} and {b.label} ran {a.scenario_name} "
          "under equal per-step token budgets")
    return 0
