"""A scenario's workload, and the deterministic stand-in that plays the model for it.

Standard library only: imported by the harness (to validate a scenario before any engine
starts) and by the worker inside each pinned vLLM environment (to drive the scheduler).

The workload schema (every key below; no others):

    {"seed": int,            # seeds the stand-in
     "vocab_size": int,      # the stand-in's vocabulary, 2..151936
     "max_steps": int,       # safety cap on scheduler steps, 1..100000
     "prefixes": [{"name": str,  # optional: named shared prefixes (a system prompt),
                   "len": int}], #   ^[A-Za-z0-9_-]{1,32}$, unique; len 1..max_model_len
     "requests": [{"id": str,             # ^[A-Za-z0-9_-]{1,32}$, unique
                   "arrival_step": int,   # the step at which it is added, 0..max_steps-1
                   "prompt_len": int,     # its own new tokens: >= 1, or >= 0 after a
                                          #   `prefix` or `continues`
                   "max_tokens": int,     # >= 1; len(prompt) + max_tokens <= max_model_len
                   "prefix": str,         # optional: its prompt starts with that prefix
                   "continues": str,      # optional: its prompt starts with an earlier
                                          #   request's prompt and output (a multi-turn chat);
                                          #   not with `prefix`; that request may not abort
                   "abort_step": int,     # optional: aborted at that step (arrival..max_steps-1)
                   "priority": int,       # optional, default 0 (the priority policy's key)
                   "external": {"tokens": int,  # optional, with engine_args.kv_transfer_config:
                                "async_steps": int,  # the remote KV store holds its prompt's
                                "fail": bool},  # first `tokens` tokens; loaded synchronously, or
                                                # `async_steps` steps after the load is issued;
                                                # `fail`: the load fails (engines/vllm/kv_connector.py)
                   "stop_token_ids": [int],  # optional, default []
                   "min_tokens": int,     # optional, default 0: 0..max_tokens; no stop before
                                          #   that many outputs (vLLM's check_stop gate)
                   "eos_token_id": int,   # optional: 0..vocab_size-1; the request stops at it
                                          #   (vLLM with ignore_eos false); none: ignore_eos
                   "repetition_detection": {"max_pattern_size": int,  # optional, each 0..1024,
                                            "min_pattern_size": int,  #   default 0; checked as
                                            "min_count": int},        #   vLLM's
                                          #   RepetitionDetectionParams checks them; a
                                          #   max_pattern_size of 0 turns it off
                   "structured_output": {"json": object | str,  # optional: exactly one key,
                                         "regex": str,            #   as vLLM's
                                         "choice": [str]},        #   StructuredOutputsParams
                                          #   takes it; its grammar constrains what the stand-in
                                          #   samples (below); needs the model folder's tokenizer
                   "reasoning_end": {"token_id": int,  # optional, with a structured_output and
                                     "at": int},     #   engine_args.reasoning_parser: the
                                          #   stand-in's target gives token_id (the parser's end
                                          #   token) as output token `at` (0..max_tokens-1);
                                          #   reasoning before it, the grammar after (below)
                   "lora": {"id": int,    # optional, with engine_args.enable_lora: the LoRA
                            "name": str},  #   adapter it runs under (vLLM's LoRARequest
                                          #   lora_int_id, 1..2**31-1, and lora_name, as a
                                          #   request id); within a workload an id names one
                                          #   adapter and a name one id
                   "session": {...},      # optional: a streaming input session, its chunks
                                          #   and the end of its input (sessions.py)
                   "kv_cache_report_mode": str,  # optional, with KV cache events on:
                                          #   "incremental" (vLLM's default) or "full" (its
                                          #   prefix-cache hit is reported as BlockStored too)
                   "encoder_inputs": [{"offset": int,  # optional, not with `continues`: the
                                       "length": int,  #   request's multimodal items (vLLM's
                                       "hash": str}],  #   mm_features), each a placeholder of
                                          #   `length` tokens (1..) at `offset` in the prompt
                                          #   (its prefix's tokens, then its own), in increasing
                                          #   order, apart, inside the prompt; `hash` the item's
                                          #   identifier (mm_hash, as a request id): one hash is
                                          #   one item (its encoder output is shared through the
                                          #   encoder cache), of one length in the workload
                   "acceptance": [int]}],    # optional, default [0]: drafts accepted at each
                                             # successive verify step of the request, cycled
                                             # (verify step: engines/PROTOCOL.md, `steps`)
     "prefix_cache_resets": [{"step": int,  # optional: the API server's reset_prefix_cache
                              "reset_running_requests": bool,  # at that step (0..max_steps-1),
                              "reset_connector": bool}]}  # after its arrivals and aborts, before
                                             # schedule(); both options default false; one a step

THE STAND-IN IS NOT A MODEL. It is a pure function from a request's tokens so far to its
next token, so a scheduler can be driven without weights, identically on every machine:

- `target_next(seed, tokens, vocab_size)`: blake2b (8-byte digest, person
  b"parity-target") over: seed as 8 bytes little-endian, len(tokens) as 8 bytes
  little-endian, then each of the last (up to) 16 tokens as 8 bytes little-endian signed;
  the digest read as a little-endian unsigned integer, modulo vocab_size.
- `prompt_tokens(seed, req_id, n, vocab_size)`: token i is blake2b (8-byte digest, person
  b"parity-prompt") over seed (8 bytes LE), i (8 bytes LE), then the id's UTF-8 bytes,
  read as a little-endian unsigned integer, modulo vocab_size.
- `prefix_tokens(seed, name, n, vocab_size)`: prompt_tokens(seed, "prefix/" + name, n,
  vocab_size); a request id cannot hold "/", so no request's own tokens are a prefix's.
- `chunk_tokens(seed, id, j, n, vocab_size)`: prompt_tokens(seed, "chunk/" + id + "/" + j,
  n, vocab_size), j in decimal: a streaming session's chunk j (sessions.py).
- `expected_output(seed, prompt, max_tokens, stop_token_ids, max_model_len, vocab_size,
  min_tokens, eos_token_id, repetition)`: what a request outputs under any scheduler: the
  target's tokens after its prompt, each checked as vLLM 0.27.1's check_stop checks it
  (`check_stop`): no stop while fewer than min_tokens outputs; then the eos token (kept), a
  stop token (kept), max_tokens outputs or max_model_len tokens in all, a repeating tail
  (`repeats`).
- `repeats(output, max_pattern_size, min_pattern_size, min_count)`: vLLM's
  check_sequence_repetition: for each pattern length L from max(min_pattern_size, 1) to
  max_pattern_size, while L * min_count <= len(output), whether the last L tokens equal each of
  the min_count - 1 runs of L tokens before them.
- `request_prompts(workload, max_model_len)`: every request's prompt: its base (nothing, a
  prefix's tokens, or the continued request's prompt and expected output), then
  prompt_tokens(seed, id, prompt_len, vocab_size).
- `draft(seed, tokens, k, accept, vocab_size)`: the target's next min(accept, k) tokens,
  then wrong tokens ((true + 1) % vocab_size, each continuing from the wrong one) up to k.
- `verify(seed, tokens, drafts, vocab_size)`: the longest prefix of drafts equal to what
  target_next produces, plus one bonus token (the target's token after that prefix).

Under a grammar (a request with `structured_output`; engines/PROTOCOL.md "Structured outputs"),
the stand-in samples as vLLM's sampler does behind the grammar's bitmask: the release's own
`apply_grammar_bitmask` masks stand-in logits (zeros) for each position of a request (each
draft, then the bonus), and what it leaves finite is that position's allowed ids:

- `allowed_ids(words)`: the ids a bitmask row allows (32-bit words, id t allowed when bit
  t % 32 of word t // 32 is set), in increasing order.
- `masked_choice(allowed, token)`: of the allowed ids, in increasing order, the one at index
  `token` modulo their number; `token` itself when none is allowed. Every id allowed gives
  `token`: a request without a grammar, or one whose grammar terminated, samples as before.
  (Counting among the allowed ids, rather than taking the next allowed id, spreads the choices
  over what the grammar allows: low ids such as whitespace would otherwise take every wrap.)
- `verify_masked(seed, tokens, drafts, vocab_size, allowed)`: `verify` with each position's
  target token `masked_choice(allowed[i], target_next(...))`.
- The drafter under a grammar (engines/vllm/grammar.py `masked_draft`): `draft` whose
  target tokens are `masked_choice` of the rows the request's grammar gives as it follows
  the drafts (a drafter that learnt the format); the first wrong token is that target token
  plus one, and the grammar is no longer followed after it (every id allowed). Some drafts
  thus break the grammar and the scheduler's `validate_tokens` cuts them; others are within
  it and the target rejects them.

Under a reasoning parser (`engine_args.reasoning_parser`; engines/PROTOCOL.md "Structured
outputs after reasoning"), a grammar request reasons first: the release fills full rows (every
id allowed) until its reasoning ends, so the stand-in samples as without a grammar; then the
grammar applies. Its reasoning ends where its `reasoning_end` says (never without one):

- `reasoning_next(seed, tokens, vocab_size, end)`: target_next, except that with `end` =
  (len(prompt) + at, token_id), a context of exactly len(prompt) + at tokens gives token_id.
  verify_masked's target tokens are reasoning_next's, masked as above.
- The drafter: while reasoning (the request's tokens do not hold token_id at index
  len(prompt) + at), `draft` of reasoning_next's tokens with no grammar followed; once its
  drafts reach that end (an accepted draft equal to token_id there), the grammar is followed
  from the next draft on, as above.

vLLM 0.33.0 moved check_stop's min_tokens gate after the eos, stop token and length checks (the
sampler's min-tokens logits processor keeps a real model from sampling those early): where the
stand-in's target gives an eos or stop token before min_tokens outputs, 0.33.0 stops there and
0.27.1 and 0.28.0 do not (upstream-changes.toml). A request with min_tokens is therefore never
continued: a prompt does not depend on the release.

Accepted drafts equal the target's own tokens, so a request's output is the same with and
without speculative decoding, under every scheduler: only the steps differ. Two requests whose
prompts share their first tokens share them exactly, so an engine's prefix cache sees equal
blocks where the workload says the prompts agree.
"""

