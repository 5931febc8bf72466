"""What `parity fuzz` generates: scenario files (the project's own schema) from hypothesis
strategies, over vLLM's engine arguments and the stand-in workload.

Every strategy shrinks toward the plainest scenario: an optional argument toward "not given"
(vLLM's default), a size toward its smallest value, a list toward fewer entries, a flag
toward off. So hypothesis' own shrinking ends at fewer requests, shorter prompts, fewer steps
and default arguments wherever the divergence allows.

What each pin accepts: the arguments below are the EngineArgs fields every pinned release
(0.27.1, 0.28.0, 0.33.0) knows. Values a release refuses (a budget below max_model_len with
chunked prefill off, a threshold above max_model_len, ...) are generated on purpose: the
refusal is a record of the config layer, and refusal parity is part of the contract.
`max_num_partial_prefills` is not generated: no pinned release has it any more (V0 only).
Shared prefixes, continued turns, aborts and, under the priority policy, per-request
priorities are drawn last, now and then, each only when its feature is allowed; after them
vLLM's other stops (an eos token, min_tokens, repetition detection), a KV connector with what
the remote store holds of each prompt, and a model mixing sliding-window and full attention
(models/gpt-oss-20b: one KV cache group per attention type), and LoRA adapters under max_loras.

Sizes stay small (max_model_len <= 512, at most MAX_REQUESTS requests) so one example runs in
tens of milliseconds on the stand-in layers.

Every space can be kept within the features a candidate declares (`allowed`, its hello's
features; None: every feature): an argument whose feature is not allowed is left at vLLM's
default or drawn from values that need none, and a speculative method only among those allowed
(conformance/formats/features.py). Without `allowed` the draws are those of before, so a seed
keeps its examples.

engine_scenarios() is the space of the engine layers (engine_config, engine_steps,
engine_outputs), where the oracle runs the release's whole engine: the project's tiny models
(scenarios/models/tiny-*, float32, the models the library's engine_*.json use), every
speculative method those scenarios use (ngram, a draft model, the target drafting for itself,
PARD, EAGLE-3, DFlash, MTP), and workloads of at most ENGINE_MAX_REQUESTS short requests (or
one ending exactly at max_model_len), so
one example is one tiny engine start and a few dozen steps (about a second). Acceptance is the
model's own there, so no acceptance scripts; stop ids are drawn from the tiny vocabulary.
"""

from __future__ import annotations

import functools

from hypothesis import strategies as st

from conformance.formats.features import SPEC as SPEC_FEATURE
from conformance.formats.features import needed
from conformance.formats.scenario import SCHEMA

MAX_REQUESTS = 6
MAX_ARRIVAL = 6
TARGET = "models/qwen3-27b"  # relative to scenarios/, like the library's own scenarios
# Speculative methods the stand-in drives, with the draft config folder each needs.
DRAFTERS = {
    "dflash": "models/dflash-27b-draft",
    "eagle3": "models/eagle3-27b-draft",
    "draft_model": "models/pard-qwen3-0.6b-draft",
    "ngram": None,
}
VOCABS = (64, 2, 16, 151936)  # small vocabularies make stop tokens appear

# Strategies are built once (building one costs more than drawing from it); a range that
# depends on an earlier draw comes from the cache.
ints = functools.lru_cache(maxsize=None)(st.integers)
FLAG = st.booleans()  # shrinks toward False
ON_FIRST = st.sampled_from([True, False])  # shrinks toward True


def optional(strategy):
    """None (the argument left out: vLLM's default) first, so shrinking goes there."""
    return st.one_of(st.none(), strategy)


NGRAM_MIN = st.integers(1, 3)


def allows(allowed, *features: str) -> bool:
    """Whether every one of `features` is allowed (None: every feature is)."""
    return allowed is None or all(name in allowed for name in features)


