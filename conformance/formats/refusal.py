"""A refused configuration by its meaning: the exception vLLM's own code raised and vLLM's own
words, without pydantic's wrapper.

vLLM validates its config classes with pydantic, so a `ValueError` raised in a validator
reaches the caller as a pydantic `ValidationError` whose text wraps vLLM's message:

    1 validation error for SchedulerConfig
      Value error, long_prefill_token_threshold (1025) cannot be greater than ... [type=value_error,
      input_value=ArgsKwargs((), {'runner_t..., 'stream_interval': 1}), input_type=ArgsKwargs]
        For further information visit https://errors.pydantic.dev/2.14/v/value_error

Its meaning is `{"type": "ValueError", "message": "long_prefill_token_threshold (1025) cannot
be greater than ..."}`: the header, the `[type=..., input_value=..., input_type=...]` repr of
vLLM's internal arguments and the pydantic link are removed. An error pydantic raised itself
(a field of the wrong type) stays a `ValidationError`, its message the field and pydantic's
words without the repr. Anything else is kept as raised.

The oracle records refusals this way (engines/vllm/config_layer.py), and the comparison
(conformance/judging/compare.py) reads both sides through `meaning`, so a port may send either form.
Standard library only: the vLLM worker imports it inside each pin's environment.
"""

from __future__ import annotations

import re

_HEAD = re.compile(r"\A\d+ validation errors? for \w+\n")
# One error of pydantic's rendering: its location line (absent for a model validator), its
# message indented by two spaces (it may span lines), the " [type=..., input_value=...,
# input_type=...]" repr of its input, and the link to pydantic's documentation.
_ERROR = re.compile(r"^(?:(?P<loc>\S[^\n]*)\n)?  (?P<msg>.*?) \[type=[^\n]*$"
                    r"(?:\n *For further information visit \S+)?\n?", re.M | re.S)
# pydantic's prefix -> the exception vLLM's validator raised
_RAISED = {"Value error, ": "ValueError", "Assertion failed, ": "AssertionError"}


def meaning(refusal: dict) -> dict:
    """`{type, message}` as vLLM raised it; idempotent, other keys kept."""
    kind, text = refusal.get("type"), refusal.get("message")
    head = _HEAD.match(text) if kind == "ValidationError" and isinstance(text, str) else None
    if head is None:
        return refusal
    body = text[head.end():]
    errors = list(_ERROR.finditer(body))
    if not errors or sum(len(e[0]) for e in errors) != len(body):  # not pydantic's form: as sent
        return refusal
    if len(errors) == 1:  # one validator of vLLM's raised: its exception, its words
        for prefix, raised in _RAISED.items():
            if errors[0]["msg"].startswith(prefix):
                return dict(refusal, type=raised, message=errors[0]["msg"][len(prefix):])
    return dict(refusal, message="\n".join(
        f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in errors))


def record_meaning(record: dict) -> dict:
    """A record whose `refused` is an object, with that refusal read through `meaning`."""
    refused = record.get("refused")
    if not isinstance(refused, dict):
        return record
    normal = meaning(refused)
    return record if normal is refused else dict(record, refused=normal)
