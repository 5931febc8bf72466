"""Findings grouped by cause (conformance/fuzz/cause.py) and a production finding reduced to a
small scenario (conformance/fuzz/reduce.py): pure functions, no engine."""

from __future__ import annotations

import json

from conformance.formats.scenario import SCHEMA, parse_scenario
from conformance.formats.trace import make_trace
from conformance.formats.workload_gen import VERSION, expand
from conformance.fuzz import strategies
from conformance.fuzz.cause import request_phase, step_phase
from conformance.fuzz.reduce import halved, reduce_production, shape
from conformance.fuzz.search import SCENARIO_DIR, signature
from conformance.judging.verdict import CANDIDATE, judge

HELLO = {"engine": "double", "version": "0", "protocol": 3}
RAW = {"schema": SCHEMA, "name": "fuzz", "description": "", "engine_args": {
    "model": "models/qwen3-27b", "load_format": "dummy", "max_num_seqs": 4, "max_num_batched_tokens": 16,
    "max_model_len": 128, "block_size": 16, "enable_prefix_caching": False, "enable_chunked_prefill": True,
    "async_scheduling": False}, "workload": {"seed": 0, "vocab_size": 64, "max_steps": 200, "requests": [
        {"id": "r0", "arrival_step": 0, "prompt_len": 40, "max_tokens": 4},
        {"id": "r1", "arrival_step": 0, "prompt_len": 4, "max_tokens": 4}]}}


def step(n: int, reqs: dict, new=(), **extra) -> dict:
    total = sum(e["tokens"] for e in reqs.values())
    return {"step": n, "new": list(new), "preempted": [], "resumed": [], "finished": [], "token_budget": 16,
            "total_num_scheduled_tokens": total, "requests": reqs, **extra}


def entry(tokens: int, computed: int, drafts: int = 0) -> dict:
    return {"tokens": tokens, "computed_tokens": computed, "draft_tokens": drafts}


# The oracle: r0's 40-token prompt in chunks of 12 beside r1 (admitted whole, then decoding).
ORACLE_STEPS = [step(0, {"r0": entry(12, 0), "r1": entry(4, 0)}, new=["r0", "r1"]),
                step(1, {"r0": entry(15, 12), "r1": entry(1, 4)}),
                step(2, {"r0": entry(13, 27), "r1": entry(1, 5)})]


def signature_of(candidate_steps: list[dict]) -> str:
    scenario = parse_scenario(json.loads(json.dumps(RAW)), SCENARIO_DIR / "fuzz.json")
    oracle = make_trace("oracle", HELLO, scenario, {"steps": ORACLE_STEPS})
    verdict = judge(make_trace("double", HELLO, scenario, {"steps": candidate_steps}), oracle, CANDIDATE)
    return signature(verdict, scenario, oracle)


def with_tokens(n: int, rid: str, tokens: int) -> list[dict]:
    steps = json.loads(json.dumps(ORACLE_STEPS))
    steps[n]["requests"][rid]["tokens"] = tokens
    return steps


def test_two_bugs_on_one_field_are_two_findings_and_one_bug_is_one():
    continuation = signature_of(with_tokens(1, "r0", 14))  # a prefill chunk one short
    decode = signature_of(with_tokens(1, "r1", 2))  # a decode step scheduling two tokens
    assert continuation == "diverged steps.requests.*.tokens @ prefill-continuation+budget-bound"
    assert decode == "diverged steps.requests.*.tokens @ decode+budget-bound"
    assert signature_of(with_tokens(2, "r0", 12)) == "diverged steps.requests.*.tokens @ prefill-last"
    # the same bug at another step in the same state: one finding
    later = json.loads(json.dumps(ORACLE_STEPS))
    later[0]["requests"]["r0"]["tokens"] = 11
    assert signature_of(later) == "diverged steps.requests.*.tokens @ admitted-chunk+budget-bound"
    assert signature_of(with_tokens(1, "r0", 13)) == continuation


