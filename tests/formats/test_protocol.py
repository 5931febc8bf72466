"""The protocol reader: every malformed line is a ProtocolError naming what was expected."""

import json
import pytest

from conformance.formats.protocol import ProtocolError, decode, encode


def test_round_trip():
    message = {"type": "record", "id": "r", "layer": "config", "seq": 0, "data": {"a": 1}}
    assert decode(encode(message)) == message


@pytest.mark.parametrize("line, words", [
    (b"not json", "expected a JSON object on one line"),
    (b"[1]", "expected a JSON object, got list"),
    (b'{"type": "nope"}', "expected a message type"),
    (b'{"type": "record", "id": "r", "layer": "config", "seq": "0", "data": {}}', "record.seq of type int"),
    (b'{"type": "record", "id": "r", "layer": "config", "seq": true, "data": {}}', "record.seq of type int"),
    (b'{"type": "done", "id": "r"}', "done.records of type int, got nothing"),
    (b'{"type": "hello", "protocol": NaN}', "expected a JSON object on one line"),
    (b"\xff\xfe", "expected a JSON object on one line"),
])
def test_malformed_lines(line, words):
    with pytest.raises(ProtocolError) as err:
        decode(line)
    assert words in str(err.value)


def test_unexpected_message_type():
    with pytest.raises(ProtocolError, match="expected a hello message, got 'done'"):
        decode(encode({"type": "done", "id": "r", "records": 0}), ("hello",))


@pytest.mark.parametrize("text", ["18446744073709551616", "-9223372036854775809", "1e999", "-1E400",
                                  "1" * 400 + ".0", "123456789012345678901234567890"])
def test_a_number_out_of_range_is_refused_on_either_path(text):
    from conformance.formats.protocol import loads

    with pytest.raises(ValueError):
        loads('{"type": "x", "v": [%s]}' % text)
    assert loads('{"v": [18446744073709551615, -9223372036854775808, 1.5e3, 0.25]}')["v"][0] == 2 ** 64 - 1
