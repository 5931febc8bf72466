"""Encoder inputs on the real scheduler of each pin: the encoder budget is the release's own,
and the encoder_* scenarios show what their descriptions claim, on every pin's golden."""

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from tests.helpers import REPO, records_of

pytestmark = pytest.mark.oracle
PINS = load_pins()
NAMES = ("encoder_budget_binding", "encoder_cache_hits", "encoder_prefix_cache_miss", "encoder_preemption",
         "encoder_unchunked_items", "encoder_aborts", "encoder_cache_hits_async")
SCENARIOS = {name: load_scenario(REPO / "scenarios" / f"{name}.json") for name in NAMES}
PIN_NAMES = PINS.releases  # the base commit's goldens equal 0.27.1's (tests/bisect/test_commit_pins.py)


def steps(name: str, release: str) -> list[dict]:
    return GOLDENS.load(name, release).layers["steps"]


@pytest.mark.parametrize("release", PIN_NAMES)
@pytest.mark.parametrize("name", NAMES)
def test_every_pin_computes_the_encoder_budget_from_the_model(name, release):
    """max(max_num_batched_tokens, the most tokens one item of the tiny model makes: 50)."""
    config = GOLDENS.load(name, release).layers["config"][0]
    assert config["encoder_compute_budget"] == config["encoder_cache_size"] == max(
        config["max_num_batched_tokens"], 50)


def test_a_live_run_states_the_budget_its_scheduler_holds(warm_sessions):
    """The oracle's own run, not the golden: a bigger token budget gives a bigger encoder budget
    (the release's compute_mm_encoder_budget), and a text model gives none."""
    session = warm_sessions(PINS.oracle)
    scenario = SCENARIOS["encoder_cache_hits"]
    config = records_of(session, scenario, ["config"])["config"][0]
    assert (config["encoder_compute_budget"], config["encoder_cache_size"]) == (64, 64)
    text = load_scenario(REPO / "scenarios" / "lora_max_loras_admission.json")
    assert "encoder_compute_budget" not in records_of(session, text, ["config"])["config"][0]


@pytest.mark.parametrize("release", PIN_NAMES)
def test_the_scenarios_show_what_they_claim(release):
    budget = steps("encoder_budget_binding", release)
    assert budget[0]["encoder_inputs"] == {"r0": [0]} and budget[0]["requests"]["r1"]["tokens"] == 10
    assert "r2" not in budget[0]["requests"] and budget[0]["waiting"] == ["r2"]
    assert [("r1" in st["requests"]) for st in budget[1:3]] == [False, False]  # the cache, not the budget
    assert budget[3]["encoder_inputs"] == {"r1": [0]} and budget[3]["freed_encoder_inputs"] == ["clip0"]
    assert next(i for i, st in enumerate(budget) if "r2" in st["requests"]) == 6

    hits = steps("encoder_cache_hits", release)
    assert hits[0]["encoder_inputs"] == {"r0": [0]} and hits[0]["requests"]["r1"]["tokens"] == 24
    assert hits[3]["encoder_inputs"] == {} and hits[3]["requests"]["r3"]["tokens"] == 8
    assert hits[4]["encoder_inputs"] == {"r3": [0]} and hits[4]["freed_encoder_inputs"] == ["shared"]
    assert hits[12]["encoder_inputs"] == {"r4": [0]} and hits[12]["freed_encoder_inputs"] == ["other"]

    miss = steps("encoder_prefix_cache_miss", release)
    assert miss[4]["freed_encoder_inputs"] == ["img"]
    assert [("r2" in st["waiting"]) for st in miss[6:8]] == [True, True]
    assert miss[8]["requests"]["r2"]["cached_tokens"] == 48 and miss[8]["encoder_inputs"] == {"r2": [0]}
    assert miss[8]["freed_encoder_inputs"] == ["big"]

    preempt = steps("encoder_preemption", release)
    assert preempt[2]["preempted"] == ["r1"] and preempt[2]["encoder_inputs"] == {}
    assert preempt[2]["encoder_cache"] == {"free": 16, "freeable": 64}  # b allocated, then no longer held
    resumed = next(st for st in preempt if st["resumed"] == ["r1"])
    assert resumed["step"] == 21 and resumed["requests"]["r1"]["cached_tokens"] == 64
    assert resumed["encoder_inputs"] == {}  # b hit in the encoder cache

    unchunked = steps("encoder_unchunked_items", release)
    assert {r: e["tokens"] for r, e in unchunked[0]["requests"].items()} == {"r0": 40, "r1": 10}
    assert unchunked[1]["encoder_inputs"] == {"r0": [0]} and "r1" not in unchunked[1]["requests"]
    assert unchunked[2]["encoder_inputs"] == {"r1": [0]} and unchunked[2]["freed_encoder_inputs"] == ["x"]


@pytest.mark.parametrize("release", PIN_NAMES)
def test_aborts_free_the_encoder_cache(release):
    aborts = steps("encoder_aborts", release)
    assert aborts[0]["encoder_inputs"] == {"r0": [0]} and "r1" not in aborts[0]["requests"]
    # 0.33.0 requeues r1, stuck at its placeholder, and schedules r2 behind it (upstream-changes.toml)
    behind = release.startswith("0.33")
    assert ("r2" in aborts[0]["requests"]) == behind and ("r2" in aborts[0]["waiting"]) != behind
    assert aborts[1]["aborted"] == ["r2"] and aborts[2]["aborted"] == ["r0"]
    assert aborts[2]["encoder_inputs"] == {"r1": [0]} and aborts[2]["freed_encoder_inputs"] == ["c0"]


@pytest.mark.parametrize("release", PIN_NAMES)
def test_async_scheduling_evicts_one_schedule_later(release):
    """The batch-queue loop: r2's prefill update in flight at step 4 keeps `shared` referenced."""
    hits = steps("encoder_cache_hits_async", release)
    assert hits[0]["encoder_inputs"] == {"r0": [0]} and hits[3]["requests"]["r3"]["tokens"] == 8
    assert "r3" not in hits[4]["requests"]
    assert hits[5]["encoder_inputs"] == {"r3": [0]} and hits[5]["freed_encoder_inputs"] == ["shared"]
    assert hits[12]["encoder_inputs"] == {"r4": [0]} and hits[12]["freed_encoder_inputs"] == ["other"]
