"""The engine protocol, version 3: JSON lines over an engine process's stdin and stdout.

Standard library only: the vLLM worker imports this module from inside each pin's own
environment. engines/PROTOCOL.md is the human-readable description of the same rules.
"""

from __future__ import annotations

import json
import operator
from typing import Callable

from conformance.formats.kinds import Kind
from conformance.formats.features import declared_problem

PROTOCOL_VERSION = 3
# What an engine still at an older version must add, by the version it says (PROTOCOL.md,
# "Changes by version"): told with the refusal, so a port knows why and what to do
OLDER_VERSION = {2: "the steps records' identities (block_ids, cached_tokens, draft_token_ids, "
                    "resent_token_ids, next_draft_token_ids per request; aborted, emitted, "
                    "num_common_prefix_blocks, kv_blocks.cached), outputs' stop_reason, prompts "
                    "from request_prompt and aborts in the driver"}


def older_version_hint(version) -> str:
    """Said after `expected protocol version N, got M` when M is an older version."""
    if isinstance(version, bool) or not isinstance(version, int) or not 0 < version < PROTOCOL_VERSION:
        return ""
    adds = OLDER_VERSION.get(version)
    return (f": the engine speaks an older version of the protocol; engines/PROTOCOL.md \"Changes by "
            f"version\" says what version {PROTOCOL_VERSION} adds" + (f" ({adds})" if adds else ""))


MAX_LINE_BYTES = 64 * 1024 * 1024  # one record; far above any step record
# Nesting depth of a message (the message object itself is depth 1). Records are a few levels
# deep; the limit keeps every later reader (trace writer, comparison, DeepDiff) off Python's
# recursion limit, so a hostile line is a protocol error, never a RecursionError.
MAX_DEPTH = 64

# Limits on what one engine may send (engines/PROTOCOL.md "Limits"). A run's records: all of its
# record lines together, and their count (a scenario at the schema's limits sends at most
# 100,000 steps records and 4,096 outputs records per layer). The harness reads both bounds
# from $VLLM_PARITY_MAX_RUN_BYTES / $VLLM_PARITY_MAX_RUN_RECORDS when set, for a scenario that
# needs more.
MAX_RUN_BYTES = 32 * 1024 * 1024
MAX_RUN_RECORDS = 200_000
# A production-scale scenario's run is received in the digest form (formats/digest.py): each
# record is judged, digested and dropped as it arrives, so the harness holds a bounded form,
# whatever the bytes. Its limits are its own declared scale: at most one `steps` record per step
# up to the workload's max_steps, one `outputs` record per request and one `config` record, and
# at most this many bytes of record lines (a 128-sequence record is about 26 KB; the three
# production scenarios send 20-250 MB).
MAX_PRODUCTION_RUN_BYTES = 1024 * 1024 * 1024


def production_run_records(workload: dict) -> int:
    """The records a production scenario's run may send: steps up to max_steps, one output per
    request, the config record."""
    return workload["max_steps"] + len(workload["requests"]) + 1
# The hello's texts land in every report (junit.xml repeats the engine's name in each test case).
HELLO_TEXT = {"engine": 200, "version": 200}  # characters
MAX_CAPABILITIES = 32  # entries of hello.capabilities, each a layer name of at most...
MAX_CAPABILITY = 64  # ...characters
MAX_ENVIRONMENT_BYTES = 16 * 1024  # hello.environment as JSON (provenance; about 400 bytes from a pin)
MAX_ERROR_MESSAGE = 8 * 1024  # characters of an `error` message kept; the rest is cut, not refused

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
    "hello": {"environment": (dict,),  # provenance: python/torch/vllm versions, the build, ...
              "features": (list,)},  # the features it has (formats/features.py); absent: every one
    # the engine may stop sending `steps` records after this step (a window replayed live)
    "run": {"stop_after_step": (int,)},
}
ERROR_KINDS = (Kind.UNSUPPORTED, "bad_request", "internal")  # an engine's error: unsupported is the verdict's kind
ENGINE_LAYERS = ("engine_config", "engine_steps", "engine_outputs")  # the whole engine's
LAYERS = ("config", "steps", "outputs", "methods") + ENGINE_LAYERS

# a message type's fields, required then optional, merged once (check() runs on every line)
_FIELDS = {kind: {**fields, **OPTIONAL.get(kind, {})} for kind, fields in MESSAGES.items()}