@st.composite
def speculative_configs(draw, methods=None):
    method = draw(METHOD if methods is None else st.sampled_from(methods))
    spec = {"method": method, "num_speculative_tokens": draw(ints(1, 8))}
    if DRAFTERS[method]:
        spec["model"] = DRAFTERS[method]
    if method == "ngram":
        low = draw(NGRAM_MIN)
        spec["prompt_lookup_min"], spec["prompt_lookup_max"] = low, draw(ints(low, 4))
    return spec


METHOD = st.sampled_from(list(DRAFTERS))
MAX_MODEL_LEN = st.one_of(st.integers(16, 128), st.sampled_from([256, 512]))
SMALL_BUDGET = st.integers(1, 64)
# Budgets around max_model_len (an offset from it): below it is refused without chunked prefill.
BUDGET_NEAR = st.sampled_from([0, 1, -1, 2048])
THRESHOLD = optional(st.one_of(st.integers(0, 64), st.sampled_from(["max", "max+1"])))
BLOCKS = optional(st.integers(1, 64))
POLICY = optional(st.sampled_from(["fcfs", "priority"]))
SCHEDULED = optional(st.integers(1, 256))
SPEC = optional(speculative_configs())


@functools.lru_cache(maxsize=None)
def _spec(methods: tuple[str, ...] | None):
    """SPEC, with only `methods` (None: all), or always None when no method is allowed."""
    if methods is None:
        return SPEC
    return optional(speculative_configs(methods)) if methods else st.none()


def _allowed_methods(allowed, methods) -> tuple[str, ...] | None:
    if allowed is None:
        return None
    return tuple(m for m in methods if allows(allowed, SPEC_FEATURE + m))


def _batched(draw, near: bool, max_model_len: int, small) -> int:
    """max_num_batched_tokens: around max_model_len (or 2048) when `near`, else drawn from `small`."""
    if near:
        offset = draw(BUDGET_NEAR)
        return offset if offset == 2048 else max_model_len + offset
    return draw(small)


def _scheduler_args(draw, allowed, batched: int, max_model_len: int, chunked: bool) -> dict:
    """The budget and cache arguments of both generators (drawn in the order they always were,
    so a seed finds what it found). Async scheduling off: scenarios() draws it last for the
    stand-in layers, and the engine layers on CPU cannot run it."""
    return {"max_num_batched_tokens": batched, "max_model_len": max_model_len, "block_size": 16,
            "enable_prefix_caching": _caching(draw, allowed),
            "enable_chunked_prefill": chunked, "async_scheduling": False}


def _caching(draw, allowed) -> bool:
    """Prefix caching on or off as the features allow: both where both are (drawn as always, so
    a seed keeps its examples), always on for an engine that cannot turn it off."""
    if allows(allowed, "prefix_caching"):
        return draw(FLAG) if allows(allowed, "prefix_caching_off") else True
    return False


def _stops_within(reqs: list[dict], allowed) -> list[dict]:
    """The requests without stop_token_ids where that feature is not allowed (drawn all the
    same, so a seed keeps its examples)."""
    if not allows(allowed, "stop_token_ids"):
        for req in reqs:
            req.pop("stop_token_ids", None)
    return reqs


@st.composite
def engine_args(draw, allowed=None) -> dict:
    max_model_len = draw(MAX_MODEL_LEN)
    chunked = draw(ON_FIRST) if allows(allowed, "chunked_prefill_off") else True
    # without chunking, mostly a budget that admits
    batched = _batched(draw, draw(FLAG if chunked else ON_FIRST), max_model_len, SMALL_BUDGET)
    args = {"model": TARGET, "load_format": "dummy", "max_num_seqs": draw(ints(1, 8)),
            **_scheduler_args(draw, allowed, batched, max_model_len, chunked)}
    threshold = draw(THRESHOLD) if allows(allowed, "long_prefill_threshold") else None
    if isinstance(threshold, str):
        threshold = max_model_len + (threshold == "max+1")
    extra = {
        "long_prefill_token_threshold": threshold,
        "num_gpu_blocks_override": draw(BLOCKS),
        "scheduling_policy": draw(POLICY) if allows(allowed, "priority_policy") else None,
        "max_num_scheduled_tokens": draw(SCHEDULED) if allows(allowed, "max_num_scheduled_tokens") else None,
        "speculative_config": draw(_spec(_allowed_methods(allowed, DRAFTERS))),
    }
    args.update({k: v for k, v in extra.items() if v is not None})
    return args