from __future__ import annotations

import hashlib
import json
import re

from conformance.formats.fields import ScenarioError, type_name as _tname
from conformance.formats.record_schema import INFORMATIONAL_SUFFIX
from conformance.formats.sessions import check_sessions, validate_session

REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MAX_VOCAB_SIZE = 151936
MAX_STEPS = 100_000
MAX_REQUESTS = 4096
MAX_SEED = (1 << 63) - 1
MAX_LIST = 1024  # stop_token_ids and acceptance entries per request
MAX_ACCEPT = 1024  # an acceptance above the drafts scheduled simply accepts them all
MAX_PREFIXES = 64
MAX_PATTERN = 1024  # repetition_detection sizes and counts: bounds the check's work per token
MAX_CHAIN = 16  # continuations of continuations, at most: bounds the work of computing a prompt
PRIORITY = (-(1 << 31), (1 << 31) - 1)
NO_MAX_MODEL_LEN = 1 << 20  # the bound on a length when engine_args has no max_model_len
CONTEXT = 16  # target_next looks at the last CONTEXT tokens (and the length)

TOP_LEVEL = {"seed", "vocab_size", "max_steps", "requests", "prefixes", "prefix_cache_resets"}
TOP_REQUIRED = ("max_steps", "requests", "seed", "vocab_size")
REQUEST_KEYS = {"id", "arrival_step", "prompt_len", "max_tokens", "stop_token_ids", "acceptance",
                "prefix", "continues", "abort_step", "priority", "min_tokens", "eos_token_id",
                "repetition_detection", "external", "structured_output", "lora", "reasoning_end", "session",
                "kv_cache_report_mode", "encoder_inputs"}
