"""`parity bump X`: its options, and the bump's steps (bump/steps.py), imported when it runs."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.log import log
from conformance.gate.options import read_scenarios


def register(sub) -> None:
    p = sub.add_parser("bump", help="make a release the gate oracle: check its CPU rebuild and dependencies, "
                       "edit [tool.vllm-parity], lock its GPU set, build it, write its goldens and the "
                       "pull request's text (make bump PIN=X)")
    p.add_argument("release", help="the release to make the gate oracle, e.g. 0.28.0")
    p.add_argument("--pr-text", type=Path, help="where the pull request's text (markdown) is written "
                   "(default: out/bump/pull-request.md; it is also printed)")
    p.set_defaults(handler=command)


def command(args) -> int:
    from conformance.bump.steps import bump

    return bump(args.release, read_scenarios(None), log, args.pr_text)