COUNT = st.integers(1, MAX_REQUESTS)
ARRIVAL = st.integers(0, MAX_ARRIVAL)


def request(draw, i: int, max_model_len: int, most_tokens: int, longest_short: int, arrival, stops) -> dict:
    """One request of a workload: a prompt that is short or ends exactly at max_model_len (where
    the budget and drafting limits bind), drawn in this order so a seed keeps its examples."""
    max_tokens = draw(ints(1, most_tokens))
    room = max_model_len - max_tokens
    prompt_len = room if draw(FLAG) else draw(ints(1, min(room, longest_short)))
    req = {"id": f"r{i}", "arrival_step": draw(arrival), "prompt_len": prompt_len, "max_tokens": max_tokens}
    stop_ids = draw(stops)
    if stop_ids:
        req["stop_token_ids"] = stop_ids
    return req


@st.composite
def requests(draw, max_model_len: int, k: int, vocab_size: int) -> list[dict]:
    out = []
    stops = st.lists(ints(0, min(vocab_size, 64) - 1), max_size=2, unique=True)
    acceptances = st.lists(ints(0, k + 1), min_size=1, max_size=3)
    for i in range(draw(COUNT)):
        req = request(draw, i, max_model_len, min(24, max_model_len - 1), 96, ARRIVAL, stops)
        if k:
            acceptance = draw(acceptances)
            if acceptance != [0]:
                req["acceptance"] = acceptance
        out.append(req)
    return out


VOCAB = st.sampled_from(VOCABS)
SEED = st.integers(0, 1000)


@st.composite
def scenarios(draw, name: str = "fuzz", allowed=None) -> dict:
    """A raw scenario (what a scenario file holds), valid under conformance/formats/scenario.py;
    needing only `allowed` features (None: any)."""
    args = draw(engine_args(allowed))
    vocab_size = draw(VOCAB)
    k = (args.get("speculative_config") or {}).get("num_speculative_tokens", 0)
    reqs = _stops_within(draw(requests(args["max_model_len"], k, vocab_size)), allowed)
    workload = {"seed": draw(SEED), "vocab_size": vocab_size, "requests": reqs}
    # drawn last, so a seed keeps the examples it had before these existed
    prefixes = draw(sharing(reqs, args["max_model_len"], allowed))
    if prefixes:
        workload["prefixes"] = prefixes
    draw(aborts(reqs, allowed))
    workload["max_steps"] = max_steps(reqs, prefixes)
    args["async_scheduling"] = draw(_async(allowed))  # drawn last too: a seed keeps its examples
    draw(families(args, reqs, vocab_size, allowed))
    return {"schema": SCHEMA, "name": name, "description": "", "engine_args": args,
            "workload": workload}


@st.composite
def families(draw, args: dict, reqs: list[dict], vocab_size: int, allowed) -> None:
    """The families both spaces draw after every other draw (a seed keeps the examples it had
    before each existed), each now and then and only where its feature is allowed: request
    priorities, vLLM's other stops, a KV connector, a hybrid model, LoRA adapters. Edits `args` and
    `reqs`."""
    draw(priorities(reqs, args, allowed))
    draw(stop_conditions(reqs, vocab_size, allowed))
    draw(remote_kv(args, reqs, allowed))
    draw(hybrid_model(args, allowed))
    draw(adapters(args, reqs, allowed))


