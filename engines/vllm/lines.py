"""The worker's writing of its steps and outputs records: msgspec's JSON writer where its line
provably reads back as the values protocol.encode's (json.dumps, keys sorted, compact, ASCII, no
NaN) would, in about an eighth of the time on a steps record. Every other message, and every
record the proof does not cover, is written by protocol.encode.

The two writers write the same JSON values: both sort keys by code point, write integers,
strings, true, false and null, and compact. Where their bytes differ, any JSON reader reads the
same value from both: a finite float (msgspec writes 1e16 where json writes 1e+16), a non-ASCII
character (msgspec writes it as UTF-8, json as a \\u escape), a control character's escape. What
differs in value is a NaN or an infinity: msgspec writes null, json refuses it. The proof: as
many nulls in the line as None values where the records hold them (block_ids of a request that
got no new block, an output's finish_reason and stop_reason), counted on the values, so no null
stands for a NaN or an infinity; a record with a null anywhere else (a KV cache event's field)
is written by json. What neither shows is a value of a type json refuses and msgspec writes (a
set, bytes, an Enum of another type, a dataclass): these records are built of dicts, lists,
strings, ints, bools and None only (recorder.py, "Only JSON types"; new_requests.output_record).
Every steps and outputs record of the goldens is written in the same bytes by both, and any
record reads back as the same values or is refused alike (tests/engines/test_lines.py).

The recorder copies vLLM's id lists as they are (block ids, drafts), without a call of int() per
id: an integer of another type there (a NumPy integer, say) is written as the JSON integer it
stands for by both writers (protocol.integer), and anything else that is no JSON type is refused.
"""

from __future__ import annotations

import msgspec

from conformance.formats import protocol

RECORDER_LAYERS = ("steps", "outputs")


# msgspec writes an integer of another type as protocol.encode does (protocol.integer)
_WRITER = msgspec.json.Encoder(order="sorted", enc_hook=protocol.integer)


def encode(message: dict) -> bytes:
    """protocol.encode(message), or a line that reads back as its values (module doc)."""
    if isinstance(message, dict) and message.get("type") == "record" and message.get("layer") in RECORDER_LAYERS:
        protocol.check(message)
        try:
            line = _WRITER.encode(message)
        except Exception:  # a key that is no string, a circular record...: json writes it, or fails as before
            line = None
        if line is not None and reads_as_json(line, _nones(message["data"])):
            return line + b"\n"
    return protocol.encode(message)


def reads_as_json(line: bytes, nones: int) -> bool:
    """Whether msgspec's `line` reads back as the values json.dumps writes for the same record,
    whose data hold `nones` None values where records hold them (module doc): no null in it
    stands for a NaN or an infinity."""
    return line.count(b"null") == nones


def _nones(data: dict) -> int:
    """The None values of a steps record's block_ids and an outputs record's reasons, where these
    records mostly hold None (a NaN there is not counted)."""
    requests = data.get("requests")
    held = [entry.get("block_ids", 0) for entry in requests.values() if isinstance(entry, dict)] \
        if isinstance(requests, dict) else []
    held += (data.get("finish_reason", 0), data.get("stop_reason", 0))
    return held.count(None)
