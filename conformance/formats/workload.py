"""A scenario's workload, and the deterministic stand-in that plays the model for it.

Standard library only: imported by the harness (to validate a scenario before any engine
starts) and by the worker inside each pinned vLLM environment (to drive the scheduler).

The workload schema (every key below; no others):

    {"seed": int,            # seeds the stand-in
     "vocab_size": int,      # the stand-in's vocabulary, 2..151936
     "max_steps": int,       # safety cap on scheduler steps, 1..100000
     "requests": [{"id": str,             # ^[A-Za-z0-9_-]{1,32}$, unique
                   "arrival_step": int,   # the step at which it is added, 0..max_steps-1
                   "prompt_len": int,     # >= 1
                   "max_tokens": int,     # >= 1; prompt_len + max_tokens <= max_model_len
                   "stop_token_ids": [int],  # optional, default []
                   "acceptance": [int]}]}    # optional, default [0]: drafts accepted at each
                                             # successive verify step of the request, cycled
                                             # (verify step: engines/PROTOCOL.md, `steps`)

THE STAND-IN IS NOT A MODEL. It is a pure function from a request's tokens so far to its
next token, so a scheduler can be driven without weights, identically on every machine:

- `target_next(seed, tokens, vocab_size)`: blake2b (8-byte digest, person
  b"parity-target") over: seed as 8 bytes little-endian, len(tokens) as 8 bytes
  little-endian, then each of the last (up to) 16 tokens as 8 bytes little-endian signed;
  the digest read as a little-endian unsigned integer, modulo vocab_size.
- `prompt_tokens(seed, req_id, n, vocab_size)`: token i is blake2b (8-byte digest, person
  b"parity-prompt") over seed (8 bytes LE), i (8 bytes LE), then the id's UTF-8 bytes,
  read as a little-endian unsigned integer, modulo vocab_size.
- `draft(seed, tokens, k, accept, vocab_size)`: the target's next min(accept, k) tokens,
  then wrong tokens ((true + 1) % vocab_size, each continuing from the wrong one) up to k.
- `verify(seed, tokens, drafts, vocab_size)`: the longest prefix of drafts equal to what
  target_next produces, plus one bonus token (the target's token after that prefix).

Accepted drafts equal the target's own tokens, so a request's output is the same with and
without speculative decoding, under every scheduler: only the steps differ.
"""

from __future__ import annotations

import hashlib
import re

from conformance.formats.fields import ScenarioError, type_name as _tname

REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MAX_VOCAB_SIZE = 151936
MAX_STEPS = 100_000
MAX_REQUESTS = 4096
MAX_SEED = (1 << 63) - 1
MAX_LIST = 1024  # stop_token_ids and acceptance entries per request
MAX_ACCEPT = 1024  # an acceptance above the drafts scheduled simply accepts them all
CONTEXT = 16  # target_next looks at the last CONTEXT tokens (and the length)

TOP_LEVEL = {"seed", "vocab_size", "max_steps", "requests"}
REQUEST_KEYS = {"id", "arrival_step", "prompt_len", "max_tokens", "stop_token_ids", "acceptance"}


def validate_workload(raw: object, source: str, engine_args: dict) -> dict:
    """The workload with defaults filled in; raises ScenarioError naming the field."""

    def fail(field: str, problem: str):
        raise ScenarioError(source, field, problem)

    def integer(where: str, value: object, low: int, high: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            fail(where, f"must be an integer, got {_tname(value)}")
        if not low <= value <= high:
            fail(where, f"must be between {low} and {high}, got {value}")
        return value

    if not isinstance(raw, dict):
        fail("workload", f"must be an object, got {_tname(raw)}")
    for key in raw:
        if key not in TOP_LEVEL:
            fail(f"workload.{key}", f"unknown key; allowed: {sorted(TOP_LEVEL)}")
    for key in sorted(TOP_LEVEL):
        if key not in raw:
            fail(f"workload.{key}", "is required")
    seed = integer("workload.seed", raw["seed"], 0, MAX_SEED)
    vocab_size = integer("workload.vocab_size", raw["vocab_size"], 2, MAX_VOCAB_SIZE)
    max_steps = integer("workload.max_steps", raw["max_steps"], 1, MAX_STEPS)
    requests = raw["requests"]
    if not isinstance(requests, list):
        fail("workload.requests", f"must be an array, got {_tname(requests)}")
    if not 1 <= len(requests) <= MAX_REQUESTS:
        fail("workload.requests", f"must hold 1 to {MAX_REQUESTS} requests, got {len(requests)}")
    max_model_len = engine_args.get("max_model_len") if isinstance(engine_args, dict) else None
    if not isinstance(max_model_len, int) or isinstance(max_model_len, bool):
        max_model_len = None

    seen: set[str] = set()
    out = []
    for i, req in enumerate(requests):
        where = f"workload.requests[{i}]"
        if not isinstance(req, dict):
            fail(where, f"must be an object, got {_tname(req)}")
        for key in req:
            if key not in REQUEST_KEYS:
                fail(f"{where}.{key}", f"unknown key; allowed: {sorted(REQUEST_KEYS)}")
        for key in ("id", "arrival_step", "prompt_len", "max_tokens"):
            if key not in req:
                fail(f"{where}.{key}", "is required")
        rid = req["id"]
        if not isinstance(rid, str):
            fail(f"{where}.id", f"must be a string, got {_tname(rid)}")
        if not REQUEST_ID.fullmatch(rid):
            fail(f"{where}.id", f"must be 1-32 characters of A-Z a-z 0-9 _ - , got {rid!r}")
        if rid in seen:
            fail(f"{where}.id", f"duplicate request id {rid!r}")
        seen.add(rid)
        arrival = integer(f"{where}.arrival_step", req["arrival_step"], 0, max_steps - 1)
        limit = max_model_len if max_model_len is not None else 1 << 20
        prompt_len = integer(f"{where}.prompt_len", req["prompt_len"], 1, limit)
        max_tokens = integer(f"{where}.max_tokens", req["max_tokens"], 1, limit)
        if max_model_len is not None and prompt_len + max_tokens > max_model_len:
            fail(f"{where}.max_tokens", f"prompt_len + max_tokens = {prompt_len + max_tokens} "
                 f"exceeds engine_args.max_model_len = {max_model_len}")
        stops = _int_list(fail, f"{where}.stop_token_ids", req.get("stop_token_ids", []),
                          0, vocab_size - 1, allow_empty=True)
        acceptance = _int_list(fail, f"{where}.acceptance", req.get("acceptance", [0]),
                               0, MAX_ACCEPT, allow_empty=False)
        out.append({"id": rid, "arrival_step": arrival, "prompt_len": prompt_len,
                    "max_tokens": max_tokens, "stop_token_ids": stops, "acceptance": acceptance})
    return {"seed": seed, "vocab_size": vocab_size, "max_steps": max_steps, "requests": out}


def _int_list(fail, where: str, value: object, low: int, high: int, allow_empty: bool) -> list[int]:
    if not isinstance(value, list):
        fail(where, f"must be an array of integers, got {_tname(value)}")
    if not allow_empty and not value:
        fail(where, "must not be empty")
    if len(value) > MAX_LIST:
        fail(where, f"must hold at most {MAX_LIST} entries, got {len(value)}")
    for j, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool):
            fail(f"{where}[{j}]", f"must be an integer, got {_tname(item)}")
        if not low <= item <= high:
            fail(f"{where}[{j}]", f"must be between {low} and {high}, got {item}")
    return list(value)