# async scheduling: off (shrinking goes there), on, or vLLM's default for the configuration (the
# GPU rule the steps layer runs: on for EAGLE-type drafters, off for some others, per release)
ASYNC = st.sampled_from([False, True, None])


def _async(allowed):
    """ASYNC, or always False for a candidate that does not declare async scheduling (a null one
    resolves on for some configurations, which the candidate's features cannot be checked against
    before the oracle's config record exists)."""
    return ASYNC if allows(allowed, "async_scheduling") else st.just(False)


PREFIX_LEN = st.integers(1, 96)
PREFIX_USE = st.sampled_from([None, "p0", "p1", "continues"])  # shrinks toward no sharing
ABORT_AFTER = st.integers(0, 40)


@st.composite
def sharing(draw, reqs: list[dict], max_model_len: int, allowed) -> list[dict]:
    """Now and then, named shared prefixes used by some requests, or a request that continues
    an earlier one (a multi-turn chat), so requests hit each other's cached blocks. A request
    keeps its own tokens only as far as max_model_len leaves room. Edits `reqs`; returns the
    prefixes used."""
    if not allows(allowed, "shared_prefixes") or not draw(FLAG):
        return []
    lengths = {"p0": draw(PREFIX_LEN), "p1": draw(PREFIX_LEN)}
    total: dict[str, int] = {}  # request id -> its prompt's length at most, outputs of a turn included
    used = set()
    for i, req in enumerate(reqs):
        use = draw(PREFIX_USE)
        base = 0
        if use in lengths:
            base = lengths[use]
        elif use == "continues" and i > 0:
            earlier = reqs[draw(ints(0, i - 1))]
            base = total[earlier["id"]] + earlier["max_tokens"]
        room = max_model_len - req["max_tokens"] - base
        if base and room >= 0:
            if use in lengths:
                req["prefix"] = use
                used.add(use)
            else:
                req["continues"] = earlier["id"]
            req["prompt_len"] = min(req["prompt_len"], room)
        total[req["id"]] = (base if "prefix" in req or "continues" in req else 0) + req["prompt_len"]
    return [{"name": name, "len": n} for name, n in lengths.items() if name in used]


@st.composite
def aborts(draw, reqs: list[dict], allowed) -> None:
    """Now and then, a client abort of a request at a step from its arrival to 40 steps later
    (waiting, running or preempted by then). A request another continues is never aborted: its
    output makes the other's prompt. Edits `reqs`."""
    if not allows(allowed, "aborts") or not draw(FLAG):
        return
    continued = {req["continues"] for req in reqs if "continues" in req}
    for req in reqs:
        if draw(FLAG) and req["id"] not in continued:
            req["abort_step"] = req["arrival_step"] + draw(ABORT_AFTER)


PRIORITY = st.integers(0, 7)  # vLLM schedules the lowest first; shrinks toward 0, no priority


@st.composite
def priorities(draw, reqs: list[dict], args: dict, allowed) -> None:
    """Now and then, under the priority policy, a priority for each request, so the waiting
    queue is a heap that arrival order does not sort (an abort then removes from its middle).
    Edits `reqs`."""
    if args.get("scheduling_policy") != "priority" or not allows(allowed, "request_priorities") or not draw(FLAG):
        return
    for req in reqs:
        priority = draw(PRIORITY)
        if priority:
            req["priority"] = priority


@st.composite
def repetition(draw) -> dict:
    """vLLM's RepetitionDetectionParams, switched on: patterns of 1 to 4 tokens seen 2 to 4 times."""
    largest = draw(ints(1, 4))
    return {"max_pattern_size": largest, "min_pattern_size": draw(ints(0, largest)), "min_count": draw(ints(2, 4))}


REPETITION = repetition()
STOPS = ("eos", "min_tokens", "repetition_detection")


