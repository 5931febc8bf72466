"""Integration, per-step layer: the real scheduler of each pin, driven by the stand-in."""

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.workload import check_stop, request_prompts, target_next
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import judge
from conformance.report.render_text import render
from tests.helpers import REPO, records_of
from tests.engines.tiny_text import decode, follows

pytestmark = pytest.mark.oracle
PINS = load_pins()
SCENARIOS = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))]
# stand-in driven, the library (production scenarios: tests/gate/test_production_gate.py)
WORKLOADS = [s for s in SCENARIOS if s.workload is not None and s.engine is None and s.scale == "library"]
IDS = [s.name for s in WORKLOADS]


def golden(scenario, release=PINS.oracle):
    return GOLDENS.load(scenario.name, release)


def binding_budget(step: dict) -> int:
    """What a step may schedule: its token budget, less the drafting slots charged to its
    running requests where the release charges them per step (input_budget, 0.28.0 on)."""
    if "input_budget" in step:
        return step["input_budget"] - step["drafting_slots_per_request"] * len(step["running"])
    return step["token_budget"]


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", WORKLOADS, ids=IDS)
def test_speculation_is_lossless(warm_sessions, release, scenario):
    """Accepted drafts are the target's own tokens: outputs with and without spec are equal."""
    session = warm_sessions(release)
    spec = records_of(session, scenario, ["outputs"])["outputs"]
    plain = records_of(session, scenario.without_speculation(), ["outputs"])["outputs"]
    if scenario in SESSION_DRAFTS and _version(release) < GATE_LAST:
        # a session's chunk that max_tokens ends on an accepted draft keeps that draft, computed,
        # where one ending on a sampled token drops it (upstream-changes.toml): the next chunk's
        # prompt, so the session's output, depends on the drafts; the other requests' does not
        sessions = {r["id"] for r in scenario.workload["requests"] if "session" in r}
        assert [r for r in spec if r["id"] in sessions] != [r for r in plain if r["id"] in sessions]
        spec, plain = ([r for r in out if r["id"] not in sessions] for out in (spec, plain))
    assert spec == plain
    # every request made tokens, but one aborted before its first sample (abort_states) and one
    # whose KV load failed under kv_load_failure_policy fail (kv_connector_fail_policy)
    assert all(r["output_token_ids"] or r["finish_reason"] in ("abort", "error") for r in spec)


LORA = [s for s in WORKLOADS if "lora" in s.features]


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", LORA, ids=[s.name for s in LORA])
def test_no_step_runs_more_adapters_than_max_loras(scenario, release):
    """vLLM's per-step bound, checked from the workload on each pin's golden: the adapters of the
    requests a step schedules number at most max_loras, and some step reaches it."""
    bound = scenario.engine_args.get("max_loras", 1)
    adapters = {r["id"]: r["lora"]["id"] for r in scenario.workload["requests"] if "lora" in r}
    counts = [len({adapters[rid] for rid in st["requests"] if rid in adapters})
              for st in golden(scenario, release).layers["steps"]]
    assert max(counts) == bound, counts


