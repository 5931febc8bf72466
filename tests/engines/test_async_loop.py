"""Async scheduling in the stand-in layers (engines/vllm/async_loop.py, engines/PROTOCOL.md "Async
scheduling: the batch-queue loop"): what the oracle's goldens of the async scenarios say, and
the TEST DEVICE mutants of a port's async loop that only those scenarios catch."""

import json

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import judge
from tests.helpers import REPO

PINS = load_pins()
SCENARIOS = {s.name: s for s in (load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json")))}
# The library's: a production-scale golden holds digests, not records (its async twin is judged
# by its output digests, tests/judging/test_digest.py)
ASYNC = sorted(n for n, s in SCENARIOS.items() if s.engine_args["async_scheduling"] is not False
               and s.scale != "production")
TWINS = sorted(n for n in ASYNC if n.endswith("_async") and "steps" in SCENARIOS[n].layers)
LOOPS = sorted(n for n in ASYNC if "steps" in SCENARIOS[n].layers)  # the twins, the example, one per method
METHODS = sorted(n for n in LOOPS if n not in TWINS and n != "async_worked_example"
                 and SCENARIOS[n].engine_args.get("speculative_config"))  # not the connector's loop


def layers(name: str, release: str = PINS.oracle) -> dict:
    return GOLDENS.load(name, release).layers


def sync_layers(name: str, release: str = PINS.oracle) -> dict:
    """A synchronous scenario's golden as written (its steps and outputs are what the async fields
    leave alone), read without the checks of the current protocol: its config record may predate
    the async fields until `make goldens` rewrites it."""
    return json.loads(GOLDENS.path(name, release).read_text(encoding="utf-8"))["layers"]


def compact(record: dict) -> dict:
    """A step record as PROTOCOL.md's worked example prints it."""
    keep = ("step", "iteration", "update_iteration", "total_num_scheduled_tokens", "preempted", "resumed",
            "finished", "waiting", "running")
    out = {k: record[k] for k in keep}
    out["requests"] = {rid: (r["tokens"], r["draft_tokens"], r["accepted_draft_tokens"], r["computed_tokens"],
                             r["output_tokens"], r["output_placeholders"], r["delivery"])
                       for rid, r in record["requests"].items()}
    return out


def test_the_worked_example_is_protocol_md_s():
    """Each row of the worked example's table, as the oracle recorded it (0.27.1)."""
    steps = [compact(r) for r in layers("async_worked_example")["steps"]]
    assert [(s["iteration"], s["update_iteration"]) for s in steps] == [(i, i + 1) for i in range(9)]
    # S0: both prompts; U0 after S1 preempted r1: r1's token arrives stale
    assert steps[0]["requests"] == {"r0": (12, 0, 0, 15, 1, 3, "applied"), "r1": (12, 0, 0, 0, 1, 0, "stale")}
    assert (steps[0]["running"], steps[0]["waiting"]) == (["r0"], ["r1"])
    assert steps[1]["preempted"] == ["r1"] and steps[1]["requests"] == {"r0": (3, 2, 2, 18, 4, 3, "applied")}
    assert steps[1]["running"] == ["r0", "r1"]  # S2's admission of r1 shows in record 1's state
    assert steps[2]["resumed"] == ["r1"] and steps[2]["finished"] == ["r0"]
    assert steps[2]["requests"] == {"r0": (3, 2, 2, 21, 6, 0, "applied"), "r1": (13, 0, 0, 0, 2, 0, "stale")}
    assert steps[3]["preempted"] == ["r1"] and steps[3]["requests"] == {"r0": (3, 2, 0, 21, 6, 0, "dropped")}
    assert [s["total_num_scheduled_tokens"] for s in steps[7:]] == [0, 0]  # the guard, then the report
    assert layers("async_worked_example")["outputs"] == [
        {"id": "r0", "output_token_ids": [41, 892, 385, 30, 464, 301], "finish_reason": "length",
         "stop_reason": None},
        {"id": "r1", "output_token_ids": [792, 229, 265, 954, 903, 387], "finish_reason": "length",
         "stop_reason": None}]


@pytest.mark.parametrize("release", PINS.releases)
def test_the_config_record_carries_both_platform_rules(release):
    gate, sync = layers("dflash_27b_gate_async", release)["config"][0], sync_layers("dflash_27b_gate", release)["config"][0]
    assert (gate["async_scheduling_gpu"], gate["async_scheduling_cpu"], gate["batch_queue_size"]) == (True, False, 2)
    assert gate["scheduler_class"] == "AsyncScheduler" and sync["scheduler_class"] == "Scheduler"
    assert (sync.get("async_scheduling_gpu", False), sync.get("batch_queue_size", 1)) == (False, 1)
    # the budget is the synchronous gate's (4036 on 0.27.1; 0.28.0 charges drafting per step)
    assert gate["max_num_scheduled_tokens"] == sync["max_num_scheduled_tokens"]
    assert gate["budget_log_lines"] == sync["budget_log_lines"]
    refused = layers("async_ngram_refused", release)["config"][0]
    # refused by the generic rule, before the CPU platform could turn it off (words differ by pin)
    assert refused["refused"]["type"] == "ValueError" and "async scheduling" in refused["refused"]["message"].lower()


def test_the_gate_as_deployed_keeps_the_4036_budget():
    assert layers("dflash_27b_gate_async", "0.27.1")["config"][0]["max_num_scheduled_tokens"] == 4036


def test_vllm_s_default_for_a_draft_model_changes_between_pins():
    """0.27.1 leaves draft_model-based speculation synchronous (and logs it), 0.28.0 does not."""
    old, new = (layers("async_draft_model_default", r)["config"][0] for r in ("0.27.1", "0.28.0"))
    assert (old["async_scheduling_gpu"], old["batch_queue_size"], old["scheduler_class"]) == (False, 1, "Scheduler")
    assert old["async_log_lines"] == ["Async scheduling not supported with draft_model-based speculative "
                                      "decoding and will be disabled."]
    assert (new["async_scheduling_gpu"], new["batch_queue_size"], new["async_log_lines"]) == (True, 2, [])
    assert old["async_scheduling_cpu"] is new["async_scheduling_cpu"] is False


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("name", TWINS)
def test_an_async_twin_generates_what_its_sync_twin_does(name, release):
    """The loop changes when the scheduler learns of each output, never what is generated; but a
    request aborted with a batch in flight loses that batch's output: it keeps a prefix of what
    its sync twin had, and finishes the same way."""
    aborted = {r["id"] for r in SCENARIOS[name].workload["requests"] if "abort_step" in r}
    outputs = {o["id"]: o for o in layers(name, release)["outputs"]}
    sync = {o["id"]: o for o in sync_layers(name.removesuffix("_async"), release)["outputs"]}
    assert outputs.keys() == sync.keys()
    for rid, output in outputs.items():
        if rid not in aborted:
            assert output == sync[rid], rid
        else:
            tokens, twin = output["output_token_ids"], sync[rid]["output_token_ids"]
            assert tokens == twin[:len(tokens)] and output["finish_reason"] == sync[rid]["finish_reason"], rid


def test_an_abort_with_a_batch_in_flight_drops_that_batch_s_output():
    """abort_states_async: r4 is aborted at iteration 39 while its step-38 batch is in flight;
    the update of that batch (in iteration 39, after the abort) drops its output, so r4 keeps
    one token fewer than under the synchronous loop, where no batch is in flight at an abort."""
    steps = layers("abort_states_async")["steps"]
    dropped = [(s["step"], s["update_iteration"]) for s in steps if s["requests"].get("r4", {}).get("delivery") == "dropped"]
    assert dropped == [(38, 39)]
    assert next(s for s in steps if "r4" in s["aborted"])["iteration"] == 39
    outputs = {o["id"]: o for o in layers("abort_states_async")["outputs"]}
    sync = {o["id"]: o for o in sync_layers("abort_states")["outputs"]}
    assert len(outputs["r4"]["output_token_ids"]) == len(sync["r4"]["output_token_ids"]) - 1


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("name", LOOPS)
def test_the_async_fields_obey_the_loop(name, release):
    """What a port can check its own async records against: updates a step behind, stale output
    only for a request the next step preempts, nothing delivered after a request finished."""
    steps = layers(name, release)["steps"]
    aborts = {r["id"]: r["abort_step"] for r in SCENARIOS[name].workload["requests"] if "abort_step" in r}
    # a reset of the prefix cache with reset_running_requests preempts the running requests and
    # drops their output in flight (vLLM's drop_stale_output): engines/PROTOCOL.md, resets
    resets = {r["step"] for r in SCENARIOS[name].workload.get("prefix_cache_resets", ())
              if r.get("reset_running_requests")}
    finished: set = set()
    for n, s in enumerate(steps):
        assert s["update_iteration"] - s["iteration"] in (0, 1), n
        assert n == 0 or s["iteration"] > steps[n - 1]["iteration"]
        # an abort lands before its iteration's step: finished for an update in that iteration
        finished |= {rid for rid, at in aborts.items() if at <= s["update_iteration"]}
        for rid, r in s["requests"].items():
            if r["delivery"] == "stale":
                assert rid in steps[n + 1]["preempted"] and r["output_placeholders"] == r["computed_tokens"] == 0
            by_reset = s["update_iteration"] in resets and rid in steps[n + 1]["preempted"]
            assert (r["delivery"] == "dropped") == (rid in finished or by_reset), (n, rid)
            if rid in finished or rid in s["finished"]:
                assert r["output_placeholders"] == 0 and r["kv_blocks"] == 0
        finished |= set(s["finished"])


def test_the_library_exercises_the_loop():
    deliveries = {d for n in TWINS for s in layers(n)["steps"] for d in (r["delivery"] for r in s["requests"].values())}
    assert deliveries == {"applied", "stale", "dropped"}
    assert sum(len(s["preempted"]) for s in layers("kv_pressure_async")["steps"]) >= 2


@pytest.mark.parametrize("name", METHODS)
def test_each_method_vllm_allows_runs_the_async_loop_on_every_pin(name):
    for release in PINS.releases:
        config, steps = layers(name, release)["config"][0], layers(name, release)["steps"]
        assert (config["scheduler_class"], config["batch_queue_size"]) == ("AsyncScheduler", 2), release
        assert any(r["delivery"] == "stale" for s in steps for r in s["requests"].values()), release


def test_a_synchronous_scenario_records_no_async_field():
    step = sync_layers("kv_pressure")["steps"][0]
    assert "iteration" not in step and "delivery" not in next(iter(step["requests"].values()))


# --- TEST DEVICE mutants of a port's async loop (engines/vllm/mutants.py) --------------------

MUTANTS = {
    # mutant: (scenario, first step, first field)
    "sync-loop-under-async": ("async_worked_example", 0, "update_iteration"),
    "keep-placeholders-at-preemption": ("async_worked_example", 0, "requests.r1.output_placeholders"),
    # step 1 is deferred (json and regex have tokens in flight): without their drafts delivered
    # the bitmask rows after the first allow every id, the target's unmasked tokens leave the
    # grammar, and the update finishes both as errors
    "async-grammar-drafts-undelivered": ("grammar_eagle3_async", 1, "finished"),
}


@pytest.mark.oracle
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_an_async_loop_mutant_is_caught_where_it_acts(warm_sessions, mutant):
    """Neither mutant changes a synchronous step: only the async scenarios catch them."""
    name, index, path = MUTANTS[mutant]
    scenario = SCENARIOS[name]
    session = warm_sessions(f"{PINS.oracle}+mutant:{mutant}")
    verdict = judge(session.trace(scenario), GOLDENS.load(name, PINS.oracle), "candidate")
    steps = next(c for c in verdict.comparisons if c.layer == "steps")
    assert verdict.kind == "diverged" and not steps.equal
    assert (steps.index, steps.first.path) == (index, path), [f.path for f in steps.fields]
    if mutant == "async-grammar-drafts-undelivered":  # the placeholders the oracle replaced
        found = {f.path: (f.expected, f.actual) for f in steps.fields}
        assert found["requests.regex.invalid_draft_tokens"] == (1, 0)
        assert found["requests.json.bitmask_draft_token_ids[0]"][1] == -1
    plain = session.trace(SCENARIOS["kv_pressure"], ["steps"])
    assert plain.layers["steps"] == sync_layers("kv_pressure")["steps"]