REPETITION_KEYS = ("max_pattern_size", "min_pattern_size", "min_count")
EXTERNAL_KEYS = {"tokens", "async_steps", "fail"}
LORA_KEYS = {"id", "name"}
MAX_LORA_ID = (1 << 31) - 1
ENCODER_INPUT_KEYS = {"offset", "length", "hash"}
MAX_ENCODER_INPUTS = 64  # items per request
PREFIX_KEYS = {"name", "len"}
STRUCTURED_KEYS = ("json", "regex", "choice")  # vLLM's StructuredOutputsParams, the ones run here
MAX_GRAMMAR_TEXT = 4096  # characters of a JSON schema (as JSON text) or a regex
MAX_CHOICES = 64
REASONING_END_KEYS = {"token_id", "at"}
RESET_KEYS = {"step", "reset_running_requests", "reset_connector"}
REPORT_MODES = ("incremental", "full")  # vLLM's kv_cache_report_mode (a request's extra_args)


def validate_workload(raw: object, source: str, engine_args: dict) -> dict:
    """The workload with defaults filled in; raises ScenarioError naming the field."""
    check = FieldChecker(source)
    check.keys("workload", raw, TOP_LEVEL, TOP_REQUIRED)
    seed = check.integer("workload.seed", raw["seed"], 0, MAX_SEED)
    vocab_size = check.integer("workload.vocab_size", raw["vocab_size"], 2, MAX_VOCAB_SIZE)
    max_steps = check.integer("workload.max_steps", raw["max_steps"], 1, MAX_STEPS)
    max_model_len = engine_args.get("max_model_len") if isinstance(engine_args, dict) else None
    if not isinstance(max_model_len, int) or isinstance(max_model_len, bool):
        max_model_len = None
    limit = max_model_len if max_model_len is not None else NO_MAX_MODEL_LEN
    prefixes = _prefixes(check, raw.get("prefixes", []), limit)
    requests = raw["requests"]
    if not isinstance(requests, list):
        check.fail("workload.requests", f"must be an array, got {_tname(requests)}")
    if not 1 <= len(requests) <= MAX_REQUESTS:
        check.fail("workload.requests", f"must hold 1 to {MAX_REQUESTS} requests, got {len(requests)}")
    out: list[dict] = []
    for i, req in enumerate(requests):
        out.append(_request(check, f"workload.requests[{i}]", req, out, prefixes, vocab_size, max_steps, limit))
    workload = {"seed": seed, "vocab_size": vocab_size, "max_steps": max_steps, "requests": out}
    if "prefixes" in raw:
        workload["prefixes"] = [{"name": name, "len": n} for name, n in prefixes.items()]
    _check_lengths(check, workload, max_model_len)
    connector = isinstance(engine_args, dict) and engine_args.get("kv_transfer_config") is not None
    for i, req in enumerate(out):
        if "external" in req and not connector:
            check.fail(f"workload.requests[{i}].external", "needs engine_args.kv_transfer_config: only a KV "
                       "connector loads what the remote store holds")
    _check_adapters(check, out, engine_args)
    parser = isinstance(engine_args, dict) and bool(engine_args.get("reasoning_parser"))
    for i, req in enumerate(out):
        if "reasoning_end" in req and not parser:
            check.fail(f"workload.requests[{i}].reasoning_end", "needs engine_args.reasoning_parser: without "
                       "one the release never looks for a reasoning end")
    _check_encoder_inputs(check, out, prefixes)
    if "prefix_cache_resets" in raw:
        workload["prefix_cache_resets"] = resets = _resets(check, raw["prefix_cache_resets"], max_steps)
        last = max(req["arrival_step"] for req in out)
        if resets and isinstance(engine_args, dict) and engine_args.get("async_scheduling") is not False \
                and resets[-1]["step"] > last:
            # vLLM's batch-queue loop schedules nothing while idle: a request must come after the
            # reset for a schedule() to record its result
            check.fail(f"workload.prefix_cache_resets[{len(resets) - 1}].step", f"must be at most the last "
                       f"arrival step ({last}) unless engine_args.async_scheduling is false: under async "
                       f"scheduling a reset's result is recorded by the next schedule(), got {resets[-1]['step']}")
    events = isinstance(engine_args, dict) and isinstance(engine_args.get("kv_events_config"), dict) \
        and engine_args["kv_events_config"].get("enable_kv_cache_events") is True
    for i, req in enumerate(out):
        if "kv_cache_report_mode" in req and not events:
            check.fail(f"workload.requests[{i}].kv_cache_report_mode", "needs engine_args.kv_events_config "
                       "with enable_kv_cache_events true: the mode says which KV cache events a request reports")
    return workload


