"""The gate's report files: the folder claimed for the whole run, and each file written whole."""

from __future__ import annotations

import os
from pathlib import Path

from ..files import FolderError, claim_folder
from .render_ci import junit, markdown
from .render_html import html_report
from .view import GateView


# A reports folder that cannot be used: a file, not writable, or in use by another gate.
ReportsError = FolderError


def claimed(folder: Path | None):
    """The reports folder, checked and claimed before any engine runs, for the whole run: a
    path that cannot hold the reports is bad input (not a traceback after the verdict), and a
    second gate given the same folder while one runs is refused at once instead of the two
    overwriting each other's files (its lock file: `.parity-reports.lock`)."""
    return claim_folder(folder, "--reports", "reports")


def write_text(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a report."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


def write_reports(out: Path, view: GateView) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "junit.xml", out / "summary.md", out / "report.html"]
    write_text(paths[0], junit(view))
    write_text(paths[1], markdown(view))
    write_text(paths[2], html_report(view))
    return paths
