"""How a character that is not printable is shown in every report and log line: its escape,
never itself. Standard library only: the log (formats/log.py) and the reports
(report/view.py) share it."""

from __future__ import annotations

SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str) -> str:
    """`text` with every character that is not printable (str.isprintable: control and format
    characters, ESC and BEL, NUL, bidi overrides, line and paragraph separators, unassigned code
    points like U+FFFE, lone surrogates) spelled as its escape: `\\x1b`, `\\u202e`, `\\n`. A
    candidate's text cannot then move a terminal's cursor, set its title, reorder what a reader
    sees or break an XML file. Backslashes are left as they are, so the function is idempotent."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else SHORT_ESCAPES.get(c) or _escape(c) for c in text)


def visible_lines(text: str) -> str:
    """visible(), line by line: the newlines of a block of text kept, everything else escaped."""
    return "\n".join(visible(line) for line in text.split("\n"))


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
