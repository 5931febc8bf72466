"""The gate's report files: the folder claimed for the whole run, and the reports written as a
set. Claiming the folder removes every report an earlier run left there, and the parts a killed
run left, before anything else is written; the reports are all rendered before any is written,
then each is written whole. A run that fails or crashes midway leaves no report, never one that
says PASS beside another that says FAIL."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from conformance.formats.files import FolderError, claim_folder
from conformance.report.render_ci import junit, markdown
from conformance.report.render_html import html_report
from conformance.report.view import GateView


# A reports folder that cannot be used: a file, not writable, or in use by another gate.
ReportsError = FolderError

# Every report a run writes in its folder (annotation.md by report/ci.py): the set a claim clears.
REPORTS = ("junit.xml", "summary.md", "report.html", "annotation.md")


@contextlib.contextmanager
def claimed(folder: Path | None):
    """The reports folder, checked and claimed before any engine runs, for the whole run: a
    path that cannot hold the reports is bad input (not a traceback after the verdict), and a
    second gate given the same folder while one runs is refused at once instead of the two
    overwriting each other's files (its lock file: `.parity-reports.lock`). The reports of an
    earlier run are removed once it is held."""
    with claim_folder(folder, "--reports", "reports"):
        if folder is not None:
            _clear(folder)
        yield  # the lock ends with the block, or with the process (kill -9 included)


def _clear(folder: Path) -> None:
    """The reports of an earlier run and the parts a killed run left (`.junit.xml.<pid>.part`):
    removed while the folder is held, so none of them is read as this run's."""
    stale = [folder / name for name in REPORTS]
    stale += [p for p in folder.glob(".*.part") if any(p.name.startswith(f".{name}.") for name in REPORTS)]
    try:
        for path in stale:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise ReportsError(f"--reports {folder}: cannot remove the earlier run's {path.name}: "
                           f"{exc.strerror or exc}") from None


def write_text(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a report."""
    write_set({path: text})


def write_set(texts: dict[Path, str]) -> None:
    """Each file written to its part first, then every part renamed into place: a failure
    while writing (a full disk) leaves none of them, and no part behind."""
    parts: dict[Path, Path] = {}
    try:
        for path, text in texts.items():
            parts[path] = path.with_name(f".{path.name}.{os.getpid()}.part")
            parts[path].write_text(text, encoding="utf-8")
    except BaseException:
        for part in parts.values():
            part.unlink(missing_ok=True)
        raise
    for path, part in parts.items():
        os.replace(part, path)


def write_reports(out: Path, view: GateView) -> list[Path]:
    """junit.xml, summary.md and report.html, all rendered before any is written."""
    out.mkdir(parents=True, exist_ok=True)
    texts = {out / "junit.xml": junit(view), out / "summary.md": markdown(view),
             out / "report.html": html_report(view)}
    write_set(texts)
    return list(texts)