@st.composite
def stop_conditions(draw, reqs: list[dict], vocab_size: int, allowed, kinds=STOPS) -> None:
    """Now and then, vLLM's other stops (`kinds` of them) on some requests: an eos token among
    the first 64 ids (so it comes up), min_tokens up to max_tokens (never on a request another
    continues: where a stop comes before min_tokens, releases differ in the output a prompt
    would hold), and repetition detection. Each only when its feature is allowed. Edits `reqs`."""
    kinds = [kind for kind in kinds if allows(allowed, kind)]
    if not kinds or not draw(FLAG):
        return
    continued = {req["continues"] for req in reqs if "continues" in req}
    for req in reqs:
        if "eos" in kinds and draw(FLAG):
            req["eos_token_id"] = draw(ints(0, min(vocab_size, 64) - 1))
        if "min_tokens" in kinds and req["id"] not in continued and draw(FLAG):
            req["min_tokens"] = draw(ints(1, req["max_tokens"]))
        if "repetition_detection" in kinds and draw(FLAG):
            req["repetition_detection"] = draw(REPETITION)


KV_ROLE = st.sampled_from(["kv_both", "kv_consumer"])
KV_POLICY = optional(st.sampled_from(["recompute", "fail"]))  # not given: vLLM's default, fail
ASYNC_STEPS = optional(ints(0, 3))  # not given: loaded synchronously


@st.composite
def remote_kv(draw, args: dict, reqs: list[dict], allowed) -> None:
    """Now and then, a KV connector (the stand-in's remote store, engines/vllm/kv_connector.py)
    and, for some requests, the first tokens of its prompt held there, loaded synchronously or
    some steps later, the load failing now and then; under either loop, without speculative
    decoding (a drafter's slots beside remote loads: no scenario of the library runs that).
    Edits `args` and `reqs`."""
    if "speculative_config" in args or not allows(allowed, "kv_connector") or not draw(FLAG):
        return
    config = {"kv_connector": "StandInConnector", "kv_role": draw(KV_ROLE)}
    policy = draw(KV_POLICY)
    if policy:
        config["kv_load_failure_policy"] = policy
    args["kv_transfer_config"] = config
    for req in reqs:
        if draw(FLAG):
            external = {"tokens": draw(ints(1, args["max_model_len"]))}  # the connector keeps one token to compute
            steps = draw(ASYNC_STEPS)
            if steps is not None:
                external["async_steps"] = steps
            if draw(FLAG):
                external["fail"] = True
            req["external"] = external


HYBRID = "models/gpt-oss-20b"  # sliding-window and full attention layers: two KV cache groups


@st.composite
def hybrid_model(draw, args: dict, allowed) -> None:
    """Now and then, the target is a model mixing sliding-window and full attention layers, so
    the KV cache manager runs one group per attention type. Not with a drafter (drafted for the
    Qwen3 target) or a KV connector. Edits `args`."""
    if "speculative_config" in args or "kv_transfer_config" in args \
            or not allows(allowed, "sliding_window") or not draw(FLAG):
        return
    args["model"] = HYBRID


def max_steps(reqs: list[dict], prefixes: list[dict] = ()) -> int:
    """Room for every request to finish one token per step after the last arrival, with
    preemption's recomputation: a workload that cannot finish (a prompt larger than the KV
    cache) ends at this cap on both sides instead of running long. Above every abort step."""
    shared = {p["name"]: p["len"] for p in prefixes}
    total = sum(r["prompt_len"] + r["max_tokens"] + shared.get(r.get("prefix"), 0) for r in reqs)
    total += sum(r["prompt_len"] + 2 * r["max_tokens"] for r in reqs if "continues" in r)  # a turn's chat so far, roughly
    last = max(max(r["arrival_step"], r.get("abort_step", 0)) for r in reqs)
    return min(last + 2 * total + 16, 4000)


# -- the engine layers -------------------------------------------------------------------