def _resets(check: FieldChecker, raw: object, max_steps: int) -> list[dict]:
    """The API server's reset_prefix_cache calls, by step (at most one a step), in step order."""
    if not isinstance(raw, list):
        check.fail("workload.prefix_cache_resets", f"must be an array, got {_tname(raw)}")
    out: list[dict] = []
    for i, entry in enumerate(raw):
        where = f"workload.prefix_cache_resets[{i}]"
        check.keys(where, entry, RESET_KEYS, ("step",))
        step = check.integer(f"{where}.step", entry["step"], 0, max_steps - 1)
        if out and step <= out[-1]["step"]:
            check.fail(f"{where}.step", f"must come after the step before ({out[-1]['step']}): one reset a "
                       f"step, in step order, got {step}")
        reset = {"step": step}
        for key in ("reset_running_requests", "reset_connector"):
            if key in entry:
                if not isinstance(entry[key], bool):
                    check.fail(f"{where}.{key}", f"must be true or false, got {_tname(entry[key])}")
                if entry[key]:
                    reset[key] = True
        out.append(reset)
    return out


class FieldChecker:
    """Raises the ScenarioError naming the field; one place for the shared checks (the
    production generator's parameters extend it, workload_gen.py)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str):
        raise ScenarioError(self.source, field, problem)

    def integer(self, where: str, value: object, low: int, high: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(where, f"must be an integer, got {_tname(value)}")
        if not low <= value <= high:
            self.fail(where, f"must be between {low} and {high}, got {value}")
        return value

    def name(self, where: str, value: object, what: str) -> str:
        if not isinstance(value, str):
            self.fail(where, f"must be a string, got {_tname(value)}")
        if not REQUEST_ID.fullmatch(value):
            self.fail(where, f"must be 1-32 characters of A-Z a-z 0-9 _ - ({what}), got {value[:40]!r}")
        return value

    def keys(self, where: str, obj: object, allowed: set[str], required: tuple[str, ...]) -> dict:
        if not isinstance(obj, dict):
            self.fail(where, f"must be an object, got {_tname(obj)}")
        for key in obj:
            if key not in allowed:
                self.fail(f"{where}.{key}", f"unknown key; allowed: {sorted(allowed)}")
        for key in required:
            if key not in obj:
                self.fail(f"{where}.{key}", "is required")
        return obj


def _prefixes(check: FieldChecker, raw: object, limit: int) -> dict[str, int]:
    """Named shared prefixes: name -> length, in the file's order."""
    if not isinstance(raw, list):
        check.fail("workload.prefixes", f"must be an array, got {_tname(raw)}")
    if len(raw) > MAX_PREFIXES:
        check.fail("workload.prefixes", f"must hold at most {MAX_PREFIXES} prefixes, got {len(raw)}")
    out: dict[str, int] = {}
    for i, entry in enumerate(raw):
        where = f"workload.prefixes[{i}]"
        check.keys(where, entry, PREFIX_KEYS, ("name", "len"))
        name = check.name(f"{where}.name", entry["name"], "a prefix's name")
        if name in out:
            check.fail(f"{where}.name", f"duplicate prefix name {name!r}")
        out[name] = check.integer(f"{where}.len", entry["len"], 1, limit)
    return out


