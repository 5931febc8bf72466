"""Integration, per-step layer: the real scheduler of each pin, driven by the stand-in."""


import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import make_trace
from conformance.gate.runner import failure_trace
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import judge
from conformance.process.client import EngineFailure
from conformance.report.render_text import render
from conftest import REPO

pytestmark = pytest.mark.oracle
PINS = load_pins()
SCENARIOS = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))]
# stand-in driven, the library (production scenarios: tests/test_scale_oracle.py)
WORKLOADS = [s for s in SCENARIOS if s.workload is not None and s.engine is None and s.scale == "library"]
IDS = [s.name for s in WORKLOADS]


def golden(scenario, release=PINS.oracle):
    return GOLDENS.load(scenario.name, release)


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", WORKLOADS, ids=IDS)
def test_speculation_is_lossless(warm_workers, release, scenario):
    """Accepted drafts are the target's own tokens: outputs with and without spec are equal."""
    proc = warm_workers(release)
    spec = proc.run(scenario, ["outputs"])["outputs"]
    plain = proc.run(scenario.without_speculation(), ["outputs"])["outputs"]
    assert spec == plain
    assert all(r["output_token_ids"] for r in spec)


@pytest.mark.parametrize("scenario", WORKLOADS, ids=IDS)
def test_outputs_identical_across_pins(scenario):
    outputs = {r: golden(scenario, r)["layers"]["outputs"] for r in PINS.releases}
    assert all(o == outputs[PINS.oracle] for o in outputs.values()), scenario.name


def test_scenario_library_exercises_what_it_claims():
    steps = {s.name: golden(s)["layers"]["steps"] for s in WORKLOADS}
    outputs = {s.name: golden(s)["layers"]["outputs"] for s in WORKLOADS}
    assert any(st["preempted"] for st in steps["kv_pressure"]) and any(st["resumed"] for st in steps["kv_pressure"])
    assert steps["prefill_budget_binds"][0]["total_num_scheduled_tokens"] == 4036  # the budget binds
    assert {r["finish_reason"] for r in outputs["stop_conditions"]} == {"stop", "length"}
    assert any(st["new"] for st in steps["staggered_arrivals"][1:])  # arrivals after step 0
    drafts = {req["draft_tokens"] for st in steps["steady_decode"] for req in st["requests"].values()}
    assert 16 in drafts


@pytest.mark.xdist_group("0.28.0")  # with the other tests of that pin's warm worker
def test_later_pin_is_reported_where_the_budget_binds(warm_workers):
    """0.28.0 vs the 0.27.1 golden: the first step where the budget binds, per-request counts."""
    scenario = next(s for s in WORKLOADS if s.name == "prefill_budget_binds")
    proc = warm_workers("0.28.0")
    trace = make_trace("vllm-0.28.0", proc.hello, scenario, proc.run(scenario, scenario.layers))
    verdict = judge(trace, golden(scenario), "candidate")
    steps = next(c for c in verdict.comparisons if c.layer == "steps")
    assert steps.index == 0 and steps.first.path == "requests.r1.tokens"
    assert (steps.first.expected, steps.first.actual) == (1036, 1064)
    text = render([verdict], PINS.oracle)
    assert "! r1       new 1036 / 0 / 0 -> 1036 / 0 / 66   new 1064 / 0 / 0 -> 1064 / 0 / 68" in text


MUTANTS = {
    # mutant: (scenario that must catch it, layer, first field)
    "no-draft-reservation": ("prefill_budget_binds", "steps", "requests.r1.tokens"),
    "draft-plus-one": ("steady_decode", "steps", None),
    "draft-minus-one": ("steady_decode", "steps", None),
    "ignore-max-num-seqs": ("prefill_budget_binds", "steps", None),
    "crash-after-divergence": ("prefill_budget_binds", "steps", "requests.r1.tokens"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_every_mutant_is_caught(warm_workers, mutant):
    """Each injected bug (a TEST DEVICE on the oracle pin) diverges from the oracle's golden."""
    name, layer, field = MUTANTS[mutant]
    scenario = next(s for s in WORKLOADS if s.name == name)
    proc = warm_workers(f"{PINS.oracle}+mutant:{mutant}")  # its own process, shared with other tests
    assert proc.hello["engine"] == f"vllm+mutant:{mutant}"
    try:
        trace = make_trace(f"mutant-{mutant}", proc.hello, scenario, proc.run(scenario, scenario.layers))
    except EngineFailure as failure:  # as the runner keeps it: the records sent, and why it ended
        trace = failure_trace(proc.spec, proc.hello, scenario, failure)
    verdict = judge(trace, golden(scenario), "candidate")
    assert verdict.kind == "diverged"
    if mutant == "crash-after-divergence":
        # the divergence at step 0 before the crash at step 3 is the verdict, and the report
        # shows the engine's traceback, where a bare AssertionError alone would say nothing
        assert verdict.failure == "engine_error" and "AssertionError" in verdict.message
        assert "Traceback (most recent call last)" in verdict.message
        assert "assert self._parity_calls < 4" in verdict.message
        assert len(trace["layers"]["steps"]) == 3
    comparison = next(c for c in verdict.comparisons if c.layer == layer)
    assert not comparison.equal
    if mutant in ("no-draft-reservation", "crash-after-divergence"):
        # the seed's bug: named at its first step, with the token counts on both sides
        assert comparison.index == 0 and comparison.first.path == field
        assert (comparison.first.expected, comparison.first.actual) == (1036, 1096)
        assert "total_num_scheduled_tokens" in [f.path for f in comparison.fields]
    if mutant.startswith("draft-"):
        e, a = comparison.record["requests"], comparison.actual_record["requests"]
        delta = 1 if mutant == "draft-plus-one" else -1
        assert any(a[r]["draft_tokens"] == e[r]["draft_tokens"] + delta for r in e if r in a)