ENGINE_MAX_REQUESTS = 3
ENGINE_TARGET = "models/tiny-qwen3"
ENGINE_VOCAB = 2048  # every tiny model's vocabulary
# (method, target, drafter config): the speculative setups of the library's engine scenarios
ENGINE_SPECS = {
    "ngram": (ENGINE_TARGET, {"method": "ngram"}),
    "draft_model": (ENGINE_TARGET, {"method": "draft_model", "model": "models/tiny-qwen3-draft"}),
    "self": (ENGINE_TARGET, {"method": "draft_model", "model": ENGINE_TARGET}),  # every draft accepted
    "pard": (ENGINE_TARGET, {"method": "draft_model", "model": "models/tiny-pard", "parallel_drafting": True}),
    "eagle3": (ENGINE_TARGET, {"method": "eagle3", "model": "models/tiny-eagle3"}),
    "dflash": (ENGINE_TARGET, {"method": "dflash", "model": "models/tiny-dflash"}),
    "mtp": ("models/tiny-mimo", {"method": "mtp"}),
}
ENGINE_SPEC = optional(st.sampled_from(list(ENGINE_SPECS)))
ENGINE_MAX_MODEL_LEN = st.sampled_from([64, 32, 128, 256])
ENGINE_BLOCKS = optional(st.integers(2, 24))
ENGINE_THRESHOLD = optional(st.integers(1, 64))


@functools.lru_cache(maxsize=None)
def _engine_spec(setups: tuple[str, ...] | None):
    """ENGINE_SPEC, with only `setups` (None: all)."""
    return ENGINE_SPEC if setups is None else optional(st.sampled_from(setups)) if setups else st.none()


def _allowed_setups(allowed) -> tuple[str, ...] | None:
    if allowed is None:
        return None
    return tuple(name for name, (_, spec) in ENGINE_SPECS.items() if allows(allowed, *needed({
        "enable_prefix_caching": False, "speculative_config": spec})))


@st.composite
def engine_args_for_engine(draw, allowed=None) -> dict:
    setup = draw(_engine_spec(_allowed_setups(allowed)))
    target, spec = ENGINE_SPECS[setup] if setup else (ENGINE_TARGET, None)
    max_model_len = draw(ENGINE_MAX_MODEL_LEN)
    chunked = draw(ON_FIRST) if allows(allowed, "chunked_prefill_off") else True
    batched = _batched(draw, draw(ON_FIRST), max_model_len, ints(8, 64))  # around max_model_len, or small
    args = {"model": target, "load_format": "dummy", "dtype": "float32", "seed": 0,
            "max_num_seqs": draw(ints(1, 4)), **_scheduler_args(draw, allowed, batched, max_model_len, chunked)}
    if spec is not None:
        spec = dict(spec, num_speculative_tokens=draw(ints(1, 4)))
        if spec["method"] == "ngram":
            low = draw(NGRAM_MIN)
            spec["prompt_lookup_min"], spec["prompt_lookup_max"] = low, draw(ints(low, 4))
        if spec["method"] == "mtp":
            spec["num_speculative_tokens"] = 1  # the tiny MiMo has one MTP layer
    extra = {"num_gpu_blocks_override": draw(ENGINE_BLOCKS),
             "long_prefill_token_threshold": draw(ENGINE_THRESHOLD)
             if allows(allowed, "long_prefill_threshold") else None,
             "scheduling_policy": draw(POLICY) if allows(allowed, "priority_policy") else None,
             "speculative_config": spec}
    args.update({k: v for k, v in extra.items() if v is not None})
    return args


ENGINE_COUNT = st.integers(1, ENGINE_MAX_REQUESTS)
ENGINE_ARRIVAL = st.integers(0, 3)
ENGINE_STOPS = st.lists(st.integers(0, ENGINE_VOCAB - 1), max_size=1)


