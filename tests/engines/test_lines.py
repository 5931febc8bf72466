"""engines/vllm/lines.py writes the worker's steps and outputs records with msgspec where the
line provably reads back as protocol.encode's values: the same bytes on every such record of
the goldens, and the same values, or the same refusal, on records built to differ."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.formats import protocol
from engines.vllm import lines

GOLDENS = Path(__file__).resolve().parents[2] / "goldens"


def written(encode, message):
    """What a writer gives, read back as the harness reads a line; or its refusal."""
    try:
        line = encode(message)
    except Exception as exc:  # the refusal itself: its type and words
        return ("error", type(exc).__name__, str(exc))
    try:
        return ("ok", _typed(protocol.loads(line.decode("utf-8"))))
    except ValueError as exc:  # a line the harness refuses (an integer past 64 bits)
        return ("refused", str(exc))


def _typed(value):
    """The value with each number's type (1 and 1.0 and True read the same by ==)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def same(message) -> None:
    assert written(lines.encode, message) == written(protocol.encode, message), message


def record(data, layer: str = "steps") -> dict:
    return {"type": "record", "id": "a", "layer": layer, "seq": 0, "data": data}


def test_every_golden_record_is_written_the_same():
    count, by_msgspec = 0, 0
    for path in sorted(GOLDENS.glob("*/*.json")):
        layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
        for layer in ("steps", "outputs"):
            for data in layers.get(layer, ())[:40]:
                message = record(data, layer)
                assert lines.encode(message) == protocol.encode(message), (path, layer, data)
                by_msgspec += lines.reads_as_json(lines._WRITER.encode(message), lines._nones(data))
                count += 1
    assert count > 10_000
    # msgspec writes nearly all (a record with nulls elsewhere, as a KV cache event's, is json's)
    assert by_msgspec > 0.9 * count, (by_msgspec, count)


def test_msgspec_writes_the_steady_decode_records():
    """The records (b) of `make bench` measures all take msgspec's path."""
    layers = json.loads((GOLDENS / "steady_decode" / "vllm-0.27.1.json").read_text(encoding="utf-8"))["layers"]
    for layer in ("steps", "outputs"):
        for data in layers[layer]:
            assert lines.reads_as_json(lines._WRITER.encode(record(data, layer)), lines._nones(data))


@pytest.mark.parametrize("data", [
    {"v": 1.5}, {"v": 1e16}, {"v": 1e-05}, {"v": -0.0}, {"v": float("nan")}, {"v": float("inf")},
    {"block_ids": float("nan")}, {"v": "\u00e9"}, {"\u00e9": 1}, {"v": "a\"b"}, {"v": "a\\b"},
    {"v": "\x7f"}, {"v": "\x01"}, {"v": "null"}, {"v": None}, {"block_ids": None, "v": None},
    {"block_ids": None}, {"finish_reason": None, "stop_reason": None}, {"v": 2 ** 64}, {"v": -(2 ** 63) - 1},
    {"v": "r1.5e"}, {1: 2}, {"v": {1: 2}}, {"v": (1, 2)}, {"v": True}, {"B": 1, "a": 2, "_": 3, "": 4},
])
def test_records_at_the_edges(data):
    """Floats, NaN and infinities (json refuses them), non-ASCII text, escapes, DEL, nulls where
    the recorder writes none, integers past 64 bits, keys that are no strings: json's values,
    or its refusal."""
    same(record(data))
    same(record(data, "outputs"))


@pytest.mark.parametrize("message", [
    {"type": "hello", "protocol": 3, "engine": "e", "version": "1", "capabilities": ["steps"]},
    {"type": "record", "id": "a", "layer": "config", "seq": 0, "data": {"v": 0.9}},
    {"type": "done", "id": "a", "records": 3}, {"type": "record", "id": "a", "layer": "steps"},
    {"type": "error", "id": None, "kind": "internal", "message": "x"}, ["not", "a", "dict"],
])
def test_other_messages_are_protocol_encodes(message):
    same(message)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats() | st.text(alphabet="ab\"\\\u00e9 0123.eE\x7f\x01nul"),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["a", "block_ids", "stop_reason", "e1", "0"]) | st.text(max_size=3), children, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["steps", "outputs"]))
def test_any_record_as_json(value, layer):
    same(record({"v": value}, layer))


class Index:
    """An integer of another type (a NumPy integer, say): operator.index gives its int."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize("nulls", [False, True])
def test_ids_of_another_integer_type_are_written_as_their_ints(nulls):
    """The recorder copies vLLM's id lists as they are: both writers (msgspec's, and
    protocol.encode, where a null sends the record, as for the engine layers' records) write an
    integer of another type as its int, the bytes written for the ints themselves."""
    ids = {"draft_token_ids": [Index(7), Index(151935)], "block_ids": None if nulls else [[Index(3)]]}
    plain = {"draft_token_ids": [7, 151935], "block_ids": None if nulls else [[3]]}
    data = {"step": 0, "requests": {"r0": ids}, "kv_events": [None] if nulls else []}
    want = {"step": 0, "requests": {"r0": plain}, "kv_events": [None] if nulls else []}
    assert lines.encode(record(data)) == protocol.encode(record(want)) == protocol.encode(record(data))


class Opaque:
    """A value of no JSON type, and no integer."""


def test_a_value_of_no_json_type_is_refused_in_jsons_words():
    message = record({"step": 0, "requests": {"r0": {"draft_token_ids": [Opaque()]}}})
    with pytest.raises(TypeError, match="^Object of type Opaque is not JSON serializable$"):
        lines.encode(message)
    with pytest.raises(TypeError, match="^Object of type Opaque is not JSON serializable$"):
        protocol.encode(message)