class ProtocolError(ValueError):
    """A line broke the protocol. The message says what was expected and what arrived."""


class LimitExceeded(ProtocolError):
    """An engine sent more than a limit allows (a hello's text, a run's records): a protocol
    error that names the limit, its value and what arrived."""


def integer(value) -> int:
    """A value json cannot write that is an integer of another type (a NumPy integer an engine's
    records copy from its framework) as the int it stands for (operator.index); anything else is
    refused in json's own words."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable") from None


# json.dumps(message, sort_keys=True, separators=(",", ":"), allow_nan=False, default=integer),
# built once instead of once a line
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False, default=integer)


def encode(message: dict) -> bytes:
    check(message)
    return _ENCODER.encode(message).encode() + b"\n"


def decode(line: bytes, expect: tuple[str, ...] | None = None,
           reader: Callable[[bytes], object] | None = None) -> dict:
    """The message on `line`, checked. `reader` (the harness passes msgspec's, process/lines.py)
    reads the lines whose bytes prove json's reader would give the same message (no escape, no
    run of 19 digits, nesting under the limit); on any other line, or when it fails, json's
    reader reads the line, so every refusal is worded as json's reader words it."""
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"expected a line of at most {MAX_LINE_BYTES} bytes, got {len(line)}")
    try:
        # Strict UTF-8 (json.loads would also guess UTF-16/32 from raw bytes); a number too
        # large for a float is as non-finite as Infinity; nesting is bounded before any
        # recursive reader sees it. A line without a run of 19 digits holds no integer outside
        # the 64-bit range, so its integers are read by json's own C code, not one call each.
        # `reader` reads the bytes (msgspec's checks their UTF-8 as strictly); the text is made
        # only for json's reader
        marks = line.translate(_MARKS)  # one pass for both proofs: digits as "0", "{" as "["
        strict = _LONG_DIGITS in marks or line.startswith(_BOM)  # json.loads' BOM error
        depth = _carriable(line, marks)
        message = _read(reader, line) if reader is not None and depth is not None and not strict else _UNREAD
        if message is _UNREAD:
            text = line.decode("utf-8")
            message = loads(text) if strict else _READER.decode(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, RecursionError):
            exc = f"nested deeper than {MAX_DEPTH} levels"
        raise ProtocolError(f"expected a JSON object on one line, got {_preview(line)} ({exc})") from None
    if depth is None:  # not proved carriable from the line's bytes: walk the values
        _check_values(message)
    check(message, expect)
    if message["type"] == "hello":  # what the harness accepts; an engine's encode does not check it
        _check_hello_limits(message)
    return message


def loads(text: str):
    """JSON text read as strictly as a protocol line (traces and goldens too): NaN, Infinity, a
    number that overflows a double and an integer outside the 64-bit range are a ValueError."""
    return json.loads(text, parse_constant=_no_constants, parse_float=finite_float, parse_int=_int64)


def check(message: object, expect: tuple[str, ...] | None = None) -> None:
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in MESSAGES:  # a list or object is unhashable
        raise ProtocolError(f"expected a message type in {sorted(MESSAGES)}, got {kind!r}")
    if expect is not None and kind not in expect:
        raise ProtocolError(f"expected a {' or '.join(expect)} message, got {kind!r}")
    optional = OPTIONAL.get(kind, {})
    for field, types in _FIELDS[kind].items():
        value = message.get(field, ...)
        if value is ... and field in optional:
            continue
        if value is ... or not isinstance(value, types) or (int in types and isinstance(value, bool)):
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            got = "nothing" if value is ... else _repr(value)
            which = " (optional: absent, or of that type)" if field in optional else ""
            raise ProtocolError(f"expected {kind}.{field} of type {names}{which}, got {got}")


