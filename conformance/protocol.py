"""The engine protocol, version 2: JSON lines over an engine process's stdin and stdout.

Standard library only: the vLLM worker imports this module from inside each pin's own
environment. engines/PROTOCOL.md is the human-readable description of the same rules.
"""

from __future__ import annotations

import json

PROTOCOL_VERSION = 2
MAX_LINE_BYTES = 64 * 1024 * 1024  # one record; far above any step record
# Nesting depth of a message (the message object itself is depth 1). Records are a few levels
# deep; the limit keeps every later reader (trace writer, comparison, DeepDiff) off Python's
# recursion limit, so a hostile line is a protocol error, never a RecursionError.
MAX_DEPTH = 64

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
# Message type -> optional fields and their JSON types: absent, or of this type (never null).
OPTIONAL: dict[str, dict[str, tuple[type, ...]]] = {
    "hello": {"environment": (dict,)},  # provenance: python/torch/vllm versions, the build, ...
}
ERROR_KINDS = ("unsupported", "bad_request", "internal")
ENGINE_LAYERS = ("engine_config", "engine_steps", "engine_outputs")  # the whole engine's
LAYERS = ("config", "steps", "outputs", "methods") + ENGINE_LAYERS


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
        # Strict UTF-8 (json.loads would also guess UTF-16/32 from raw bytes); a number too
        # large for a float is as non-finite as Infinity; nesting is bounded before any
        # recursive reader sees it.
        message = loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            exc = f"nested deeper than {MAX_DEPTH} levels"
        raise ProtocolError(f"expected a JSON object on one line, got {_preview(line)} ({exc})") from None
    _check_values(message)
    check(message, expect)
    return message


def loads(text: str):
    """JSON text read as strictly as a protocol line (traces and goldens too): NaN, Infinity, a
    number that overflows a double and an integer outside the 64-bit range are a ValueError."""
    return json.loads(text, parse_constant=_no_constants, parse_float=_finite_float, parse_int=_int64)


def check(message: object, expect: tuple[str, ...] | None = None) -> None:
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in MESSAGES:  # a list or object is unhashable
        raise ProtocolError(f"expected a message type in {sorted(MESSAGES)}, got {kind!r}")
    if expect is not None and kind not in expect:
        raise ProtocolError(f"expected a {' or '.join(expect)} message, got {kind!r}")
    optional = OPTIONAL.get(kind, {})
    for field, types in {**MESSAGES[kind], **optional}.items():
        value = message.get(field, ...)
        if value is ... and field in optional:
            continue
        if value is ... or not isinstance(value, types) or (int in types and isinstance(value, bool)):
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            got = "nothing" if value is ... else _repr(value)
            which = " (optional: absent, or of that type)" if field in optional else ""
            raise ProtocolError(f"expected {kind}.{field} of type {names}{which}, got {got}")


def _check_values(message: object) -> None:
    """Every value of a decoded line can be carried into a trace: nesting at most MAX_DEPTH
    levels, and strings that are valid Unicode (a lone surrogate escape such as "\\ud800" is
    valid JSON syntax but cannot be written as UTF-8)."""
    stack = [(message, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            raise ProtocolError(f"expected a message nested at most {MAX_DEPTH} levels deep, got deeper")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key)
                stack.append((item, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in value)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(f"expected valid Unicode text, got a lone surrogate in {_repr(text)}") from None


def _repr(value: object) -> str:
    try:
        return repr(value)[:80]
    except RecursionError:
        return f"a deeply nested {type(value).__name__}"


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is out of range for a number")
    return value


# Integers a port's JSON library holds exactly (int64 or uint64); a larger one would be cut or
# rounded there, and overflows the float conversions of the reports here.
MIN_INT, MAX_INT = -(2 ** 63), 2 ** 64 - 1


def _int64(text: str) -> int:
    value = int(text) if len(text) <= 21 else None  # never convert a huge digit string
    if value is None or not MIN_INT <= value <= MAX_INT:
        raise ValueError(f"integer {_digits(text)} is out of the 64-bit range")
    return value


def _digits(text: str) -> str:
    return text if len(text) <= 30 else f"{text[:12]}...{text[-6:]} ({len(text.lstrip('-'))} digits)"


def _no_constants(token: str):
    raise ValueError(f"{token} is not JSON")


def _preview(line: bytes) -> str:
    text = line[:120].decode("utf-8", "replace")
    return repr(text) + ("..." if len(line) > 120 else "")