@pytest.mark.parametrize("release", PINS.releases)
def test_lora_scenarios_show_admission_and_hashing(release):
    """What the LoRA scenarios' descriptions claim, on every pin's golden."""
    steps = {s.name: golden(s, release).layers["steps"] for s in LORA}
    admission = steps["lora_max_loras_admission"]
    assert admission[0]["new"] == ["r0"] and admission[0]["waiting"] == ["r1"]
    assert admission[0]["total_num_scheduled_tokens"] < admission[0]["token_budget"]  # not the budget
    assert admission[1]["new"] == ["r2", "r3"] and admission[1]["waiting"] == ["r1"]  # admitted past it
    assert next(i for i, st in enumerate(admission) if "r1" in st["new"]) == 12
    # the priority policy takes from the side queue and the waiting queue by priority
    priority = steps["lora_priority"]
    assert [st["new"] for st in priority[:3]] == [["r0"], ["r3"], ["r4"]] and priority[8]["new"] == ["r1", "r2", "r5"]
    assert all(st["waiting"] == ["r2", "r1"] for st in priority[1:8]) and priority[8]["running"] == ["r2", "r1", "r5"]
    # an abort takes a skipped request out of the side queue
    aborted = steps["lora_abort_skipped"]
    assert aborted[1]["waiting"] == ["r1", "r2"] and aborted[2]["aborted"] == ["r1"] and aborted[2]["waiting"] == ["r2"]
    assert next(i for i, st in enumerate(aborted) if "r2" in st["new"]) == 6
    # the same prompt shares blocks under the same adapter only
    cached = steps["lora_prefix_caching"]
    hits = {rid: r["cached_tokens"] for st in cached for rid, r in st["requests"].items() if rid in st["new"]}
    blocks: dict = {}  # each request's blocks in order: all at its admission, then those added
    for st in cached:
        for rid, r in st["requests"].items():
            blocks.setdefault(rid, []).extend(r["block_ids"][0] if r["block_ids"] else [])
    blocks = {rid: ids[:4] for rid, ids in blocks.items()}  # the shared prefix's 4 blocks
    assert hits == {"r0": 0, "r1": 0, "r2": 64, "r3": 0, "r4": 64, "r5": 64}
    assert blocks["r2"] == blocks["r0"] and blocks["r4"] == blocks["r3"] and blocks["r5"] == blocks["r1"]
    assert not set(blocks["r0"]) & set(blocks["r1"]) and not set(blocks["r0"]) & set(blocks["r3"])
    assert not set(blocks["r1"]) & set(blocks["r3"])
    # 0.33.0 counts the adapter of a running request not scheduled in the step (upstream-changes.toml)
    in_flight = steps["lora_async_in_flight"]
    admitted = next(i for i, st in enumerate(in_flight) if "r1" in st["new"])
    assert admitted == (6 if _version(release) >= (0, 33, 0) else 5)


# vLLM 0.33.0 moved check_stop's min_tokens gate after the eos, stop token and length checks
# (upstream-changes.toml): where the stand-in gives an eos or stop token before min_tokens
# outputs, the releases' outputs differ, each following its own order.
GATE_LAST = (0, 33, 0)
MIN_TOKENS = [s for s in WORKLOADS if "min_tokens" in s.features]


# vLLM 0.33.0 compiles JSON schemas with the tokenizer's special tokens filtered out
# (upstream-changes.toml): the ids a JSON grammar allows, and so the stand-in's choices, differ.
JSON_GRAMMARS = [s for s in WORKLOADS if any("json" in r.get("structured_output", {}) for r in s.workload["requests"])]


# vLLM 0.33.0 keeps one output fewer of a session's chunk where max_tokens cut its accepted drafts
# (upstream-changes.toml): the next chunk's prompt differs.
SESSION_DRAFTS = [s for s in WORKLOADS if "streaming_input" in s.features and s.engine_args.get("speculative_config")]


@pytest.mark.parametrize("scenario", WORKLOADS, ids=IDS)
def test_outputs_identical_across_pins(scenario):
    releases = [r for r in PINS.releases
                if scenario not in MIN_TOKENS + JSON_GRAMMARS + SESSION_DRAFTS or _version(r) < GATE_LAST]
    outputs = {r: golden(scenario, r).layers["outputs"] for r in releases}
    assert all(o == outputs[PINS.oracle] for o in outputs.values()), scenario.name


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", MIN_TOKENS, ids=[s.name for s in MIN_TOKENS])
def test_outputs_with_min_tokens_follow_each_releases_check_stop(scenario, release):
    """Every output token, finish_reason and stop_reason is the stand-in's, stopped in the
    release's check_stop order: the min_tokens gate first (0.27.1, 0.28.0), or after the eos,
    stop token and length checks (0.33.0 on)."""
    w, limit = scenario.workload, scenario.engine_args["max_model_len"]
    prompts = request_prompts(w, limit)
    expected = [_stopped(w, r, prompts[r["id"]], limit, _version(release) >= GATE_LAST)
                for r in sorted(w["requests"], key=lambda r: r["id"])]
    assert golden(scenario, release).layers["outputs"] == expected


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def _stopped(w: dict, r: dict, prompt: list[int], limit: int, gate_last: bool) -> dict:
    """The request's output record: the target's tokens until check_stop stops, in the order."""
    context, out = list(prompt), []
    stops, eos, rep = set(r["stop_token_ids"]), r.get("eos_token_id"), r.get("repetition_detection")
    while True:
        out.append(target_next(w["seed"], context, w["vocab_size"]))
        context.append(out[-1])
        if gate_last:  # eos, stop tokens and length ungated; the gate, then repetition
            why = (check_stop(out, len(context), r["max_tokens"], stops, limit, 0, eos)
                   or check_stop(out, len(context), r["max_tokens"], set(), limit, r.get("min_tokens", 0), None, rep))
        else:
            why = check_stop(out, len(context), r["max_tokens"], stops, limit, r.get("min_tokens", 0), eos, rep)
        if why:
            stop_token = why == "stop" and out[-1] != eos
            reason = out[-1] if stop_token else "repetition_detected" if why == "repetition" else None
            return {"finish_reason": why, "id": r["id"], "output_token_ids": out, "stop_reason": reason}