def _request(check: FieldChecker, where: str, req: object, earlier: list[dict], prefixes: dict[str, int],
             vocab_size: int, max_steps: int, limit: int) -> dict:
    """One request checked against the requests before it; its optional keys kept only when given."""
    check.keys(where, req, REQUEST_KEYS, ("id", "arrival_step", "prompt_len", "max_tokens"))
    rid = check.name(f"{where}.id", req["id"], "a request id")
    if rid.endswith(INFORMATIONAL_SUFFIX):  # records name requests by id: never wording's suffix
        check.fail(f"{where}.id", f"a request id may not end in {INFORMATIONAL_SUFFIX!r}, the suffix of "
                   f"informational fields (engines/PROTOCOL.md), got {rid!r}")
    if any(e["id"] == rid for e in earlier):
        check.fail(f"{where}.id", f"duplicate request id {rid!r}")
    arrival = check.integer(f"{where}.arrival_step", req["arrival_step"], 0, max_steps - 1)
    if "prefix" in req and "continues" in req:
        check.fail(f"{where}.continues", "a request continues another or starts with a prefix, not both")
    based = "prefix" in req or "continues" in req
    prompt_len = check.integer(f"{where}.prompt_len", req["prompt_len"], 0 if based else 1, limit)
    out = {"id": rid, "arrival_step": arrival, "prompt_len": prompt_len,
           "max_tokens": check.integer(f"{where}.max_tokens", req["max_tokens"], 1, limit),
           "stop_token_ids": _int_list(check.fail, f"{where}.stop_token_ids", req.get("stop_token_ids", []),
                                       0, vocab_size - 1, allow_empty=True),
           "acceptance": _int_list(check.fail, f"{where}.acceptance", req.get("acceptance", [0]),
                                   0, MAX_ACCEPT, allow_empty=False)}
    if "prefix" in req:
        name = check.name(f"{where}.prefix", req["prefix"], "a prefix's name")
        if name not in prefixes:
            check.fail(f"{where}.prefix", f"names {name!r}, which workload.prefixes does not; "
                       f"prefixes: {_some(list(prefixes))}")
        out["prefix"] = name
    if "continues" in req:
        out["continues"] = _continued(check, f"{where}.continues", req["continues"], earlier)
    if "abort_step" in req:
        out["abort_step"] = check.integer(f"{where}.abort_step", req["abort_step"], arrival, max_steps - 1)
    if "priority" in req and check.integer(f"{where}.priority", req["priority"], *PRIORITY) != 0:
        out["priority"] = req["priority"]
    _stops(check, where, req, out, vocab_size)
    if "external" in req:
        out["external"] = _external(check, f"{where}.external", req["external"], max_steps, limit)
    if "structured_output" in req:
        out["structured_output"] = _structured(check, f"{where}.structured_output", req["structured_output"])
    if "kv_cache_report_mode" in req:
        if req["kv_cache_report_mode"] not in REPORT_MODES:
            check.fail(f"{where}.kv_cache_report_mode", f"must be one of {list(REPORT_MODES)}, got "
                       f"{str(req['kv_cache_report_mode'])[:40]!r}")
        if req["kv_cache_report_mode"] != "incremental":  # vLLM's default is left out
            out["kv_cache_report_mode"] = req["kv_cache_report_mode"]
    if "lora" in req:
        check.keys(f"{where}.lora", req["lora"], LORA_KEYS, ("id", "name"))
        out["lora"] = {"id": check.integer(f"{where}.lora.id", req["lora"]["id"], 1, MAX_LORA_ID),
                       "name": check.name(f"{where}.lora.name", req["lora"]["name"], "an adapter's name")}
    if "encoder_inputs" in req:
        out["encoder_inputs"] = _encoder_inputs(check, f"{where}.encoder_inputs", req["encoder_inputs"], limit)
    if "reasoning_end" in req:
        out["reasoning_end"] = _reasoning_end(check, f"{where}.reasoning_end", req["reasoning_end"], out, vocab_size)
    if "session" in req:
        out["session"] = validate_session(check, f"{where}.session", req["session"], {**req, **out}, max_steps, limit)
    return out


def _reasoning_end(check: FieldChecker, where: str, raw: object, out: dict, vocab_size: int) -> dict:
    """Where a grammar request's reasoning ends: a grammar is what reasoning defers."""
    check.keys(where, raw, REASONING_END_KEYS, ("token_id", "at"))
    if "structured_output" not in out:
        check.fail(where, "needs a structured_output: reasoning only defers a request's grammar")
    return {"token_id": check.integer(f"{where}.token_id", raw["token_id"], 0, vocab_size - 1),
            "at": check.integer(f"{where}.at", raw["at"], 0, out["max_tokens"] - 1)}


def _encoder_inputs(check: FieldChecker, where: str, raw: object, limit: int) -> list[dict]:
    """A request's multimodal items: placeholders in increasing order, apart (vLLM's input
    processor makes them so, and the scheduler's window search relies on it)."""
    if not isinstance(raw, list):
        check.fail(where, f"must be an array, got {_tname(raw)}")
    if not 1 <= len(raw) <= MAX_ENCODER_INPUTS:
        check.fail(where, f"must hold 1 to {MAX_ENCODER_INPUTS} items, got {len(raw)}")
    out: list[dict] = []
    for j, item in enumerate(raw):
        at = f"{where}[{j}]"
        check.keys(at, item, ENCODER_INPUT_KEYS, ("offset", "length", "hash"))
        offset = check.integer(f"{at}.offset", item["offset"], 0, limit - 1)
        if out and offset < out[-1]["offset"] + out[-1]["length"]:
            check.fail(f"{at}.offset", f"must be at least {out[-1]['offset'] + out[-1]['length']}, where "
                       f"the item before it ends: placeholders in increasing order, apart; got {offset}")
        out.append({"offset": offset, "length": check.integer(f"{at}.length", item["length"], 1, limit),
                    "hash": check.name(f"{at}.hash", item["hash"], "an item's hash")})
    return out


def _check_encoder_inputs(check: FieldChecker, requests: list[dict], prefixes: dict[str, int]) -> None:
    """Each item inside its request's prompt, and one length per hash: vLLM hashes an item's
    content, so equal hashes are one item, which the encoder turns into as many tokens each time."""
    lengths: dict[str, int] = {}
    for i, req in enumerate(requests):
        where = f"workload.requests[{i}].encoder_inputs"
        if "encoder_inputs" not in req:
            continue
        if "continues" in req:
            check.fail(where, "is not taken with `continues`: the continued request's items would be its "
                       "prompt's too")
        prompt = prefixes.get(req.get("prefix"), 0) + req["prompt_len"]
        for j, item in enumerate(req["encoder_inputs"]):
            if item["offset"] + item["length"] > prompt:
                check.fail(f"{where}[{j}]", f"ends at {item['offset'] + item['length']}, past the prompt's "
                           f"{prompt} tokens: a placeholder lies inside the prompt")
            if lengths.setdefault(item["hash"], item["length"]) != item["length"]:
                check.fail(f"{where}[{j}].length", f"item {item['hash']!r} has length "
                           f"{lengths[item['hash']]} in an earlier placeholder, got {item['length']}: "
                           "one hash, one item")