@st.composite
def engine_scenarios(draw, name: str = "fuzz", allowed=None) -> dict:
    """A raw scenario with an `engine` block: the engine layers run the whole engine on it;
    needing only `allowed` features (None: any)."""
    args = draw(engine_args_for_engine(allowed))
    max_model_len = args["max_model_len"]
    reqs = []
    for i in range(draw(ENGINE_COUNT)):
        reqs.append(request(draw, i, max_model_len, 16, 64, ENGINE_ARRIVAL, ENGINE_STOPS))
    _stops_within(reqs, allowed)
    workload = {"seed": draw(SEED), "vocab_size": ENGINE_VOCAB, "max_steps": max_steps(reqs),
                "requests": reqs}
    # drawn last, so a seed keeps its examples: min_tokens, which the engine's sampler honours by
    # masking the stop ids until then (eos and repetition detection are the stand-in's only)
    draw(stop_conditions(reqs, ENGINE_VOCAB, allowed, kinds=("min_tokens",)))
    return {"schema": SCHEMA, "name": name, "description": "", "engine_args": args,
            "workload": workload, "engine": {"logprobs": 5}}


# -- production shapes (issue 26) -------------------------------------------------------

PRODUCTION_DRAFTERS = {"dflash": DRAFTERS["dflash"], "eagle3": DRAFTERS["eagle3"],
                       "draft_model": DRAFTERS["draft_model"]}
PRODUCTION_SPEC = optional(st.sampled_from(list(PRODUCTION_DRAFTERS)))
PRODUCTION_K = st.sampled_from([4, 8, 16])
PRODUCTION_BUDGET = st.sampled_from([8192, 10112, 16384])
PRODUCTION_SEQS = st.sampled_from([32, 64, 128, 256])
PRODUCTION_MAX_MODEL_LEN = 20480  # 16k prompts plus their outputs
LONG_PROMPT = (8192, 16384)