def test_scenario_library_exercises_what_it_claims():
    steps = {s.name: golden(s).layers["steps"] for s in WORKLOADS}
    outputs = {s.name: golden(s).layers["outputs"] for s in WORKLOADS}
    assert any(st["preempted"] for st in steps["kv_pressure"]) and any(st["resumed"] for st in steps["kv_pressure"])
    step0 = steps["prefill_budget_binds"][0]
    assert step0["total_num_scheduled_tokens"] == binding_budget(step0)  # the budget binds
    assert {r["finish_reason"] for r in outputs["stop_conditions"]} == {"stop", "length"}
    assert any(st["new"] for st in steps["staggered_arrivals"][1:])  # arrivals after step 0
    drafts = {req["draft_tokens"] for st in steps["steady_decode"] for req in st["requests"].values()}
    assert 16 in drafts
    # gpt-oss's two KV cache groups: a block table per group, preemption under pressure, hits
    for name in ("sliding_window_chunked", "sliding_window_prefix_hits", "sliding_window_kv_pressure"):
        assert all(len(r["block_ids"]) == 2 for st in steps[name] for r in st["requests"].values()
                   if r["block_ids"] is not None), name
    assert any(st["preempted"] for st in steps["sliding_window_kv_pressure"])
    hits = {rid: r["cached_tokens"] for st in steps["sliding_window_prefix_hits"] for rid, r in st["requests"].items()
            if r["cached_tokens"]}
    assert set(hits) == {"b", "c", "d"}
    # Nemotron-H's eight KV cache groups (one full-attention, seven mamba): the block size
    # vLLM unified with the mamba page, block-aligned chunks in mode align, hits, preemption
    for s in WORKLOADS:
        if "mamba" in s.features:
            config = golden(s).layers["config"][0]
            # mode all: the least multiple of the mamba chunk (128) that holds the state; else of
            # 16; EAGLE-3's 3 drafts widen the conv state (1328), its 2 in mode all do not
            mode = s.engine_args.get("mamba_cache_mode", "all" if s.engine_args["enable_prefix_caching"] else "none")
            k = (s.engine_args.get("speculative_config") or {}).get("num_speculative_tokens", 0)
            assert config["block_size"] == (1408 if mode == "all" else 1328 if k == 3 else 1312), s.name
            assert all(len(r["block_ids"]) == 8 for st in steps[s.name] for r in st["requests"].values()
                       if r["block_ids"] is not None), s.name
            # the blocks to zero are some of those the step hands out (its full-attention group's)
            for st in steps[s.name]:
                given = {b for r in st["requests"].values() for group in r["block_ids"] or () for b in group}
                assert set(st["zeroed_block_ids"]) <= given, (s.name, st["step"])
            assert any(st["zeroed_block_ids"] for st in steps[s.name]), s.name
    assert [st["requests"]["a"]["tokens"] for st in steps["mamba_align_prefix_hits"][:2]] == [1312, 1312]
    assert steps["mamba_all_prefix_hits"][0]["requests"]["a"]["tokens"] == 2048  # mode all: no split
    hits = {rid: r["cached_tokens"] for st in steps["mamba_align_prefix_hits"] for rid, r in st["requests"].items()
            if r["cached_tokens"]}
    assert set(hits) == {"b", "c", "d"} and all(n % 1312 == 0 for n in hits.values())
    partial = [r["cached_tokens"] for st in steps["mamba_prefix_match_unit"] for r in st["requests"].values()
               if r["cached_tokens"] % 1312]
    assert partial and all(n % 32 == 0 for n in partial)  # fine-grained hits end inside a block
    narrow = [st["requests"]["a"]["tokens"] for st in steps["mamba_align_narrow_budget"][:4]]
    assert narrow == [1024, 288, 1024, 288]  # inside the block by the budget, then to its boundary
    assert steps["mamba_all_eagle3"][0]["waiting"] == ["b"]  # a's states of this step: b waits
    for name in ("mamba_no_prefix_caching", "mamba_align_kv_pressure"):
        assert any(st["preempted"] for st in steps[name]) and any(st["resumed"] for st in steps[name]), name
    # a KV connector: an async load waits without being scheduled, then is admitted with its
    # external tokens; a failed load under the `fail` policy ends its request with an error
    first = steps["kv_connector_async"][0]
    assert first["requests"] == {} and first["waiting"] == ["a", "b"]
    assert steps["kv_connector_async"][4]["requests"]["a"]["cached_tokens"] == 256
    assert {r["id"]: r["finish_reason"] for r in outputs["kv_connector_fail_policy"]}["a"] == "error"