def _check_hello_limits(hello: dict) -> None:
    for field, most in HELLO_TEXT.items():
        if len(hello[field]) > most:
            raise LimitExceeded(f"expected hello.{field} of at most {most} characters, got {len(hello[field])}")
    capabilities = hello["capabilities"]
    if len(capabilities) > MAX_CAPABILITIES:
        raise LimitExceeded(f"expected hello.capabilities of at most {MAX_CAPABILITIES} layer names, "
                            f"got {len(capabilities)}")
    for name in capabilities:
        if isinstance(name, str) and len(name) > MAX_CAPABILITY:
            raise LimitExceeded(f"expected layer names of at most {MAX_CAPABILITY} characters in "
                                f"hello.capabilities, got one of {len(name)}")
    wrong = declared_problem(hello["features"]) if "features" in hello else None
    if wrong is not None:
        raise (LimitExceeded if wrong[1] else ProtocolError)(wrong[0])
    if "environment" in hello:
        size = len(json.dumps(hello["environment"], ensure_ascii=False).encode("utf-8"))
        if size > MAX_ENVIRONMENT_BYTES:
            raise LimitExceeded(f"expected hello.environment of at most {MAX_ENVIRONMENT_BYTES} bytes "
                                f"as JSON, got {size}")


def cut(text: str, most: int) -> str:
    """`text` cut to about `most` characters, saying how many were left out."""
    if len(text) <= most:
        return text
    return f"{text[:most - 100]} [... {len(text) - most + 100} characters cut ...]"


def _check_values(message: object) -> None:
    """Every value of a decoded line can be carried into a trace: nesting at most MAX_DEPTH
    levels, and strings that are valid Unicode (a lone surrogate escape such as "\\ud800" is
    valid JSON syntax but cannot be written as UTF-8). The walk keeps one iterator per open
    container, so its memory grows with the depth, never with the size of a list."""
    stack = [iter((message,))]
    while stack:
        for value in stack[-1]:
            if isinstance(value, str):
                _check_text(value)
            elif isinstance(value, (dict, list)):
                if len(stack) >= MAX_DEPTH:  # the value's depth (the message is at depth 1)
                    raise ProtocolError(f"expected a message nested at most {MAX_DEPTH} levels deep, got deeper")
                if isinstance(value, dict):
                    for key in value:
                        _check_text(key)
                    value = value.values()
                stack.append(iter(value))
                break
        else:
            stack.pop()


# decode's and _nesting's tables: a digit read as "0" (a run of 19 is a number that may not fit
# 64 bits, or digits in a string) and "{" as "[" (one count of the opening brackets); of a line,
# only its quotes and brackets kept, each bracket as ( or )
_MARKS = bytes.maketrans(b"0123456789{", b"0" * 10 + b"[")
_LONG_DIGITS = b"0" * 19
_BOM = "\ufeff".encode()
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"[]{}'))


def _carriable(line: bytes, marks: bytes) -> int | None:
    """A bound on the nesting depth of a decoded line when its bytes prove that _check_values
    would pass it, else None (_nesting). Fewer than MAX_DEPTH opening brackets, quoted or not,
    bound the depth: counted in `marks` (the line with each "{" as "["), in C, before the quotes
    are split off."""
    if b"\\" in line:
        return None
    openers = marks.count(b"[")
    return openers if openers < MAX_DEPTH else _nesting(line)


def _nesting(line: bytes) -> int | None:
    """The nesting depth of a decoded line, when its bytes prove that _check_values would pass
    it (at most MAX_DEPTH - 1 levels, no lone surrogate); else None, and the values are walked.
    The proof, in C loops instead of a Python step per value: a line with no backslash has no
    escape, so its strings are the UTF-8 text as read (no surrogate), and no quote inside a
    string; its brackets outside quotes are then its containers, and each pass removing every
    innermost "()" removes one level."""
    if b"\\" in line:
        return None
    brackets = b"".join(line.translate(_BRACKETS, _NOT_STRUCTURE).split(b'"')[::2])
    for depth in range(MAX_DEPTH):
        if not brackets:
            return depth
        brackets = brackets.replace(b"()", b"")
    return None


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


_UNREAD = object()  # decode: the reader gave no message, json's reads the line


def _read(reader: Callable[[bytes], object], line: bytes) -> object:
    """`reader`'s message, or _UNREAD where it refuses the line (json's reader then says why)."""
    try:
        return reader(line)
    except Exception:  # whatever it refuses, json's reader reads: its message or its words
        return _UNREAD


def finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent, refused when it overflows a double (the
    readers' float hook)."""
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


# loads' reader for a line whose integers all fit (decode): its integers read by json's C code
_READER = json.JSONDecoder(parse_constant=_no_constants, parse_float=finite_float)


def _preview(line: bytes) -> str:
    text = line[:120].decode("utf-8", "replace")
    return repr(text) + ("..." if len(line) > 120 else "")
