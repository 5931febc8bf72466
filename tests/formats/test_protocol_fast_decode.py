"""protocol.decode reads a line without a step per value where the line's bytes prove the
checks pass (formats/protocol.py, _nesting and the digit-run test). These tests hold it to the
reference: every line gives the same message, or the same error, as the strict reader with the
walk of every value (protocol.loads + _check_values)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.formats import protocol
from tests import helpers


def reference(line: bytes):
    """What decode said before the fast path: the strict reader, then every value walked."""
    try:
        try:
            message = protocol.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise protocol.ProtocolError(f"expected a JSON object on one line, got "
                                         f"{protocol._preview(line)} ({exc})") from None
        protocol._check_values(message)
        protocol.check(message)
    except protocol.ProtocolError as exc:
        return ("error", str(exc))
    return ("ok", message)


def fast(line: bytes):
    try:
        return ("ok", protocol.decode(line))
    except protocol.ProtocolError as exc:
        return ("error", str(exc))


def same(line: bytes) -> None:
    assert fast(line) == reference(line), line[:200]


def record(data) -> bytes:
    return (json.dumps({"type": "record", "id": "a", "layer": "steps", "seq": 0, "data": data},
                       separators=(",", ":")) + "\n").encode()


def nested(depth: int, inner: str = "1") -> dict:
    """A record whose deepest container is at `depth` (the message is at depth 1)."""
    value = json.loads(inner)
    for _ in range(depth - 2):
        value = [value]
    return {"v": value}


@pytest.mark.parametrize("depth", [60, 62, 63, 64, 65, 70])
@pytest.mark.parametrize("inner", ['1', '"]]]"', '"[[["', '{}', '"\\u00e9"'])
def test_depth_at_the_limit_as_the_walk(depth, inner):
    line = record(nested(depth, inner))
    same(line)
    deepest = depth + (1 if inner == "{}" else 0)
    assert (fast(line)[0] == "ok") == (deepest < protocol.MAX_DEPTH)


def test_brackets_inside_strings_do_not_hide_depth():
    """Quoted brackets that would lower a count of bracket characters: the depth is still the
    containers' (one string closes early, another opens late)."""
    value = nested(64)
    line = record({"a": "]]]]", "b": value["v"], "c": "[[[["})
    assert fast(line)[0] == "error"
    same(line)


@pytest.mark.parametrize("text", [
    '"\\ud800"', '"a\\udfffb"', '{"\\ud800": 1}', '"\\ud83d\\ude00"', '"\\\\ud800"', '"\\""',
    '"\\"]]]]"', '"quote \\" and [ bracket"',
])
def test_escapes_as_the_walk(text):
    same(b'{"type":"record","id":"a","layer":"steps","seq":0,"data":{"v":' + text.encode() + b"}}\n")


@pytest.mark.parametrize("number", [
    "9223372036854775807", "-9223372036854775808", "-9223372036854775809", "18446744073709551615",
    "18446744073709551616", "999999999999999999", "-999999999999999999", "1" + "0" * 30,
    "1" * 5000, "1e400", "-1e400", "1.5", "0", "-0", "123456789012345678.5",
])
def test_integers_as_the_strict_reader(number):
    line = b'{"type":"record","id":"a","layer":"steps","seq":0,"data":{"v":' + number.encode() + b"}}\n"
    same(line)


def test_digits_in_strings_are_only_text():
    same(record({"v": "1" * 40, "w": [1, 2, 3]}))


json_values = helpers.json_values("ab[]{}\"\\\u00e9 0123")


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_record_as_the_walk(value):
    same(record({"v": value}))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=80), st.sampled_from(["[", "{\"k\":"]))
def test_any_depth_as_the_walk(depth, opener):
    closer = "]" if opener == "[" else "}"
    line = ('{"type":"record","id":"a","layer":"steps","seq":0,"data":{"v":'
            + opener * depth + "0" + closer * depth + "}}\n").encode()
    same(line)


def test_the_bytes_prove_a_plain_record():
    """The fast path is taken for a steps record as the recorder writes it, and refused for a
    line it cannot prove (an escape, a quoted quote)."""
    line = record({"requests": {"r0": {"block_ids": [[1, 2]], "draft_token_ids": [7]}}, "new": ["r0"]})
    assert protocol._nesting(line) == 6  # message, data, requests, r0, block_ids, a group
    assert protocol._nesting(record({"v": "\u00e9"})) is None  # written as \\u00e9
    assert protocol._nesting(b'{"a":"\\"[[["}') is None


@pytest.mark.parametrize("line", ["\ufeff{}".encode(), b'{"a":1} x', b'{"a":NaN}', b'{"a":-Infinity}',
                                  b'{"a":1e400}', b'[1]', b'{"type":"done","id":"a","records":1}  \n'])
def test_refusals_word_for_word(line):
    same(line)