# the grammar scenarios whose every grammar compiles (grammar_compile_error: below); those
# whose grammars wait for a reasoning end: tests/engines/test_reasoning_oracle.py
GRAMMARS = [s for s in WORKLOADS if "structured_outputs" in s.features and s.name != "grammar_compile_error"
            and "reasoning" not in s.features]
# the ones whose golden cannot show a draft cut short and a draft rejected, and why
NO_PARTIAL_CUT = {
    "grammar_ignore_eos": "no speculation",
    "grammar_many_requests": "no speculation (the thread-pool bitmask fill)",
    "grammar_many_requests_drafts": "K 1: a cut leaves no draft, and every kept draft is accepted",
}


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", GRAMMARS, ids=[s.name for s in GRAMMARS])
def test_grammars_cut_drafts_and_outputs_follow_them(scenario, release):
    """Each pin's golden: the drafter's proposals pass the grammar's cut as a prefix, some are
    cut, some drafts inside the grammar are scheduled and rejected; what the grammar requests
    output is text their grammar accepts; requests without one carry no grammar fields."""
    layers = golden(scenario, release).layers
    specs = {r["id"]: r.get("structured_output") for r in scenario.workload["requests"]}
    cut = rejected = 0
    for step in layers["steps"]:
        assert step["grammar_errors"] == []
        for rid, entry in step["requests"].items():
            if specs[rid] is None:
                assert "proposed_draft_token_ids" not in entry
                continue
            proposed, kept = entry["proposed_draft_token_ids"], entry["next_draft_token_ids"]
            if "deferred_sampling" in step:  # async scheduling: cut in the deferred step's output
                kept = [t for t in entry["bitmask_draft_token_ids"] if t != -1] if proposed else []
            assert proposed[:len(kept)] == kept, (step["step"], rid)
            cut += bool(kept) and len(kept) < len(proposed)
            rejected += entry["accepted_draft_tokens"] < entry["draft_tokens"]
    assert bool(cut and rejected) == (scenario.name not in NO_PARTIAL_CUT), (cut, rejected)
    for out in layers["outputs"]:
        if specs[out["id"]] is not None and out["finish_reason"] == "stop":
            assert out["output_token_ids"][-1] == 2  # the grammar ended: the eos, the one id it allows
            assert follows(decode(out["output_token_ids"]), specs[out["id"]]), out["id"]
    assert any(specs[o["id"]] and o["finish_reason"] == "stop" for o in layers["outputs"])


@pytest.mark.parametrize("release", PINS.releases)
def test_a_grammar_that_fails_is_an_error_and_the_others_go_on(release):
    """badregex passes the input processor by llguidance once xgrammar is the engine's backend:
    0.27.1 and 0.28.0 add it and finish it as an error at the step that reaches it (its
    grammar_compile_error_reqs), 0.33.0 refuses it at add_request; never scheduled either way."""
    scenario = next(s for s in WORKLOADS if s.name == "grammar_compile_error")
    layers = golden(scenario, release).layers
    errors = {st["step"]: st["grammar_errors"] for st in layers["steps"] if st["grammar_errors"]}
    assert errors == {2: ["badregex"]}
    added = _version(release) < (0, 33, 0)
    assert ("badregex" in layers["steps"][2]["finished"]) == added
    assert not any("badregex" in st["requests"] or "badregex" in st["waiting"] for st in layers["steps"])
    outputs = {o["id"]: o for o in layers["outputs"]}
    assert (outputs["badregex"]["finish_reason"], outputs["badregex"]["output_token_ids"]) == ("error", [])
    assert outputs["schema"]["finish_reason"] == "stop" and decode(outputs["schema"]["output_token_ids"])


