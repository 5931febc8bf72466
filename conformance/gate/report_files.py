"""The gate's report files: the folder claimed for the whole run, and each file written whole."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from .render_ci import junit, markdown
from .render_html import html_report
from .view import GateView


class ReportsError(ValueError):
    """The reports folder cannot be used: a file, not writable, or in use by another gate."""


LOCK = ".parity-reports.lock"


@contextlib.contextmanager
def claimed(folder: Path | None):
    """The reports folder, checked and claimed before any engine runs, for the whole run: a
    path that cannot hold the reports is bad input (not a traceback after the verdict), and a
    second gate given the same folder while one runs is refused at once instead of the two
    overwriting each other's files."""
    if folder is None:
        yield
        return
    if folder.exists() and not folder.is_dir():
        raise ReportsError(f"--reports {folder}: is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / LOCK, "a+")
    except OSError as exc:
        raise ReportsError(f"--reports {folder}: cannot write there: {exc.strerror or exc}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise ReportsError(f"--reports {folder}: another gate (pid {holder}) is writing its reports "
                               "there; give each gate its own folder") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield  # the lock ends when the file closes


def write_text(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a report."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    os.replace(part, path)


def write_reports(out: Path, view: GateView) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "junit.xml", out / "summary.md", out / "report.html"]
    write_text(paths[0], junit(view))
    write_text(paths[1], markdown(view))
    write_text(paths[2], html_report(view))
    return paths
