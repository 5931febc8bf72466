"""What every record of every layer holds (engines/PROTOCOL.md, "Layers and their records"),
declared once, and the one check of a record against its layer's declaration.

The declaration is the tables' source of truth in code: each `Record` below has a table in
PROTOCOL.md (marked `<!-- record: NAME -->`) with one row per field and its type as `describe`
words it, and tests/formats/test_record_schema.py checks that the two agree.

A record is judged before anything compares it: a missing required field, a value of another
type, out of range (a negative count, a positive logprob) or not finite is a `RecordError`
naming the field's path, what was expected and what arrived. Fields a record's table does not
name are ignored, as PROTOCOL.md says of every message: `check_record` returns the record
without them, so they are never compared (a golden is held to more: `strict`, every field
named, so the tables cannot fall behind what the oracle records).

Standard library only: the vLLM worker may import it in each pin's own environment.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cached_property

# Integers a port's JSON library holds exactly (conformance/formats/protocol.py decodes no other).
MIN_INT, MAX_INT = -(2 ** 63), 2 ** 64 - 1
SHOWN = 60  # characters of a value shown in an error


class RecordError(ValueError):
    """A value that is not what its field declares. `path` names the field within the record;
    the path is built as the error leaves each object and list (`within`), never on the way in."""

    def __init__(self, expected: str, got: object, parts: tuple = ()):
        self.expected, self.got, self.parts = expected, got, parts
        super().__init__(expected, parts)

    def within(self, part: str | int) -> "RecordError":
        return RecordError(self.expected, self.got, (part, *self.parts))

    @property
    def path(self) -> str:
        out = ""
        for part in self.parts:
            if isinstance(part, int):
                out += f"[{part}]"
            else:
                name = part if _PLAIN_KEY.fullmatch(part) else quoted(part)
                out += f".{name}" if out else name
        return out

    def __str__(self) -> str:
        return f"field {self.path or '<record>'}: expected {self.expected}, got {shown(self.got)}"


# a key shown as it is in a path; any other (an engine's own request id, say) as a JSON string
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.=/-]{1,40}")


def shown(value: object) -> str:
    """A value as an error shows it: `quoted`, and what JSON type it is."""
    if value is _ABSENT:
        return "nothing (the field is missing)"
    return f"{quoted(value)} ({_kind(value)})"


def quoted(value: object) -> str:
    """JSON text, ASCII only (control characters and markup stay escaped in every report), cut
    to SHOWN characters; never more of the value is encoded than is shown."""
    if isinstance(value, str):
        text = json.dumps(value[:SHOWN], ensure_ascii=True)
        return text if len(value) <= SHOWN else f"{text[:SHOWN - 15]}... ({len(value)} characters)"
    chunks, size = [], 0
    try:
        for chunk in json.JSONEncoder(ensure_ascii=True, allow_nan=True).iterencode(value):
            chunks.append(chunk)
            size += len(chunk)
            if size > SHOWN:
                break
    except (TypeError, ValueError, RecursionError):
        return type(value).__name__
    text = "".join(chunks)
    return text if size <= SHOWN else f"{text[:SHOWN - 15]}... (cut)"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a number" if math.isfinite(value) else "a non-finite number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


_ABSENT = object()


# -- the types a field may have ---------------------------------------------------------------

@dataclass(frozen=True)
class Int:
    minimum: int | None = 0

    def describe(self) -> str:
        return "int" if self.minimum is None else f"int >= {self.minimum}"

    def check(self, value, strict: bool = False):
        low = MIN_INT if self.minimum is None else self.minimum
        if value.__class__ is not int or not low <= value <= MAX_INT:  # a bool is not an int
            raise RecordError(self.describe(), value)
        return value


@dataclass(frozen=True)
class Number:
    minimum: float | None = None
    maximum: float | None = None

    def describe(self) -> str:
        bounds = [f">= {self.minimum:g}"] if self.minimum is not None else []
        bounds += [f"<= {self.maximum:g}"] if self.maximum is not None else []
        return " ".join(["number", *bounds])

    def check(self, value, strict: bool = False):
        if (value.__class__ not in (int, float) or not math.isfinite(value)
                or (self.minimum is not None and value < self.minimum)
                or (self.maximum is not None and value > self.maximum)):
            raise RecordError(self.describe(), value)
        return value


@dataclass(frozen=True)
class Text:
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        return " or ".join(f'"{c}"' for c in self.choices) if self.choices else "str"

    def check(self, value, strict: bool = False):
        if value.__class__ is not str or (self.choices and value not in self.choices):
            raise RecordError(self.describe(), value)
        return value


@dataclass(frozen=True)
class Exactly:
    """A value of exactly one class (JSON's true/false, or null)."""

    name: str
    kind: type

    def describe(self) -> str:
        return self.name

    def check(self, value, strict: bool = False):
        if value.__class__ is not self.kind:
            raise RecordError(self.describe(), value)
        return value


def Flag() -> Exactly:  # noqa: N802 - a kind of field, named as the other kinds are
    return Exactly("bool", bool)


def Null() -> Exactly:  # noqa: N802
    return Exactly("null", type(None))


@dataclass(frozen=True)
class _Two:
    """A kind made of two kinds: Either's alternatives, Pair's positions."""

    first: object
    second: object


class Either(_Two):
    """A value of one kind or another (a stop token, or vLLM's string for a repetition stop)."""

    def describe(self) -> str:
        return f"{self.first.describe()} or {self.second.describe()}"

    def check(self, value, strict: bool = False):
        try:
            return self.first.check(value, strict)
        except RecordError as exc:
            first = exc
        try:
            return self.second.check(value, strict)
        except RecordError:
            if first.parts:  # a field inside a value of the first kind: that error says more
                raise first from None
            raise RecordError(self.describe(), value) from None


def Nullable(of) -> Either:  # noqa: N802 - a kind of field, named as the other kinds are
    return Either(of, Null())


# Fields named *_text are an engine's wording (Field.informational); a request id never ends so,
# so no report can mistake a request for wording, nor wording for a request
INFORMATIONAL_SUFFIX = "_text"


@dataclass(frozen=True)
class RequestId:
    """A request's id: a string that does not end in the informational suffix."""

    def describe(self) -> str:
        return "str"

    def check(self, value, strict: bool = False):
        if value.__class__ is not str:
            raise RecordError(self.describe(), value)
        if value.endswith(INFORMATIONAL_SUFFIX):
            raise RecordError(f"a request id not ending in {INFORMATIONAL_SUFFIX!r} (the suffix of "
                              "informational fields)", value)
        return value


@dataclass(frozen=True)
class ListOf:
    of: object

    def describe(self) -> str:
        return f"list of {self.of.describe()}"

    def check(self, value, strict: bool = False):
        if value.__class__ is not list:
            raise RecordError(self.describe(), value)
        return _each(self.of.check, enumerate(value), strict)


class Pair(_Two):
    """A list of two values, each of its own kind (a token and its logprob)."""

    def describe(self) -> str:
        return f"[{self.first.describe()}, {self.second.describe()}]"

    def check(self, value, strict: bool = False):
        if value.__class__ is not list or len(value) != 2:
            raise RecordError(self.describe(), value)
        return [_each(kind.check, [(i, value[i])], strict)[0] for i, kind in enumerate((self.first, self.second))]


@dataclass(frozen=True)
class MapOf:
    """An object whose keys are names the engine chose (request ids, argument names)."""

    key: str
    of: object
    keys: object = None  # the kind each key must be, where the key is data (a request id)

    def describe(self) -> str:
        return f"object: {self.key} -> {self.of.describe()}"

    def check(self, value, strict: bool = False):
        if value.__class__ is not dict:
            raise RecordError(self.describe(), value)
        if self.keys is not None:
            _each(self.keys.check, ((key, key) for key in value), strict)
        return dict(zip(value, _each(self.of.check, value.items(), strict)))


@dataclass(frozen=True)
class Tagged:
    """An object whose `type` names which record it is (a KV cache event)."""

    name: str
    records: tuple  # the Records, each with a `type` field of one choice

    def describe(self) -> str:
        return self.name

    def check(self, value, strict: bool = False):
        kinds = {r.own["type"].type.choices[0]: r for r in self.records}
        if value.__class__ is not dict or value.get("type") not in kinds:
            raise RecordError(f"an object ({self.name}) whose type is one of {', '.join(kinds)}", value)
        return kinds[value["type"]].check(value, strict)


@dataclass(frozen=True)
class Key:
    """A part of a block hash's extra keys (vLLM's tuples, as lists): a string, an int, null,
    or a list of them, nested at most `depth` deep."""

    depth: int = 3

    def describe(self) -> str:
        return "extra key"

    def check(self, value, strict: bool = False):
        if value is None or value.__class__ is str or (value.__class__ is int and MIN_INT <= value <= MAX_INT):
            return value
        if value.__class__ is list and self.depth > 0:
            return _each(Key(self.depth - 1).check, enumerate(value), strict)
        raise RecordError("a string, an int, null or a list of them (an extra key)", value)


def _each(check, items, strict: bool) -> list:
    """`check` of each (position, value) of a list or an object; an error names the position."""
    out = []
    for at, item in items:
        try:
            out.append(check(item, strict))
        except RecordError as exc:
            raise exc.within(at) from None
    return out


@dataclass(frozen=True)
class Field:
    type: object
    optional: bool = False
    # an engine's own wording (a refusal's message): shown in reports, never compared, because
    # parity is about what an engine decides, not how it phrases it. Only fields declared so are
    # skipped, and only where they are declared (never by a name's shape: a request id is data)
    informational: bool = False

    def describe(self) -> str:
        return self.type.describe() + (", optional" if self.optional else "")


@dataclass(frozen=True)
class Record:
    """An object with named fields: a record, or an object inside one. With a `base`, every
    field of the base too (PROTOCOL.md's table lists only the fields this one adds or changes)."""

    name: str
    own: dict[str, Field]
    base: "Record | None" = None

    @cached_property
    def fields(self) -> dict[str, Field]:
        return {**(self.base.fields if self.base else {}), **self.own}

    def describe(self) -> str:
        return self.name

    def check(self, value, strict: bool = False):
        if value.__class__ is not dict:
            raise RecordError(f"an object ({self.name})", value)
        fields = self.fields
        if strict:
            unknown = sorted(k for k in value if k not in fields)
            if unknown:
                raise RecordError(f"no such field (the {self.name} table names {', '.join(fields)})",
                                  value[unknown[0]], (unknown[0],))
        out = {}
        for name, spec in fields.items():
            if name not in value:
                if not spec.optional:
                    kind = spec.type
                    raise RecordError(f"an object ({kind.name})" if isinstance(kind, Record)
                                      else kind.describe(), _ABSENT, (name,))
                continue
            try:
                out[name] = spec.type.check(value[name], strict)
            except RecordError as exc:
                raise exc.within(name) from None
        return out


# -- the records (PROTOCOL.md, "Layers and their records") ------------------------------------

COUNT = Int(0)
IDS = ListOf(RequestId())
REFUSAL = Record("refusal", {"type": Field(Text()), "message": Field(Text())})

# Async scheduling (protocol 3; engines/PROTOCOL.md "Async scheduling: the batch-queue loop"):
# the config record says how each platform resolves it; step records carry the loop's fields
# only where the GPU rule turns it on
ASYNC_LOG_LINES = Field(ListOf(Text()))
ASYNC_CONFIG = {
    "async_scheduling_gpu": Field(Flag()),
    "async_scheduling_cpu": Field(Flag()),
    "batch_queue_size": Field(Int(1)),
    "async_log_lines": ASYNC_LOG_LINES,
}
ASYNC_STEP = {"iteration": Field(COUNT, optional=True), "update_iteration": Field(COUNT, optional=True)}
ASYNC_REQUEST = {"output_placeholders": Field(COUNT, optional=True),
                 "delivery": Field(Text(("applied", "stale", "dropped")), optional=True)}

CONFIG = Record("config", {
    "refused": Field(Null()),
    "max_num_batched_tokens": Field(COUNT),
    "max_num_scheduled_tokens": Field(Nullable(COUNT)),
    "max_num_seqs": Field(COUNT),
    "num_speculative_tokens": Field(COUNT),
    "speculative_method": Field(Nullable(Text())),
    "parallel_drafting": Field(Flag()),
    "drafting_slots_per_request": Field(COUNT),
    "drafting_reservation": Field(Nullable(Text(("config", "per_step_input_budget")))),
    "num_lookahead_tokens": Field(Nullable(COUNT)),
    "block_size": Field(COUNT),
    "enable_prefix_caching": Field(Flag()),
    "enable_chunked_prefill": Field(Flag()),
    "scheduler_class": Field(Text()),
    "budget_log_lines": Field(ListOf(Text())),
    **ASYNC_CONFIG,
    # a multimodal model: the scheduler's encoder compute budget per step and encoder cache size
    # (tokens), as the release computes them from the model's processor (MultiModalBudget)
    "encoder_compute_budget": Field(COUNT, optional=True),
    "encoder_cache_size": Field(COUNT, optional=True),
})
REFUSED_CONFIG = Record("refused config", {
    "refused": Field(REFUSAL),
    "budget_log_lines": Field(ListOf(Text())),
    "async_log_lines": ASYNC_LOG_LINES,
})
# steps, outputs and the engine layers of a refused configuration: one record each
REFUSED = Record("refused", {"refused": Field(REFUSAL)})

REQUEST = Record("request entry", {
    "tokens": Field(COUNT),
    "draft_tokens": Field(COUNT),
    "accepted_draft_tokens": Field(COUNT),
    "computed_tokens": Field(COUNT),
    "output_tokens": Field(COUNT),
    "kv_blocks": Field(COUNT),
    **ASYNC_REQUEST,
})
# block ids per KV cache group, or null (a running request given no block this step); the
# protocol's limits on a line and a run bound their size
BLOCK_IDS = Nullable(ListOf(ListOf(COUNT)))
# what a `steps` request entry adds: identities (engine_steps records do not carry them)
STEPS_REQUEST = Record("steps request entry", {
    "block_ids": Field(BLOCK_IDS),
    "cached_tokens": Field(COUNT),
    "draft_token_ids": Field(ListOf(Int(-1))),  # -1: a placeholder draft
    "resent_token_ids": Field(Flag()),
    "next_draft_token_ids": Field(ListOf(COUNT)),
    # a request with a grammar (structured outputs): the drafts proposed, before the grammar's cut
    "proposed_draft_token_ids": Field(ListOf(COUNT), optional=True),
    # grammars under async scheduling: the drafts the step's bitmask was computed over (a
    # deferred step's: cut by the grammar, padded with -1), and how many the grammar cut
    "bitmask_draft_token_ids": Field(ListOf(Int(-1)), optional=True),
    "invalid_draft_tokens": Field(COUNT, optional=True),
}, base=REQUEST)
# KV cache events (engines/PROTOCOL.md "KV cache events"): vLLM's, field for field, each block
# hash written as its number in the run (engines/vllm/kv_events.py)
HASHES = ListOf(COUNT)
BLOCK_STORED = Record("block stored event", {
    "type": Field(Text(("BlockStored",))),
    "block_hashes": Field(HASHES),
    "parent_block_hash": Field(Nullable(COUNT)),
    "token_ids": Field(ListOf(COUNT)),
    "block_size": Field(COUNT),
    "lora_id": Field(Nullable(COUNT)),
    "lora_name": Field(Nullable(Text())),
    "medium": Field(Nullable(Text())),
    "group_idx": Field(Nullable(COUNT)),
    "extra_keys": Field(Nullable(ListOf(Key()))),
    "kv_cache_spec_kind": Field(Nullable(Text())),
    "kv_cache_spec_sliding_window": Field(Nullable(COUNT)),
})
BLOCK_REMOVED = Record("block removed event", {
    "type": Field(Text(("BlockRemoved",))),
    "block_hashes": Field(HASHES),
    "medium": Field(Nullable(Text())),
    "group_idx": Field(Nullable(COUNT)),
})
ALL_CLEARED = Record("all blocks cleared event", {"type": Field(Text(("AllBlocksCleared",)))})
KV_EVENT = Tagged("kv cache event", (BLOCK_STORED, BLOCK_REMOVED, ALL_CLEARED))
ENCODER_CACHE = Record("encoder cache", {"free": Field(COUNT), "freeable": Field(COUNT)})
KV_BLOCKS = Record("kv blocks", {"free": Field(COUNT), "used": Field(COUNT), "cached": Field(COUNT)})
# the fields of every step record, steps and engine_steps alike
STEP_BASE = Record("step", {
    "step": Field(COUNT),
    "total_num_scheduled_tokens": Field(COUNT),
    "token_budget": Field(COUNT),
    "input_budget": Field(COUNT, optional=True),
    "drafting_slots_per_request": Field(COUNT, optional=True),
    "requests": Field(MapOf("request id", REQUEST, RequestId())),
    "new": Field(IDS),
    "resumed": Field(IDS),
    "preempted": Field(IDS),
    "finished": Field(IDS),
    "waiting": Field(IDS),
    "running": Field(IDS),
    **ASYNC_STEP,
})
STEP = Record("steps", {
    "requests": Field(MapOf("request id", STEPS_REQUEST, RequestId())),
    "kv_blocks": Field(KV_BLOCKS),
    "aborted": Field(IDS),
    "emitted": Field(IDS),
    "num_common_prefix_blocks": Field(ListOf(COUNT)),
    # a workload with grammars: the requests whose grammar failed at this step
    "grammar_errors": Field(IDS, optional=True),
    # a workload with encoder inputs: the items whose encoder runs (indices in the request's
    # encoder_inputs), the hashes evicted from the encoder cache, the cache's slots after the update
    "encoder_inputs": Field(MapOf("request id", ListOf(COUNT), RequestId()), optional=True),
    "freed_encoder_inputs": Field(ListOf(RequestId()), optional=True),
    "encoder_cache": Field(ENCODER_CACHE, optional=True),
    # grammars under async scheduling: sampling waited for the update of the batch before
    "deferred_sampling": Field(Flag(), optional=True),
    # a KV cache that needs zeroing (a hybrid mamba model): the blocks the model runner zeroes
    "zeroed_block_ids": Field(ListOf(COUNT), optional=True),
    # KV cache events on: the events published at this step's update
    "kv_events": Field(ListOf(KV_EVENT), optional=True),
    # a workload with prefix-cache resets: the result of the reset before this step's schedule
    "prefix_cache_reset": Field(Nullable(Flag()), optional=True),
}, base=STEP_BASE)
ENGINE_KV_BLOCKS = Record("engine kv blocks", {"free": Field(COUNT, optional=True), "used": Field(COUNT)})
ENGINE_STEP = Record("engine_steps", {
    "kv_blocks": Field(ENGINE_KV_BLOCKS),
    "target_forward_tokens": Field(ListOf(COUNT)),
    "drafter_forward_tokens": Field(ListOf(COUNT)),
    "max_num_batched_tokens": Field(COUNT),
}, base=STEP_BASE)

# the fields of every output record, outputs and engine_outputs alike
OUTPUT_BASE = Record("output", {
    "id": Field(RequestId()),
    "output_token_ids": Field(ListOf(COUNT)),
})
OUTPUT = Record("outputs", {
    "finish_reason": Field(Text(("length", "stop", "abort", "repetition", "error"))),
    # the stop token, or vLLM's string for a repetition stop (Request.stop_reason, as clients get it)
    "stop_reason": Field(Nullable(Either(COUNT, Text(("repetition_detected",))))),
}, base=OUTPUT_BASE)
ENGINE_OUTPUT = Record("engine_outputs", {
    "finish_reason": Field(Text(("length", "stop"))),
    "logprobs": Field(ListOf(ListOf(Pair(COUNT, Number(maximum=0))))),
}, base=OUTPUT_BASE)

REFUSAL_WORDS = Nullable(Text())
WORDING = Field(REFUSAL_WORDS, informational=True)  # vLLM's own message: shown, never compared
METHOD_ROW = Record("methods row", {
    "row": Field(Text()),
    "method": Field(Text()),
    "k": Field(COUNT),
    "constructible": Field(Flag()),
    "parallel_drafting": Field(Nullable(Flag())),
    "drafting_slots_per_request": Field(Nullable(COUNT)),
    "num_lookahead_tokens": Field(Nullable(COUNT)),
    "max_num_scheduled_tokens": Field(Nullable(COUNT)),
    "per_step_input_budget": Field(Nullable(COUNT)),
    "refusal_kind": Field(REFUSAL_WORDS),
    "refused_by": Field(REFUSAL_WORDS),
    "refusal_text": WORDING,
})
METHOD_PROBE = Record("methods probe", {
    "row": Field(Text()),
    "probe": Field(Text(("below", "at", "above"))),
    "max_num_batched_tokens": Field(COUNT),
    "reservation": Field(COUNT),
    "adjusted": Field(MapOf("argument", Int(None))),
    "refused": Field(Flag()),
    "refusal_kind": Field(REFUSAL_WORDS),
    "refused_by": Field(REFUSAL_WORDS),
    "refusal_text": WORDING,
})


@dataclass(frozen=True)
class Layer:
    """A layer's records: `record`, or the variant whose key the record holds, not null (a
    refused configuration's record, a methods probe)."""

    record: Record
    variants: tuple[tuple[str, Record], ...] = field(default=())

    def shape(self, record) -> Record:
        if isinstance(record, dict):
            for key, variant in self.variants:
                if record.get(key) is not None:
                    return variant
        return self.record


LAYERS: dict[str, Layer] = {
    "config": Layer(CONFIG, (("refused", REFUSED_CONFIG),)),
    "steps": Layer(STEP, (("refused", REFUSED),)),
    "outputs": Layer(OUTPUT, (("refused", REFUSED),)),
    "methods": Layer(METHOD_ROW, (("probe", METHOD_PROBE),)),
    "engine_config": Layer(CONFIG, (("refused", REFUSED_CONFIG),)),
    "engine_steps": Layer(ENGINE_STEP, (("refused", REFUSED),)),
    "engine_outputs": Layer(ENGINE_OUTPUT, (("refused", REFUSED),)),
}
# Every record and object with a table in PROTOCOL.md
RECORDS = (REFUSAL, CONFIG, REFUSED_CONFIG, REFUSED, STEP_BASE, STEP, REQUEST, STEPS_REQUEST, KV_BLOCKS, ENCODER_CACHE,
           ENGINE_STEP, ENGINE_KV_BLOCKS, OUTPUT_BASE, OUTPUT, ENGINE_OUTPUT, METHOD_ROW, METHOD_PROBE,
           BLOCK_STORED, BLOCK_REMOVED, ALL_CLEARED)


def check_record(layer: str, record, strict: bool = False) -> dict:
    """The record as its layer declares it, without the fields no table names (with `strict`,
    such a field is an error too); RecordError when it is not."""
    if layer not in LAYERS:
        raise RecordError(f"a record of a protocol layer ({', '.join(LAYERS)})", layer)
    return LAYERS[layer].shape(record).check(record, strict)


def without_informational(layer: str, record):
    """The record without the fields its layer's schema declares informational, at the places
    it declares them; every other key, at every depth, is kept (and so compared)."""
    if layer not in LAYERS:
        return record
    shape = LAYERS[layer].shape(record)
    if not _holds_informational(shape):  # most records (every steps and outputs one): as they are
        return record
    return _without_informational(shape, record)


_HOLDS: dict[int, bool] = {}  # id of a kind -> whether an informational field is anywhere in it


def _holds_informational(kind) -> bool:
    if id(kind) not in _HOLDS:
        if isinstance(kind, Record):
            holds = any(f.informational or _holds_informational(f.type) for f in kind.fields.values())
        elif isinstance(kind, (ListOf, MapOf)):
            holds = _holds_informational(kind.of)
        elif isinstance(kind, _Two):
            holds = _holds_informational(kind.first) or _holds_informational(kind.second)
        else:
            holds = False
        _HOLDS[id(kind)] = holds
    return _HOLDS[id(kind)]


def _without_informational(kind, value):
    if isinstance(kind, Record) and isinstance(value, dict):
        fields = kind.fields
        return {k: _without_informational(fields[k].type, v) if k in fields else v
                for k, v in value.items() if not (k in fields and fields[k].informational)}
    if isinstance(kind, MapOf) and isinstance(value, dict):
        return {k: _without_informational(kind.of, v) for k, v in value.items()}
    if isinstance(kind, ListOf) and isinstance(value, list):
        return [_without_informational(kind.of, v) for v in value]
    if isinstance(kind, Pair) and isinstance(value, list) and len(value) == 2:
        return [_without_informational(kind.first, value[0]), _without_informational(kind.second, value[1])]
    if isinstance(kind, Either):
        try:
            kind.first.check(value)
        except RecordError:
            return _without_informational(kind.second, value)
        return _without_informational(kind.first, value)
    return value


@dataclass(frozen=True)
class RecordProblem:
    """The first record of a trace that is not what its layer declares."""

    layer: str
    seq: int
    error: RecordError
    name: str = ""  # the record's step or row, where it has a readable one

    def __str__(self) -> str:
        return f"layer {self.layer}, record #{self.seq}{self.name}: {self.error}"


def check_layers(layers: dict, strict: bool = False) -> tuple[dict, RecordProblem | None]:
    """Every record of every layer checked, in the protocol's layer order. Returns the layers as
    declared (unknown fields left out) and the first problem, if any; the layers then hold only
    the records before it: the layers before its layer whole, its layer up to it."""
    order = sorted(layers, key=lambda name: list(LAYERS).index(name) if name in LAYERS else len(LAYERS))
    out: dict = {}
    for name in order:
        records = layers[name]
        if name not in LAYERS:
            return out, RecordProblem(name, 0, RecordError(f"a protocol layer ({', '.join(LAYERS)})", name))
        if not isinstance(records, list):
            return out, RecordProblem(name, 0, RecordError("a list of records", records))
        out[name] = []
        for seq, record in enumerate(records):
            try:
                out[name].append(check_record(name, record, strict))
            except RecordError as exc:
                return out, RecordProblem(name, seq, exc, _named(record))
    return out, None


def _named(record) -> str:
    """", step 3" / ", row pard/K=8" when the record names itself readably."""
    if not isinstance(record, dict):
        return ""
    step = record.get("step")
    if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_INT:
        return f" (step {step})"
    for key in ("row", "id"):
        if isinstance(record.get(key), str):
            return f" ({key} {quoted(record[key])})"
    return ""