@st.composite
def production_scenarios(draw, name: str = "fuzz", allowed=None) -> dict:
    """A raw scenario at production shapes, its workload expanded by the library's own generator
    (conformance/formats/workload_gen.py) from drawn parameters: a budget of 8192 tokens or
    more, 64 to 256 requests arriving in bursts, log-normal prompts and short outputs (an example
    stays seconds of stand-in work a side), and, when `long_prompt` is drawn, one request whose
    prompt is 8k to 16k tokens; async scheduling off, on or vLLM's default, and now and then
    shared prefixes and aborts. Needing only `allowed` features (None: any). It is a full-form
    scenario (a `workload`, not `generate`): a fuzz example's traces are held and judged whole."""
    from conformance.formats.workload_gen import VERSION, expand

    seqs, budget = draw(PRODUCTION_SEQS), draw(PRODUCTION_BUDGET)
    args = {"model": TARGET, "load_format": "dummy", "max_num_seqs": seqs, "max_num_batched_tokens": budget,
            "max_model_len": PRODUCTION_MAX_MODEL_LEN, "block_size": 16,
            "enable_prefix_caching": _caching(draw, allowed),
            "enable_chunked_prefill": True, "async_scheduling": False}
    method = draw(_production_spec(_allowed_methods(allowed, PRODUCTION_DRAFTERS)))
    k = draw(PRODUCTION_K) if method else 0
    if method:
        args["speculative_config"] = {"method": method, "num_speculative_tokens": k,
                                      "model": PRODUCTION_DRAFTERS[method]}
    count = draw(ints(64, 256))
    bursts = draw(st.lists(st.tuples(ints(0, 200), ints(1, 40)), min_size=1, max_size=3))
    per, rest = divmod(count, len(bursts))
    group = {"name": "r",
             "arrivals": {"bursts": [[first, span, per + (i < rest)] for i, (first, span) in enumerate(bursts)]},
             "prompt_len": {"lognormal": [draw(ints(300, 2000)), 1.0], "min": 1, "max": 6000},
             "max_tokens": {"lognormal": [draw(ints(16, 64)), 0.5], "min": 1, "max": 256}}
    if k:
        group["acceptance"] = {"length": [1, 3], "values": [0, k]}
    groups = [group]
    if draw(FLAG):  # long_prompt: one prompt of 8k-16k tokens, chunked across several steps
        groups.append({"name": "l", "arrivals": {"every": {"first": draw(ints(0, 200)), "period": 1, "count": 1}},
                       "prompt_len": {"uniform": list(LONG_PROMPT)},
                       "max_tokens": {"lognormal": [32, 0.5], "min": 1, "max": 256}})
    if draw(FLAG):  # a KV cache tighter than the demand: preemptions
        demand = count * 2000 // 16
        args["num_gpu_blocks_override"] = max(LONG_PROMPT[1] // 16 + 64, demand * draw(ints(3, 8)) // 10)
    params = {"generator": VERSION, "seed": draw(SEED), "vocab_size": draw(VOCAB), "groups": groups}
    # drawn last, so a seed keeps the shapes it had before these existed
    args["async_scheduling"] = draw(_async(allowed))
    if allows(allowed, "shared_prefixes") and draw(FLAG):
        params["shared_prefixes"] = {"count": draw(ints(1, 4)), "len": [512, draw(ints(512, 4096))],
                                     "share": draw(st.sampled_from([0.3, 0.7]))}
    if allows(allowed, "aborts") and draw(FLAG):
        params["aborts"] = {"share": draw(st.sampled_from([0.03, 0.1])), "after": [1, draw(ints(1, 200))]}
    workload = expand(params, f"{name}.json", args)
    # the small space's families too, on the expanded requests: the priority policy first (a
    # production scenario is FCFS unless drawn), so priorities() can give the heap its order
    if allows(allowed, "priority_policy") and draw(FLAG):
        args["scheduling_policy"] = "priority"
    draw(families(args, workload["requests"], params["vocab_size"], allowed))
    return {"schema": SCHEMA, "name": name, "description": "", "engine_args": args, "workload": workload}


@functools.lru_cache(maxsize=None)
def _production_spec(methods: tuple[str, ...] | None):
    """PRODUCTION_SPEC, with only `methods` (None: all)."""
    if methods is None:
        return PRODUCTION_SPEC
    return optional(st.sampled_from(methods)) if methods else st.none()


def for_layers(layers, allowed=None, production: bool = False) -> st.SearchStrategy:
    """The scenarios fuzzed for these layers: the engine space for the engine layers, the
    production-shape space when `production` (stand-in layers only); with `allowed` (a
    candidate's declared features), only scenarios needing no other feature."""
    engine = any(x.startswith("engine_") for x in layers)
    space = engine_scenarios if engine else production_scenarios if production else scenarios
    if allowed is None:
        return space()
    return space(allowed=frozenset(allowed)).filter(lambda raw: within(raw, allowed))


def within(raw: dict, allowed) -> bool:
    """Whether a raw scenario needs only `allowed` features (None: any)."""
    return allowed is None or all(name in allowed for name in needed(
        raw.get("engine_args"), raw.get("workload"), raw.get("method_matrix")))


ADAPTERS = 4  # a request's adapter: one of a few, so steps both share and exceed max_loras
MAX_LORAS = st.integers(1, 3)  # shrinks toward vLLM's default, 1


@st.composite
def adapters(draw, args: dict, reqs: list[dict], allowed) -> None:
    """Now and then, LoRA on (max_loras 1 to 3) and, for some requests, one of ADAPTERS adapters
    (id i, name `lora<i>`), so waiting requests are skipped for max_loras and the same prompt
    hashes apart under two adapters. Edits `args` and `reqs`."""
    if not allows(allowed, "lora") or not draw(FLAG):
        return
    args["enable_lora"] = True
    max_loras = draw(MAX_LORAS)
    if max_loras != 1:
        args["max_loras"] = max_loras
    for req in reqs:
        if draw(FLAG):
            i = draw(ints(1, ADAPTERS))
            req["lora"] = {"id": i, "name": f"lora{i}"}

