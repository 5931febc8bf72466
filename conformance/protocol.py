"""The engine protocol, version 1: JSON lines over an engine process's stdin and stdout.

Standard library only: the vLLM worker imports this module from inside each pin's own
environment. engines/PROTOCOL.md is the human-readable description of the same rules.
"""

from __future__ import annotations

import json

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 64 * 1024 * 1024  # one record; far above any step record

# Message type -> required fields and their JSON types. Direction in the comment.
MESSAGES: dict[str, dict[str, tuple[type, ...]]] = {
    # engine -> harness, first line on stdout
    "hello": {"protocol": (int,), "engine": (str,), "version": (str,), "capabilities": (list,)},
    # harness -> engine
    "run": {"id": (str,), "scenario": (dict,), "layers": (list,)},
    # engine -> harness, zero or more per run, seq counting from 0 within each layer
    "record": {"id": (str,), "layer": (str,), "seq": (int,), "data": (dict,)},
    # engine -> harness, ends a run
    "done": {"id": (str,), "records": (int,)},
    # engine -> harness, ends a run (or the session, when id is null)
    "error": {"id": (str, type(None)), "kind": (str,), "message": (str,)},
    # harness -> engine
    "shutdown": {},
}
ERROR_KINDS = ("unsupported", "bad_request", "internal")
LAYERS = ("config", "steps", "outputs", "methods")


class ProtocolError(ValueError):
    """A line broke the protocol. The message says what was expected and what arrived."""


def encode(message: dict) -> bytes:
    check(message)
    text = json.dumps(message, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return text.encode() + b"\n"


def decode(line: bytes, expect: tuple[str, ...] | None = None) -> dict:
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"expected a line of at most {MAX_LINE_BYTES} bytes, got {len(line)}")
    try:
        message = json.loads(line, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"expected a JSON object on one line, got {_preview(line)} ({exc})") from None
    check(message, expect)
    return message


def check(message: object, expect: tuple[str, ...] | None = None) -> None:
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    kind = message.get("type")
    if kind not in MESSAGES:
        raise ProtocolError(f"expected a message type in {sorted(MESSAGES)}, got {kind!r}")
    if expect is not None and kind not in expect:
        raise ProtocolError(f"expected a {' or '.join(expect)} message, got {kind!r}")
    for field, types in MESSAGES[kind].items():
        value = message.get(field, ...)
        if value is ... or not isinstance(value, types) or (int in types and isinstance(value, bool)):
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            got = "nothing" if value is ... else repr(value)[:80]
            raise ProtocolError(f"expected {kind}.{field} of type {names}, got {got}")


def _no_constants(token: str):
    raise ValueError(f"{token} is not JSON")


def _preview(line: bytes) -> str:
    text = line[:120].decode("utf-8", "replace")
    return repr(text) + ("..." if len(line) > 120 else "")