# --- the stand-in ---------------------------------------------------------------------

def _le(value: int) -> bytes:
    return value.to_bytes(8, "little", signed=True)


class Context:
    """A request's tokens as the stand-in reads them: how many there are and the last CONTEXT.
    Every stand-in function reads a token list only through `len(tokens)` and
    `tokens[-CONTEXT:]`, so a Context gives the same answers as the whole list, bit for bit,
    at O(CONTEXT) cost: a 16k-token prompt is never copied per step (tests/test_workload_gen.py
    checks it against the list form)."""

    __slots__ = ("n", "tail")

    def __init__(self, n: int, tail: list[int]):
        self.n, self.tail = n, list(tail[-CONTEXT:])

    @classmethod
    def of(cls, tokens) -> "Context":
        """From anything with a length and slices: a list, vLLM's ConstantList, a Context."""
        return cls(len(tokens), tokens[-CONTEXT:])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item: slice) -> list[int]:
        if not (isinstance(item, slice) and item.step is None and item.stop is None
                and item.start is not None and -CONTEXT <= item.start < 0):
            raise IndexError("a Context holds only its last tokens: tokens[-k:] with k <= CONTEXT")
        return self.tail[item]

    def append(self, token: int) -> None:
        self.n += 1
        self.tail.append(token)
        if len(self.tail) > CONTEXT:
            del self.tail[0]


def target_next(seed: int, tokens, vocab_size: int) -> int:
    """The stand-in target's next token after `tokens` (a list or a Context): a pure function,
    in [0, vocab_size)."""
    h = hashlib.blake2b(digest_size=8, person=b"parity-target")
    h.update(_le(seed))
    h.update(_le(len(tokens)))
    for token in tokens[-CONTEXT:]:
        h.update(_le(token))
    return int.from_bytes(h.digest(), "little") % vocab_size


def prompt_tokens(seed: int, req_id: str, n: int, vocab_size: int) -> list[int]:
    """The request's n prompt tokens, in [0, vocab_size)."""
    out = []
    for i in range(n):
        h = hashlib.blake2b(digest_size=8, person=b"parity-prompt")
        h.update(_le(seed))
        h.update(_le(i))
        h.update(req_id.encode())
        out.append(int.from_bytes(h.digest(), "little") % vocab_size)
    return out


def draft(seed: int, tokens, k: int, accept: int, vocab_size: int) -> list[int]:
    """k draft tokens: the target's next min(accept, k) tokens, then wrong ones."""
    context = Context.of(tokens)
    out = []
    for i in range(k):
        true = target_next(seed, context, vocab_size)
        token = true if i < accept else (true + 1) % vocab_size
        out.append(token)
        context.append(token)
    return out


def verify(seed: int, tokens, drafts: list[int], vocab_size: int) -> list[int]:
    """The accepted prefix of `drafts` plus the bonus token: what the target samples."""
    context = Context.of(tokens)
    out = []
    for proposed in drafts:
        true = target_next(seed, context, vocab_size)
        if proposed != true:
            out.append(true)
            return out
        out.append(true)
        context.append(true)
    out.append(target_next(seed, context, vocab_size))
    return out
