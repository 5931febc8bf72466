"""The one logging path of the harness: a line on stderr (stdout is for verdicts and reports).
Every `log` parameter defaults to `log` here; tests and commands pass their own. Standard
library only."""

from __future__ import annotations

import sys

from conformance.formats.visible import visible_lines


def log(message: str) -> None:
    """One write per line: engines and environment builds log from several threads at once, and
    print() writes the text and its newline apart, so two lines could run together. Made
    visible: a message may quote an engine's stderr, whose ESC or CR must not reach the
    terminal (the reports escape the same way)."""
    sys.stderr.write(f"{visible_lines(message)}\n")
    sys.stderr.flush()
