"""`parity docs`: the docs' generated tables rewritten from what generates them, or checked."""

from __future__ import annotations

from conformance.formats.log import log
from conformance.formats.pins import REPO_ROOT
from conformance.gate.options import read_scenarios


def register(sub) -> None:
    p = sub.add_parser("docs", help="rewrite the docs' scenario tables (scenarios/README.md, docs/porting.md) "
                       "from scenarios/*.json")
    p.add_argument("--check", action="store_true", help="change nothing; fail if a table differs")
    p.set_defaults(handler=docs)


def docs(args) -> int:
    from conformance.report.readme_tables import FILES, render, stale

    scenarios = read_scenarios(None)
    differ = 0
    for relative, names in FILES.items():
        path = REPO_ROOT / relative
        if args.check:
            for name in stale(path, scenarios, names):
                log(f"parity docs: {relative}'s {name} table differs from what generates it: run `parity docs`")
                differ = 1
            continue
        text = path.read_text(encoding="utf-8")
        new = render(text, scenarios, names, where=relative)
        if new != text:
            path.write_text(new, encoding="utf-8")
            log(f"parity docs: {relative}'s generated tables rewritten")
    return differ