BINDS = next(s for s in WORKLOADS if s.name == "prefill_budget_binds")
# the pins whose scheduler gives r1 another share of the binding budget than the oracle's does
BUDGET_DRIFT = [r for r in PINS.releases if golden(BINDS, r).layers["steps"][0]["requests"]["r1"]["tokens"]
                != golden(BINDS).layers["steps"][0]["requests"]["r1"]["tokens"]]


@pytest.mark.parametrize("release", BUDGET_DRIFT[-1:])  # the newest such pin, on its warm worker
def test_another_pin_is_reported_where_the_budget_binds(warm_sessions, release):
    """Another pin vs the oracle's golden: the first step where the budget binds, per-request
    counts, as the two releases' goldens have them."""
    trace = warm_sessions(release).trace(BINDS)
    verdict = judge(trace, golden(BINDS), "candidate")
    steps = next(c for c in verdict.comparisons if c.layer == "steps")
    r1 = [golden(BINDS, r).layers["steps"][0]["requests"]["r1"]["tokens"] for r in (PINS.oracle, release)]
    # the decision that differs first is named first: on a release whose block pool hands out
    # other ids, r1's block ids; the budget's share is among the fields of that step
    tokens = next(f for f in steps.fields if f.path == "requests.r1.tokens")
    assert steps.index == 0 and steps.first.path in ("requests.r1.tokens", "requests.r1.block_ids[0]")
    assert (tokens.expected, tokens.actual) == tuple(r1)
    text = render([verdict], PINS.oracle)
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("! r1 "))
    assert row[:4] == ["!", "r1", "new", str(r1[0])] and row[row.index("new", 3) + 1] == str(r1[1]), row


