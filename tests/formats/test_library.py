"""The orthogonal library (issue 25 item 5): every core scheduling behaviour has a stand-in
scenario with neither speculation nor the priority policy, and the oracle's golden shows that
behaviour happening (a scenario whose behaviour no longer happens, after a change of its file or
of the pinned oracle, fails here, not silently).

Read from the gate oracle's committed goldens (written by a real vLLM run), so no engine runs."""

from __future__ import annotations

import math

import pytest

from tests.helpers import REPO
from conformance.formats.features import SPEC
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS

SCENARIOS = {s.name: s for s in (load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json")))}
STAND_IN = {name: s for name, s in SCENARIOS.items() if s.workload is not None and s.engine is None}
# what a port without speculative decoding and without priorities lacks
SPECULATION_OR_PRIORITY = ("parallel_drafting", "priority_policy", "request_priorities")
# each core behaviour of the issue, and the scenarios that show it without speculation or priority
BEHAVIOURS = {
    "admission": ["core_admission"],
    "chunking of a first sequence": ["core_chunk_first"],
    "chunking of a second sequence in a step": ["core_chunk_second"],
    "long-prefill threshold": ["core_long_prefill_threshold", "long_prefill_threshold_one"],
    "preemption and resumption": ["core_resume_chunked", "kv_pressure_no_spec", "kv_pressure_no_spec_cached"],
    "stop token ids": ["core_stop_ids"],
    "max_model_len": ["core_max_model_len"],
    "FCFS order under a full batch": ["core_fcfs_full_batch", "core_kv_admission_blocked"],
}
MINIMUM = 12  # issue 25's "done when"


def orthogonal(scenario) -> bool:
    return not any(f.startswith(SPEC) or f in SPECULATION_OR_PRIORITY for f in scenario.features)


def golden(name: str) -> dict:
    return GOLDENS.load(name, load_pins().oracle).layers


def steps(name: str) -> list[dict]:
    return golden(name)["steps"]


def outputs(name: str) -> dict[str, dict]:
    return {r["id"]: r for r in golden(name)["outputs"]}


def requests(name: str) -> dict[str, dict]:
    return {r["id"]: r for r in SCENARIOS[name].workload["requests"]}


def first_step(name: str, key: str, request: str) -> int:
    """The first step whose `key` list (new, resumed, preempted, finished) names the request."""
    return next(st["step"] for st in steps(name) if request in st[key])


def chunks(name: str, request: str) -> list[int]:
    """The tokens the request was scheduled at each step it was scheduled."""
    return [st["requests"][request]["tokens"] for st in steps(name) if request in st["requests"]]


def test_at_least_twelve_stand_in_scenarios_need_neither_speculation_nor_priority():
    core = sorted(name for name, s in STAND_IN.items() if orthogonal(s))
    assert len(core) >= MINIMUM, (f"{len(core)} stand-in scenarios need neither speculation nor the "
                                  f"priority policy, expected at least {MINIMUM}: {core}")


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_each_core_behaviour_has_a_stand_in_scenario_without_speculation_or_priority(behaviour):
    for name in BEHAVIOURS[behaviour]:
        assert name in STAND_IN, f"{behaviour}: {name} is not a stand-in scenario of the library"
        assert orthogonal(STAND_IN[name]), f"{behaviour}: {name} needs {STAND_IN[name].features}"


def test_the_counter_counts_only_scenarios_without_speculation_or_priority():
    assert orthogonal(SCENARIOS["kv_pressure_no_spec"]) and orthogonal(SCENARIOS["core_stop_ids"])
    assert not orthogonal(SCENARIOS["kv_pressure"])  # spec:dflash
    assert not orthogonal(SCENARIOS["priority_victim_same_arrival"])  # priority_policy, no speculation
    assert not orthogonal(SCENARIOS["drafts_use_input_budget"])  # draft_model, parallel drafting


def admitted_in_arrival_order(name: str) -> int:
    """Every request of scenario `name` is admitted in the order it arrived; its max_num_seqs."""
    arrivals = [r["id"] for r in SCENARIOS[name].workload["requests"]]
    assert [rid for st in steps(name) for rid in st["new"]] == arrivals
    return SCENARIOS[name].engine_args["max_num_seqs"]


def test_admission_fills_the_max_num_seqs_cap_in_arrival_order():
    name = "core_admission"
    cap = admitted_in_arrival_order(name)
    waited = [st for st in steps(name) if "r2" in st["waiting"]]
    # the cap, not the budget: as many requests scheduled as max_num_seqs allows, tokens to spare
    assert waited and all(len(st["requests"]) == cap and st["token_budget"] > st["total_num_scheduled_tokens"]
                          for st in waited)
    assert first_step(name, "new", "r2") == first_step(name, "finished", "r0") + 1


def test_a_first_sequence_is_prefilled_in_chunks_of_the_token_budget():
    name = "core_chunk_first"
    budget = SCENARIOS[name].engine_args["max_num_batched_tokens"]
    prompt = requests(name)["r0"]["prompt_len"]
    assert chunks(name, "r0")[:3] == [budget, budget, prompt - 2 * budget]
    assert [st["requests"]["r0"]["output_tokens"] for st in steps(name)[:3]] == [0, 0, 1]


def test_a_second_sequence_is_chunked_with_what_the_first_leaves_of_the_budget():
    name = "core_chunk_second"
    budget = SCENARIOS[name].engine_args["max_num_batched_tokens"]
    prompts = {rid: r["prompt_len"] for rid, r in requests(name).items()}
    step0, step1 = steps(name)[:2]
    assert step0["new"] == ["r0", "r1"]
    assert step0["requests"]["r0"]["tokens"] == prompts["r0"]
    assert step0["requests"]["r1"]["tokens"] == budget - prompts["r0"] < prompts["r1"]
    assert step1["new"] == ["r2"] and step1["total_num_scheduled_tokens"] == budget
    assert 0 < step1["requests"]["r2"]["tokens"] < prompts["r2"]  # the new one chunked too


def test_the_long_prefill_threshold_caps_new_and_running_chunks_beside_decodes():
    name = "core_long_prefill_threshold"
    threshold = SCENARIOS[name].engine_args["long_prefill_token_threshold"]
    budget = SCENARIOS[name].engine_args["max_num_batched_tokens"]
    for rid, req in requests(name).items():
        got = chunks(name, rid)
        prefill = math.ceil(req["prompt_len"] / threshold)
        assert max(got) <= threshold, (rid, got)
        assert sum(got[:prefill]) == req["prompt_len"], (rid, got)
    assert chunks(name, "r0")[:4] == [threshold] * 4  # a running request's chunks, not only the first
    assert chunks(name, "r2")[0] == threshold  # a new request's first chunk
    assert all(st["total_num_scheduled_tokens"] < budget for st in steps(name))  # the threshold binds
    beside = [st for st in steps(name) if st["requests"].get("r0", {}).get("tokens") == threshold]
    assert any(st["requests"].get("r1", {}).get("tokens") == 1 for st in beside)  # decodes beside


def test_stop_token_ids_end_requests_with_the_stop_token_kept():
    name = "core_stop_ids"
    got = outputs(name)
    for rid, req in requests(name).items():
        tokens = got[rid]["output_token_ids"]
        hits = [i for i, t in enumerate(tokens) if t in req["stop_token_ids"]]
        if got[rid]["finish_reason"] == "stop":
            assert hits == [len(tokens) - 1] and len(tokens) < req["max_tokens"], (rid, tokens)
        else:
            assert not hits and len(tokens) == req["max_tokens"], (rid, tokens)
    assert [got[rid]["finish_reason"] for rid in ("r0", "r1", "r2")] == ["stop", "stop", "length"]


def test_requests_end_exactly_at_max_model_len():
    name = "core_max_model_len"
    limit = SCENARIOS[name].engine_args["max_model_len"]
    for rid, req in requests(name).items():
        out = outputs(name)[rid]
        assert out["finish_reason"] == "length"
        assert req["prompt_len"] + len(out["output_token_ids"]) == limit, rid
    first = steps(name)[0]["requests"]["r1"]["tokens"]
    assert 0 < first < requests(name)["r1"]["prompt_len"]  # the 127-token prompt chunked second


def test_a_full_batch_admits_the_oldest_waiting_request_first():
    name = "core_fcfs_full_batch"
    cap = admitted_in_arrival_order(name)
    for st in steps(name):  # a request waits only while the batch is full (scheduled: running before the update)
        assert not st["waiting"] or len(st["requests"]) == cap, st["step"]
    assert first_step(name, "new", "r4") > first_step(name, "new", "r3")  # the short one does not overtake


def test_admission_waits_for_the_whole_prompts_blocks_and_blocks_later_arrivals():
    name = "core_kv_admission_blocked"
    size = SCENARIOS[name].engine_args["block_size"]
    budget = SCENARIOS[name].engine_args["max_num_batched_tokens"]
    prompts = {rid: r["prompt_len"] for rid, r in requests(name).items()}
    assert not any(st["preempted"] for st in steps(name))
    assert first_step(name, "new", "r1") == first_step(name, "finished", "r0") + 1
    step1 = steps(name)[1]
    assert "r1" in step1["waiting"]
    chunk = budget - step1["total_num_scheduled_tokens"]  # what a chunk of r1 could have had
    assert math.ceil(chunk / size) <= step1["kv_blocks"]["free"] < math.ceil(prompts["r1"] / size)
    behind = [st for st in steps(name) if "r2" in st["waiting"] and "r1" in st["waiting"]]
    assert behind and all(st["kv_blocks"]["free"] >= math.ceil(prompts["r2"] / size) for st in behind)
    assert first_step(name, "new", "r2") > first_step(name, "new", "r1")


def test_a_preempted_request_goes_first_and_is_resumed_in_chunks():
    name = "core_resume_chunked"
    budget = SCENARIOS[name].engine_args["max_num_batched_tokens"]
    preempted = first_step(name, "preempted", "r1")
    at = steps(name)[preempted]
    assert at["new"] == [] and at["waiting"] == ["r1", "r3"]  # no admission in a step that preempts
    assert requests(name)["r3"]["arrival_step"] == preempted
    resumed = first_step(name, "resumed", "r1")
    assert resumed == first_step(name, "finished", "r0") + 1
    assert first_step(name, "new", "r3") > resumed  # behind the preempted request
    recompute = [st["requests"]["r1"] for st in steps(name)[resumed:resumed + 2]]
    assert recompute[0]["tokens"] == recompute[0]["computed_tokens"] == budget  # no cache: from 0
    assert recompute[1]["computed_tokens"] > budget and recompute[1]["output_tokens"] == recompute[0]["output_tokens"] + 1


def test_a_resumed_request_takes_its_cached_blocks_back_only_with_prefix_caching():
    def resumptions(name):
        return [(st["step"], st["requests"][rid]) for st in steps(name) for rid in st["resumed"]]

    off, on = resumptions("kv_pressure_no_spec"), resumptions("kv_pressure_no_spec_cached")
    assert off and on
    assert all(r["tokens"] == r["computed_tokens"] for _, r in off)  # recomputed from token 0
    assert any(r["tokens"] < r["computed_tokens"] for _, r in on)  # the rest from the cache
