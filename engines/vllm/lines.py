"""The worker's writing of its steps and outputs records: msgspec's JSON writer where its bytes
are provably protocol.encode's (json.dumps, keys sorted, compact, ASCII, no NaN), in about an
eighth of the time on a steps record. Every other message, and every record the proof does not
cover, is written by protocol.encode.

The proof, from the bytes msgspec wrote (both writers sort keys by code point, write integers,
true, false and null alike, and compact):
- only printable ASCII and no backslash: every string was written as is, as json writes a string
  that needs no escape (json escapes DEL and every non-ASCII character);
- no digit followed by ".", "e" or "E": no float (msgspec writes 1e+16 as 1e16, and NaN as null);
- every null is the value of block_ids, finish_reason or stop_reason, which the recorder writes
  as None or a list (recorder._block_ids) and new_requests.output_record as None, a string or an
  integer: so no null stands for a NaN or an infinity, which json refuses.
What the bytes cannot show is a value of a type json refuses and msgspec writes (a set, bytes,
an Enum of another type, a dataclass): these records are built of dicts, lists, strings, ints
and bools only (recorder.py, "Only JSON types"). Every steps and outputs line of the scenarios is
written the same by both (tests/engines/test_lines.py).
"""

from __future__ import annotations

import msgspec

from conformance.formats import protocol

RECORDER_LAYERS = ("steps", "outputs")
_WRITER = msgspec.json.Encoder(order="sorted")
# a digit as "0", and ".", "E" as "e": "0e" is then a digit before a fraction or an exponent
_FLOAT_MARKS = bytes.maketrans(b"0123456789.E", b"0000000000ee")
_NULLABLE = (b'"block_ids":null', b'"finish_reason":null', b'"stop_reason":null')


def encode(message: dict) -> bytes:
    """protocol.encode(message), the same bytes."""
    if isinstance(message, dict) and message.get("type") == "record" and message.get("layer") in RECORDER_LAYERS:
        protocol.check(message)
        try:
            line = _WRITER.encode(message)
        except Exception:  # a key that is no string, a circular record...: json writes it, or fails as before
            line = None
        if line is not None and as_json(line):
            return line + b"\n"
    return protocol.encode(message)


def as_json(line: bytes) -> bool:
    """Whether msgspec's `line` is the bytes json.dumps writes for the same record (module doc)."""
    if not line.isascii() or b"\\" in line or b"\x7f" in line:
        return False
    if b"0e" in line.translate(_FLOAT_MARKS):
        return False
    nulls = line.count(b"null")
    return not nulls or nulls == sum(map(line.count, _NULLABLE))