def test_phases_read_from_the_oracles_records():
    prompts = {"requests": [{"id": "r0", "prompt_len": 40}]}
    record = step(3, {"r0": entry(1, 40, drafts=0)}, preempted=[])
    before = step(2, {"r0": entry(3, 37, drafts=2)})
    assert request_phase("r0", record, before, prompts) == "verify-cut"
    assert request_phase("r0", step(3, {"r0": entry(3, 40, drafts=2)}), before, prompts) == "verify"
    assert request_phase("r0", step(3, {}, preempted=["r0"]), before, prompts) == "preempted"
    assert request_phase("r0", step(3, {}), before, prompts) == "unscheduled"
    assert request_phase("r0", step(3, {"r0": entry(40, 0, drafts=2)}, new=["r0"]), {}, prompts) == "padded"
    assert step_phase(step(3, {}, preempted=["r1"])) == "preemption-step"
    assert step_phase(step(3, {})) == "idle-step"


def test_a_production_finding_is_reduced_to_a_small_scenario():
    """A bug that shows only when a prompt is longer than the token budget (a long prefill
    continued across steps): from a production example (8k-16k prompt, 64+ requests) to a few
    requests, every prompt within twice the budget."""
    raw = production_example()
    runs = []

    def fails(candidate: dict) -> bool:  # TEST DOUBLE of a candidate run: the bug's condition
        parse_scenario(candidate, SCENARIO_DIR / "fuzz.json")  # every variant tried is valid
        runs.append(candidate)
        budget = candidate["engine_args"]["max_num_batched_tokens"]
        return any(q["prompt_len"] > budget for q in candidate["workload"]["requests"])

    small, count = reduce_production(raw, fails, divergent_iteration=None)
    reqs, budget = small["workload"]["requests"], small["engine_args"]["max_num_batched_tokens"]
    assert count == len(runs) and fails(small)
    assert len(raw["workload"]["requests"]) >= 64 and len(reqs) <= 6, shape(small)
    assert all(q["prompt_len"] <= 2 * budget for q in reqs) and budget < 8192, shape(small)
    assert "speculative_config" not in small["engine_args"]


def test_halving_keeps_every_request_within_max_model_len():
    raw = production_example()
    while (smaller := halved(raw)) is not None:
        parse_scenario(smaller, SCENARIO_DIR / "fuzz.json")  # ScenarioError if a request no longer fits
        raw = smaller
    assert raw["engine_args"]["max_model_len"] < 64 and len(raw["workload"]["requests"]) == 97


def production_example() -> dict:
    """One example of strategies.production_scenarios' space, fixed: DFlash K=8, a budget of
    8192, 96 requests in two bursts and one long prompt (8k-16k tokens), a tight KV cache."""
    args = {"model": strategies.TARGET, "load_format": "dummy", "max_num_seqs": 64, "max_num_batched_tokens": 8192,
            "max_model_len": strategies.PRODUCTION_MAX_MODEL_LEN, "block_size": 16, "enable_prefix_caching": True,
            "enable_chunked_prefill": True, "async_scheduling": True, "num_gpu_blocks_override": 6000,
            "speculative_config": {"method": "dflash", "num_speculative_tokens": 8,
                                   "model": strategies.DRAFTERS["dflash"]}}
    groups = [{"name": "r", "arrivals": {"bursts": [[0, 10, 48], [40, 20, 48]]},
               "prompt_len": {"lognormal": [900, 1.0], "min": 1, "max": 6000},
               "max_tokens": {"lognormal": [32, 0.5], "min": 1, "max": 256},
               "acceptance": {"length": [1, 3], "values": [0, 8]}},
              {"name": "l", "arrivals": {"every": {"first": 5, "period": 1, "count": 1}},
               "prompt_len": {"uniform": list(strategies.LONG_PROMPT)},
               "max_tokens": {"lognormal": [32, 0.5], "min": 1, "max": 256}}]
    params = {"generator": VERSION, "seed": 26, "vocab_size": 151936, "groups": groups}
    workload = expand(params, "fuzz.json", args)
    return {"schema": SCHEMA, "name": "fuzz", "description": "", "engine_args": args, "workload": workload}