MUTANTS = {
    # mutant: (scenario that must catch it, layer, first field)
    "no-draft-reservation": ("prefill_budget_binds", "steps", "requests.r1.tokens"),
    "draft-plus-one": ("steady_decode", "steps", None),
    "draft-minus-one": ("steady_decode", "steps", None),
    "ignore-max-num-seqs": ("prefill_budget_binds", "steps", None),
    "crash-after-divergence": ("prefill_budget_binds", "steps", "requests.r1.tokens"),
    # the first chunk after r0's prompt passes the window (128 tokens): the oracle's
    # sliding-window group has freed the blocks before it, the mutant holds them
    "sliding-window-as-full": ("sliding_window_chunked", "steps", None),
    # a's 3400-token prompt in mamba cache mode align: the oracle's first chunk ends at the
    # block boundary (1312 tokens), the mutant's takes the whole budget (2048)
    "mamba-unaligned-split": ("mamba_align_prefix_hits", "steps", "requests.a.tokens"),
    # a's synchronous load fails at step 0: the oracle rolls a back to 0 computed tokens, the
    # mutant keeps its 200 and samples
    "ignore-invalid-kv-blocks": ("kv_connector_failures", "steps", None),
    # r1, running, continues by the 8191 tokens the step has left at step 1; capped, by 2048
    "cap-running-chunk-2048": ("long_running_chunk", "steps", "requests.r1.tokens"),
    # r0 runs adapter alpha and max_loras is 1: the oracle skips r1 (beta) at step 0, the
    # mutant admits it beside r0
    "ignore-max-loras": ("lora_max_loras_admission", "steps", "requests.r1"),
    # regex's drafts at step 0: its grammar cuts the fourth, the first wrong one (a token the
    # regex does not allow there), the mutant keeps all four
    "ignore-grammar-cut": ("grammar_eagle3", "steps", "requests.regex.next_draft_token_ids"),
    # obj's drafts at step 0 are reasoning, </think> among them: the oracle cuts none, the
    # mutant's grammar (applied from the first token) refuses them
    "grammar-in-reasoning": ("grammar_reasoning_eagle3", "steps", "requests.obj.next_draft_token_ids"),
    # s0 waits for its next input chunk from step 2, holding one of max_num_seqs 2 slots: the
    # oracle holds r2 back at step 4 beside the running r1, the mutant admits it
    "streaming-sessions-free-slots": ("streaming_session_slots", "steps", "new"),
    # big's allocation at step 6 evicts a's two last prefix blocks: the oracle publishes their
    # BlockRemoved before big's BlockStored, the mutant only the BlockStored
    "no-block-removed-events": ("kv_events_eviction", "steps", "kv_events"),
    # a and b hold blocks at step 4: the oracle's reset answers false, the mutant's clears the cache
    "reset-ignores-blocks-in-use": ("prefix_cache_reset_idle", "steps", "prefix_cache_reset"),
    # r1's clip `shared` is the one r0 encodes at step 0: the oracle hits it in the encoder cache,
    # the mutant (keyed by request) encodes it again, 18 slots more
    "encoder-cache-per-request": ("encoder_cache_hits", "steps", "encoder_inputs.r1"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_every_mutant_is_caught(warm_sessions, mutant):
    """Each injected bug (a TEST DEVICE on the oracle pin) diverges from the oracle's golden."""
    name, layer, field = MUTANTS[mutant]
    scenario = next(s for s in WORKLOADS if s.name == name)
    session = warm_sessions(f"{PINS.oracle}+mutant:{mutant}")  # its own process, shared with other tests
    assert session.start().hello["engine"] == f"vllm+mutant:{mutant}"
    trace = session.trace(scenario)  # a failure too: the records sent, and why it ended
    verdict = judge(trace, golden(scenario), "candidate")
    assert verdict.kind == "diverged"
    if mutant == "crash-after-divergence":
        # the divergence at step 0 before the crash at step 3 is the verdict, and the report
        # shows the engine's traceback, where a bare AssertionError alone would say nothing
        assert verdict.failure == "engine_error" and "AssertionError" in verdict.message
        assert "Traceback (most recent call last)" in verdict.message
        assert "assert self._parity_calls < 4" in verdict.message
        assert len(trace.layers["steps"]) == 3
    comparison = next(c for c in verdict.comparisons if c.layer == layer)
    assert not comparison.equal
    if mutant in ("no-draft-reservation", "crash-after-divergence"):
        # the seed's bug: named at its first step, with the token counts on both sides: the
        # oracle's share for r1, and without any drafting slot the whole budget left by r0
        step0 = golden(scenario).layers["steps"][0]
        batched = golden(scenario).layers["config"][0]["max_num_batched_tokens"]
        unreserved = batched - step0["requests"]["r0"]["tokens"]
        found = {f.path: (f.expected, f.actual) for f in comparison.fields}
        assert comparison.index == 0 and found[field] == (step0["requests"]["r1"]["tokens"], unreserved)
        assert "total_num_scheduled_tokens" in found
    if mutant == "ignore-max-loras":
        assert comparison.index == 0 and comparison.actual_record["new"] == ["r0", "r1"], comparison.first
        assert comparison.record["new"] == ["r0"] and comparison.record["waiting"] == ["r1"]
    if mutant == "streaming-sessions-free-slots":
        assert comparison.index == 4 and comparison.first.path == field, comparison.first
        assert comparison.actual_record["new"] == ["r2"]
        assert comparison.record["new"] == [] and comparison.record["waiting"] == ["s0", "r2"]
    if mutant == "ignore-grammar-cut":
        found = {f.path: (f.expected, f.actual) for f in comparison.fields}
        kept, proposed = found[field]
        assert comparison.index == 0 and comparison.first.path == field
        assert len(kept) == 3 and proposed[:3] == kept and len(proposed) == 4, found[field]
    if mutant == "mamba-unaligned-split":
        found = {f.path: (f.expected, f.actual) for f in comparison.fields}
        assert comparison.index == 0 and found[field] == (1312, 2048), comparison.fields
    if mutant == "grammar-in-reasoning":
        found = {f.path: (f.expected, f.actual) for f in comparison.fields}
        kept, cut = found[field]
        assert comparison.index == 0 and 2047 in kept and 2047 not in cut, found[field]  # </think> kept
    if mutant == "encoder-cache-per-request":
        found = {f.path: (f.expected, f.actual) for f in comparison.fields}
        assert comparison.index == 0 and found[field][1] == [0], found  # r1 encodes: absent in the oracle's
        assert found["encoder_cache.free"] == (46, 28), found
    if mutant == "cap-running-chunk-2048":
        found = {f.path: (f.expected, f.actual) for f in comparison.fields}
        assert comparison.index == 1 and found[field] == (8191, 2048), comparison.fields
    if mutant.startswith("draft-"):
        e, a = comparison.record["requests"], comparison.actual_record["requests"]
        delta = 1 if mutant == "draft-plus-one" else -1
        # named where the drafts first differ: the ids kept after drafting (protocol 3), one
        # more or one fewer, or the drafts scheduled
        assert any(len(a[r]["next_draft_token_ids"]) == len(e[r]["next_draft_token_ids"]) + delta
                   or a[r]["draft_tokens"] == e[r]["draft_tokens"] + delta for r in e if r in a), \
            comparison.first