def _structured(check: FieldChecker, where: str, raw: object) -> dict:
    """One constraint of vLLM's StructuredOutputsParams: a JSON schema (an object, or its JSON
    text), a regex, or a non-empty list of choices. Whether the grammar compiles is the
    release's to say: a scenario may hold one that does not."""
    check.keys(where, raw, set(STRUCTURED_KEYS), ())
    if len(raw) != 1:
        check.fail(where, f"must hold exactly one of {list(STRUCTURED_KEYS)}, got {sorted(raw) or 'none'}")
    (key, value), = raw.items()
    if key == "json":
        if not isinstance(value, (dict, str)):
            check.fail(f"{where}.json", f"must be a JSON schema (an object, or its JSON text), got {_tname(value)}")
        text = value if isinstance(value, str) else json.dumps(value)
        if not text.strip() or len(text) > MAX_GRAMMAR_TEXT:
            check.fail(f"{where}.json", f"must be 1 to {MAX_GRAMMAR_TEXT} characters as JSON text, got {len(text)}")
    elif key == "regex":
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_GRAMMAR_TEXT:
            check.fail(f"{where}.regex", f"must be a string of 1 to {MAX_GRAMMAR_TEXT} characters, got "
                       f"{_tname(value) if not isinstance(value, str) else len(value)}")
    else:
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_CHOICES or not all(
                isinstance(c, str) and 1 <= len(c) <= 256 for c in value):
            check.fail(f"{where}.choice", f"must be a list of 1 to {MAX_CHOICES} strings of 1 to 256 characters")
    return {key: value}


def _check_adapters(check: FieldChecker, requests: list[dict], engine_args: dict) -> None:
    """Adapters need LoRA turned on, and name one adapter each way: vLLM's scheduler counts
    adapters by id (max_loras) and its block hashes tell them apart by name, so an id under two
    names (or a name under two ids) would be counted as one adapter and hashed as two."""
    enabled = isinstance(engine_args, dict) and engine_args.get("enable_lora") is True
    by_id: dict[int, str] = {}
    by_name: dict[str, int] = {}
    for i, req in enumerate(requests):
        if "lora" not in req:
            continue
        where = f"workload.requests[{i}].lora"
        if not enabled:
            check.fail(where, "needs engine_args.enable_lora true: without it vLLM refuses a LoRA request")
        lora_id, name = req["lora"]["id"], req["lora"]["name"]
        if by_id.setdefault(lora_id, name) != name:
            check.fail(f"{where}.name", f"id {lora_id} names adapter {by_id[lora_id]!r} in an earlier request, "
                       f"got {name!r}: one id, one adapter")
        if by_name.setdefault(name, lora_id) != lora_id:
            check.fail(f"{where}.id", f"adapter {name!r} has id {by_name[name]} in an earlier request, "
                       f"got {lora_id}: one adapter, one id")


def _external(check: FieldChecker, where: str, raw: object, max_steps: int, limit: int) -> dict:
    """What the remote KV store holds of the request's prompt (engines/vllm/kv_connector.py)."""
    check.keys(where, raw, EXTERNAL_KEYS, ("tokens",))
    out = {"tokens": check.integer(f"{where}.tokens", raw["tokens"], 1, limit)}
    if "async_steps" in raw:
        out["async_steps"] = check.integer(f"{where}.async_steps", raw["async_steps"], 0, max_steps)
    if "fail" in raw:
        if not isinstance(raw["fail"], bool):
            check.fail(f"{where}.fail", f"must be true or false, got {_tname(raw['fail'])}")
        out["fail"] = raw["fail"]
    return out


def _stops(check: FieldChecker, where: str, req: dict, out: dict, vocab_size: int) -> None:
    """The optional stop conditions: min_tokens kept only above 0 (as a priority of 0 is
    dropped), the eos token and repetition detection as given."""
    if "min_tokens" in req:
        min_tokens = check.integer(f"{where}.min_tokens", req["min_tokens"], 0, NO_MAX_MODEL_LEN)
        if min_tokens > out["max_tokens"]:  # vLLM's SamplingParams refuses it too
            check.fail(f"{where}.min_tokens", f"must be at most max_tokens ({out['max_tokens']}), got {min_tokens}")
        if min_tokens:
            out["min_tokens"] = min_tokens
    if "eos_token_id" in req:
        out["eos_token_id"] = check.integer(f"{where}.eos_token_id", req["eos_token_id"], 0, vocab_size - 1)
    if "repetition_detection" in req:
        params = _repetition(check, f"{where}.repetition_detection", req["repetition_detection"])
        # kept even switched off (max_pattern_size 0): vLLM still calls its check, which returns
        # at once; only a max_pattern_size above 0 makes it a feature (features.py)
        out["repetition_detection"] = params


