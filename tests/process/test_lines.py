"""process/lines.py reads an engine's line with msgspec where the line's bytes prove json's reader
would give the same message (formats/protocol.py, decode). These tests hold the two readers to
one answer: the same message (values, their types, key order) or the same refusal, word for
word, on every record of the goldens as the worker sends it, and on lines built to differ."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.formats import protocol
from conformance.process import lines
from tests import helpers

GOLDENS = Path(__file__).resolve().parents[2] / "goldens"


def answer(decode, line: bytes, expect=None):
    try:
        return ("ok", _typed(decode(line, expect)))
    except protocol.ProtocolError as exc:
        return ("error", str(exc))


def _typed(value):
    """The value with its types and key order spelled out: 1 and 1.0 and True differ, and so do
    two dicts with the same items in another order."""
    if isinstance(value, dict):
        return ("dict", [(key, _typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(item) for item in value])
    return (type(value).__name__, repr(value))


def same(line: bytes, expect=None) -> None:
    assert answer(lines.decode, line, expect) == answer(protocol.decode, line, expect), line[:200]


def record(data, layer: str = "steps", seq: int = 0) -> bytes:
    return protocol.encode({"type": "record", "id": "a", "layer": layer, "seq": seq, "data": data})


def golden_records():
    """Each golden's config and outputs records and its first 10 steps records (every pin, every
    scenario): the floats, strings and shapes the engines send."""
    for path in sorted(GOLDENS.glob("*/*.json")):
        layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
        for layer, records in sorted(layers.items()):
            for seq, data in enumerate(records[:10] if layer.endswith("steps") else records):
                yield path, layer, seq, data


def test_every_golden_record_reads_the_same():
    read = 0
    for path, layer, seq, data in golden_records():
        line = record(data, layer, seq)
        fast = lines.decode(line)
        assert _typed(fast) == _typed(protocol.decode(line)), (path, layer, seq)
        read += 1
    assert read > 5_000  # the goldens are there, and were read


def test_the_reader_reads_the_records_it_can():
    """The steps records of the goldens go through msgspec: the faster reader is used, and reads
    the line's bytes (no text made of them)."""
    used = []
    line = record(json.loads((GOLDENS / "steady_decode" / "vllm-0.27.1.json").read_text())["layers"]["steps"][5])
    protocol.decode(line, reader=lambda raw: used.append(raw) or json.loads(raw))
    assert used == [line]


@pytest.mark.parametrize("text", [
    '{"a":1,"a":2}', '{"b":1,"a":2,"b":3}', '{"a":1.0}', '{"a":-0}', '{"a":-0.0}', '{"a":1e5}',
    '{"a":1E+2}', '{"a":1e400}', '{"a":-1e400}', '{"a":1e-400}', '{"a":5e-324}', '{"a":NaN}',
    '{"a":Infinity}', '{"a":-Infinity}', '{"a":01}', '{"a":1.}', '{"a":.5}', '{"a":+1}', '{"a":[1,]}',
    '{"a":1,}', "{'a':1}", '{"a":"x\x01y"}', '{"a":"x\ty"}', '{"a":"x\x7fy"}', '\x0c{"a":1}',
    '\u00a0{"a":1}', ' \t\r\n{"a":1} \t\r\n', '', ' ', '{"a":1} x', '{"a":1}{}', '{"a":tru}',
    '{"a":True}', '{"a":null}', '{"\u00e9":"\u00e9\U0001f600"}', '{"a":1}\x00', '[1]', '"s"', 'null',
    '{"a":123456789012345678}', '{"a":-123456789012345678}', '{"a":1234567890123456789}',
    '{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}',
    '\ufeff{"a":1}', '{"a":/*c*/1}', '{"a":0x10}', '{"a":[1 2]}',
])
def test_edges_as_json(text):
    """Duplicate keys, numbers at the edges, constants json's reader refuses, bytes JSON does not
    allow, whitespace, trailing data, depth: the message or the refusal of json's reader."""
    line = text.encode("utf-8")
    same(line)
    same(b'{"type":"record","id":"a","layer":"steps","seq":0,"data":' + line + b"}\n")


json_values = helpers.json_values("ab[]{}\"\\\u00e9 0123.e\x7f\x01")


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_record_as_json(value):
    same(record({"v": value}))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60))
def test_any_bytes_in_a_record_as_json(junk):
    same(b'{"type":"record","id":"a","layer":"steps","seq":0,"data":{"v":' + junk + b"}}\n")


def test_what_is_expected_as_json():
    same(b'{"type":"done","id":"a","records":1}\n', ("record",))
    same(b'{"type":"hello","protocol":3,"engine":"' + b"e" * 300 + b'","version":"1","capabilities":[]}\n')
