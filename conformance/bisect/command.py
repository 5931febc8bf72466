"""`parity bisect --from A --to B`: the port queue of an upstream range (bisect/search.py).

The source and base release default to those of the declared commit pin A or B names (else
the first declared commit's): --source and --base say otherwise. --scenario and --rows pick the
scenarios (default: the library); --layers the layers (default: each scenario's stand-in
layers). The queue is printed as text; --markdown writes it for a pull request or a ticket.
"""

from __future__ import annotations

from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.files import check_output_file, write_text_atomic
from conformance.formats.log import log
from conformance.formats.pins import Pins, load_pins
from conformance.formats.scenario import Scenario
from conformance.gate.options import parse_layers, read_scenarios


def register(sub) -> None:
    p = sub.add_parser("bisect", help="the port queue of an upstream range: the first-parent commits of "
                       "A..B that change a scenario's trace, found by building commit pins")
    p.add_argument("--from", dest="start", required=True, help="A: a commit (sha, vllm@sha12) or tag of the source")
    p.add_argument("--to", dest="end", required=True, help="B: a commit or tag of the source, after A")
    p.add_argument("--scenario", action="append", type=Path, help="default: every library scenario")
    p.add_argument("--rows", help="comma-separated engine-matrix rows: only the scenarios filed under them")
    p.add_argument("--layers", help="comma-separated layers (default: each scenario's stand-in layers)")
    p.add_argument("--source", help="the repository: a git URL, a local path or file:// (default: that of "
                   "the declared commit A or B names, else of the first declared commit)")
    p.add_argument("--base", help="the release each commit's CPU environment is laid over (default: as --source)")
    p.add_argument("--markdown", type=Path, help="also write the port queue in markdown here")
    p.set_defaults(handler=command)


def command(args) -> int:
    args.layers = parse_layers(args.layers)
    return run_bisect(args, load_pins(), read_scenarios(args.scenario, "library"), log)


def origin(pins: Pins, start: str, end: str, source: str | None, base: str | None) -> tuple[str, str]:
    """(source, base) of the range: given, else the declared commit A or B names, else the first."""
    named = [c for c in pins.commits if any(c.commit.startswith(rev.removeprefix("vllm@")) and len(rev) >= 7
                                            for rev in (start, end))]
    known = named[0] if named else (pins.commits[0] if pins.commits else None)
    if (source is None or base is None) and known is None:
        raise InputError("parity bisect: no --source and --base given, and no commit is declared in "
                         "[tool.vllm-parity.commits] to take them from")
    return source or known.source, base or known.base


def run_bisect(args, pins: Pins, scenarios: list[Scenario], log) -> int:
    from conformance.bisect.search import bisect  # the search's modules, only when it runs
    from conformance.process.commit_env import local_repo
    from conformance.report.port_queue import render_markdown, render_text

    if args.markdown:
        check_output_file(args.markdown, "--markdown")
    if args.rows:
        wanted = {r.strip() for r in args.rows.split(",") if r.strip()}
        scenarios = [s for s in scenarios if wanted & set(s.rows)]
        if not scenarios:
            raise InputError(f"--rows {args.rows}: no scenario belongs to these engine-matrix rows")
    source, base = origin(pins, args.start, args.end, args.source, args.base)
    start, end = args.start.removeprefix("vllm@"), args.end.removeprefix("vllm@")
    repo = local_repo(source, base, log)
    queue = bisect(repo, source, base, start, end, pins, scenarios, args.layers, log)
    print(render_text(queue))
    if args.markdown:
        write_text_atomic(args.markdown, render_markdown(queue))
        log(f"[bisect] the port queue in markdown: {args.markdown}")
    return 0