def _repetition(check: FieldChecker, where: str, raw: object) -> dict:
    """vLLM's RepetitionDetectionParams: each size 0 by default; __post_init__'s two checks."""
    check.keys(where, raw, set(REPETITION_KEYS), ())
    params = {key: check.integer(f"{where}.{key}", raw.get(key, 0), 0, MAX_PATTERN) for key in REPETITION_KEYS}
    if params["min_pattern_size"] > params["max_pattern_size"]:
        check.fail(f"{where}.min_pattern_size", f"must be at most max_pattern_size ({params['max_pattern_size']}), "
                   f"got {params['min_pattern_size']}; set both to 0 to turn repetition detection off")
    if params["max_pattern_size"] > 0 and params["min_count"] < 2:
        check.fail(f"{where}.min_count", f"must be at least 2 when max_pattern_size is above 0, got "
                   f"{params['min_count']}; set max_pattern_size to 0 to turn repetition detection off")
    return params


def _continued(check: FieldChecker, where: str, value: object, earlier: list[dict]) -> str:
    name = check.name(where, value, "an earlier request's id")
    target = next((e for e in earlier if e["id"] == name), None)
    if target is None:
        check.fail(where, f"names {name!r}, which is not an earlier request; earlier: "
                   f"{_some([e['id'] for e in earlier])}")
    if "abort_step" in target:
        check.fail(where, f"names {name!r}, which has an abort_step: a continued request's output "
                   "must follow from the workload alone")
    if "structured_output" in target:
        check.fail(where, f"names {name!r}, which has a structured_output: its output is its grammar's, "
                   "which only the release's grammar backend knows, and a prompt must follow from the workload")
    if "min_tokens" in target:
        check.fail(where, f"names {name!r}, which has min_tokens: where an eos or stop token comes "
                   "before min_tokens outputs its output differs by vLLM release, and a prompt may not")
    depth, at = 1, target
    while "continues" in at:
        depth += 1
        at = next(e for e in earlier if e["id"] == at["continues"])
    if depth > MAX_CHAIN:
        check.fail(where, f"makes a chain of {depth} continuations; at most {MAX_CHAIN}")
    return name


def _some(names: list[str], most: int = 10) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return f"[{shown}{', ...' if len(names) > most else ''}] ({len(names)})" if len(names) > most else f"[{shown}]"


def _check_lengths(check: FieldChecker, workload: dict, max_model_len: int | None) -> None:
    """len(prompt) + max_tokens <= max_model_len for every request, a continuation's prompt
    holding the earlier request's prompt and output."""
    lengths = prompt_lengths(workload, max_model_len)
    check_sessions(check, workload["requests"], lengths, max_model_len)
    if max_model_len is None:
        return
    for i, req in enumerate(workload["requests"]):
        total = lengths[req["id"]] + req["max_tokens"]
        if total > max_model_len:
            parts = f"prompt_len {req['prompt_len']}"
            if lengths[req["id"]] != req["prompt_len"]:
                parts = f"a prompt of {lengths[req['id']]} tokens ({_base(req)} + {req['prompt_len']} own)"
            check.fail(f"workload.requests[{i}].max_tokens",
                       f"{parts} + max_tokens {req['max_tokens']} = {total} exceeds "
                       f"engine_args.max_model_len = {max_model_len}")


def _base(req: dict) -> str:
    return f"prefix {req['prefix']!r}" if "prefix" in req else f"request {req['continues']!r}'s prompt and output"


def prompt_lengths(workload: dict, max_model_len: int | None) -> dict[str, int]:
    """Each request's prompt length, without computing prompts where lengths suffice: only a
    continued request that may stop early (stop token ids, an eos token, repetition detection)
    has its tokens computed."""
    prefixes = {p["name"]: p["len"] for p in workload.get("prefixes", [])}
    by_id = {req["id"]: req for req in workload["requests"]}
    lengths: dict[str, int] = {}
    prompts = None
    for req in workload["requests"]:
        base = 0
        if "prefix" in req:
            base = prefixes[req["prefix"]]
        elif "continues" in req:
            earlier = by_id[req["continues"]]
            if may_stop_early(earlier):
                prompts = prompts or _Prompts(workload, max_model_len)
                base = len(prompts.of(earlier["id"])) + len(prompts.output(earlier))
            else:
                base = lengths[earlier["id"]] + earlier["max_tokens"]
        lengths[req["id"]] = base + req["prompt_len"]
    return lengths


