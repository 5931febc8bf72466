"""The harness's reading of an engine's lines: protocol.decode, with msgspec's JSON reader on
the lines whose bytes prove it answers as json's (formats/protocol.py, decode), a third of the
time json's reader takes on a steps record. Every other line, and every refusal, is json's.

msgspec reads a number with a fraction or exponent through the same hook as json's reader
(protocol.finite_float), so floats are Python's own `float(text)`, and an overflow is refused
as before; integers of at most 18 digits, strings without escapes, duplicate keys (the last
value, at the first key's place) and whitespace read the same
(tests/process/test_lines.py holds the two to one answer on every golden and trace line).
"""

from __future__ import annotations

import msgspec

from conformance.formats import protocol

_READER = msgspec.json.Decoder(float_hook=protocol.finite_float).decode


def decode(line: bytes, expect: tuple[str, ...] | None = None) -> dict:
    """protocol.decode(line, expect), read by msgspec where the line's bytes allow it."""
    return protocol.decode(line, expect, reader=_READER)