def may_stop_early(req: dict) -> bool:
    """Whether the request may stop before max_tokens for a reason its tokens give."""
    return bool(req["stop_token_ids"]) or "eos_token_id" in req or "repetition_detection" in req


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
    at O(CONTEXT) cost: a 16k-token prompt is never copied per step (tests/formats/test_workload_gen.py
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


def prefix_tokens(seed: int, name: str, n: int, vocab_size: int) -> list[int]:
    """A named shared prefix's n tokens: a request id cannot contain "/", so they are never
    a request's own tokens."""
    return prompt_tokens(seed, "prefix/" + name, n, vocab_size)


def chunk_tokens(seed: int, req_id: str, index: int, n: int, vocab_size: int) -> list[int]:
    """A streaming session's input chunk `index` (0: the first after its prompt; sessions.py):
    n tokens, never a request's own nor a prefix's (neither holds "/")."""
    return prompt_tokens(seed, f"chunk/{req_id}/{index}", n, vocab_size)


def expected_output(seed: int, prompt: list[int], max_tokens: int, stop_token_ids: list[int],
                    max_model_len: int | None, vocab_size: int, min_tokens: int = 0,
                    eos_token_id: int | None = None, repetition: dict | None = None) -> list[int]:
    """What a request with this prompt outputs under any scheduler: accepted drafts are the
    target's own tokens, and the scheduler checks stops token by token (a step's accepted drafts
    after a stop are cut), so the output is the target's tokens up to the first that `check_stop` stops at."""
    stops = set(stop_token_ids)
    context, out = list(prompt), []
    while True:
        token = target_next(seed, context, vocab_size)
        out.append(token)
        context.append(token)
        if check_stop(out, len(context), max_tokens, stops, max_model_len, min_tokens, eos_token_id, repetition):
            return out


def check_stop(output: list[int], num_tokens: int, max_tokens: int, stops: set[int], max_model_len: int | None,
         min_tokens: int = 0, eos_token_id: int | None = None, repetition: dict | None = None) -> str | None:
    """Why a request stops after its last output token, in vLLM 0.27.1's check_stop order (the
    gate oracle's; 0.28.0 agrees): "stop" (the eos or a stop token), "length", "repetition", or
    None. `num_tokens`: prompt and output."""
    if len(output) < min_tokens:
        return None
    last = output[-1]
    if last == eos_token_id or last in stops:
        return "stop"
    if (max_model_len is not None and num_tokens >= max_model_len) or len(output) >= max_tokens:
        return "length"
    if repetition is not None and repeats(output, **repetition):
        return "repetition"
    return None


def repeats(output: list[int], max_pattern_size: int, min_pattern_size: int, min_count: int) -> bool:
    """vLLM's check_sequence_repetition: whether the output ends in min_count runs of one
    pattern of min_pattern_size (at least 1) to max_pattern_size tokens, the shortest first."""
    low = max(min_pattern_size, 1)
    if max_pattern_size <= 0 or min_count < 2 or low > max_pattern_size:
        return False
    for size in range(low, max_pattern_size + 1):
        if size * min_count > len(output):
            return False
        if all(output[-(size * m + n)] == output[-n] for n in range(1, size + 1) for m in range(1, min_count)):
            return True
    return False


def request_prompts(workload: dict, max_model_len: int | None) -> dict[str, list[int]]:
    """Every request's prompt token ids (engines/PROTOCOL.md, `steps`, the stand-in)."""
    prompts = _Prompts(workload, max_model_len)
    return {req["id"]: prompts.of(req["id"]) for req in workload["requests"]}


class _Prompts:
    """Prompts computed once each: a continuation reuses the prompt it continues."""

    def __init__(self, workload: dict, max_model_len: int | None) -> None:
        self.seed, self.vocab = workload["seed"], workload["vocab_size"]
        self.max_model_len = max_model_len
        self.requests = {req["id"]: req for req in workload["requests"]}
        self.prefixes = {p["name"]: p["len"] for p in workload.get("prefixes", [])}
        self.memo: dict[str, list[int]] = {}

    def of(self, rid: str) -> list[int]:
        if rid not in self.memo:
            req = self.requests[rid]
            self.memo[rid] = self.base(req) + prompt_tokens(self.seed, rid, req["prompt_len"], self.vocab)
        return self.memo[rid]

    def base(self, req: dict) -> list[int]:
        if "prefix" in req:
            return prefix_tokens(self.seed, req["prefix"], self.prefixes[req["prefix"]], self.vocab)
        if "continues" in req:
            earlier = self.requests[req["continues"]]
            before = self.of(earlier["id"])
            return before + self.output(earlier)
        return []

    def output(self, req: dict) -> list[int]:
        return expected_output(self.seed, self.of(req["id"]), req["max_tokens"], req["stop_token_ids"],
                               self.max_model_len, self.vocab, req.get("min_tokens", 0),
                               req.get("eos_token_id"), req.get("repetition_detection"))


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


def allowed_ids(words) -> list[int]:
    """The ids a grammar bitmask row allows (32-bit words, which may read as negative ints),
    in increasing order."""
    return [at * 32 + bit for at, word in enumerate(words) for bit in range(32) if (word & 0xFFFFFFFF) >> bit & 1]


def masked_choice(allowed: list[int], token: int) -> int:
    """The stand-in's choice where a grammar allows `allowed` (increasing ids; module doc): the
    one at index `token` modulo their number; `token` when none is allowed."""
    return allowed[token % len(allowed)] if allowed else token


def verify_masked(seed: int, tokens, drafts: list[int], vocab_size: int, allowed,
                  end: tuple[int, int] | None = None) -> list[int]:
    """`verify` under a grammar: position i's target token is masked_choice(allowed[i], ...);
    `allowed` holds the allowed ids of each draft's position and of the bonus token's. `end`:
    the request's reasoning end (reasoning_next)."""
    context = Context.of(tokens)
    out = []
    for i, proposed in enumerate(drafts):
        true = masked_choice(allowed[i], reasoning_next(seed, context, vocab_size, end))
        out.append(true)
        if proposed != true:
            return out
        context.append(true)
    out.append(masked_choice(allowed[len(drafts)], reasoning_next(seed, context, vocab_size, end)))
    return out


def reasoning_end(req: dict, prompt_len: int) -> tuple[int, int] | None:
    """A request's reasoning end as reasoning_next takes it: (the context length at which the
    target gives the end token, that token), or None."""
    end = req.get("reasoning_end")
    return None if end is None else (prompt_len + end["at"], end["token_id"])


def reasoning_next(seed: int, tokens, vocab_size: int, end: tuple[int, int] | None) -> int:
    """target_next, except at the request's reasoning end (module doc)."""
    if end is not None and len(tokens) == end[0]:
        return end[1]
    return target_next(seed, tokens, vocab_size)
