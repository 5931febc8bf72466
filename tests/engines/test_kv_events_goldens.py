"""KV cache events and prefix-cache resets on every pin's golden: the rules engines/PROTOCOL.md
states ("KV cache events", "Prefix-cache resets") and what the scenarios' descriptions claim,
checked on the oracle's own records (no engine is started here)."""

from collections import Counter

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from tests.helpers import REPO

PINS = load_pins()
EVERY_PIN = (*PINS.releases, "aa8f6dc6e67f")  # the commit pin the library's goldens are written by
EVENTS = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))
          if {"kv_cache_events", "prefix_cache_resets"} & set(load_scenario(p).features)]
WITH_EVENTS = [s for s in EVENTS if "kv_cache_events" in s.features]
WITH_RESETS = [s for s in EVENTS if "prefix_cache_resets" in s.features]


def steps(name: str, pin: str) -> list[dict]:
    return GOLDENS.load(name, pin).layers["steps"]


def test_the_families_have_their_scenarios():
    assert {s.name for s in WITH_EVENTS} >= {"kv_events_prefix_hits", "kv_events_eviction", "kv_events_eagle3",
                                             "kv_events_async_scheduling", "prefix_cache_reset_idle"}
    assert {s.name for s in WITH_RESETS} == {"prefix_cache_reset_idle", "prefix_cache_reset_running",
                                             "prefix_cache_reset_connector", "prefix_cache_reset_async_scheduling"}


@pytest.mark.parametrize("pin", EVERY_PIN)
@pytest.mark.parametrize("scenario", WITH_EVENTS, ids=[s.name for s in WITH_EVENTS])
def test_hashes_are_numbered_and_the_events_follow_the_cache(scenario, pin):
    """Numbers in order of first appearance; a router's view built from the events (a count per
    hash: stores add, removals take away, a clear empties) never removes what it does not hold,
    and, where no request reports its hits in full, holds as many blocks as the step's
    kv_blocks.cached says, after every step."""
    seen: set = set()
    view: Counter = Counter()
    full = any(r.get("kv_cache_report_mode") == "full" for r in scenario.workload["requests"])
    for step in steps(scenario.name, pin):
        for event in step["kv_events"]:
            for number in [*event.get("block_hashes", ()), event.get("parent_block_hash")]:
                if number is not None and number not in seen:
                    assert number == len(seen), (step["step"], event)
                    seen.add(number)
            if event["type"] == "BlockStored":
                assert event["parent_block_hash"] is None or event["parent_block_hash"] in seen
                assert len(event["token_ids"]) == event["block_size"] * len(event["block_hashes"])
                assert event["medium"] == "GPU" and event["kv_cache_spec_kind"] in ("full_attention", "sliding_window")
                view.update(event["block_hashes"])
            elif event["type"] == "BlockRemoved":
                (number,) = event["block_hashes"]
                assert view[number] > 0, (step["step"], event)
                view[number] -= 1
            else:
                view.clear()
        if not full:
            assert sum(view.values()) == step["kv_blocks"]["cached"], step["step"]
    assert seen


@pytest.mark.parametrize("pin", EVERY_PIN)
@pytest.mark.parametrize("scenario", WITH_RESETS, ids=[s.name for s in WITH_RESETS])
def test_a_reset_succeeds_exactly_when_no_block_is_held(scenario, pin):
    """The result of each reset, and what it did to the cache: refused while a request holds a
    block (unless the running requests are preempted first), then the cache is as it was;
    made, every hash forgotten (an AllBlocksCleared first in the step's events, with events on)."""
    records = steps(scenario.name, pin)
    resets = {r["step"]: r for r in scenario.workload["prefix_cache_resets"]}
    sync = scenario.engine_args["async_scheduling"] is False
    made = [st for st in records if st["prefix_cache_reset"] is not None]
    assert len(made) == len(resets)
    for st in made:
        events = st.get("kv_events")
        if not st["prefix_cache_reset"]:
            assert events is None or {"type": "AllBlocksCleared"} not in events
        elif events is not None and sync:
            assert events[0] == {"type": "AllBlocksCleared"}
    if sync:  # a step is a driver step: the reset ran after the step before's update
        for at, reset in resets.items():
            held = records[at - 1]["kv_blocks"]["used"] if at else 0
            assert records[at]["prefix_cache_reset"] is (held == 0 or reset.get("reset_running_requests", False))
            if reset.get("reset_running_requests"):
                assert records[at]["preempted"] == records[at - 1]["running"] == records[at]["resumed"]


def hits(records: list[dict]) -> dict[str, int]:
    return {rid: r["cached_tokens"] for st in records for rid, r in st["requests"].items()
            if rid in st["new"] or rid in st["resumed"]}


@pytest.mark.parametrize("pin", EVERY_PIN)
def test_the_reset_scenarios_do_what_their_descriptions_say(pin):
    idle = steps("prefix_cache_reset_idle", pin)
    assert [st["prefix_cache_reset"] for st in idle[3:13]] == [None, False] + [None] * 5 + [True, True, None]
    assert hits(idle) == {"a": 0, "b": 48, "c": 0, "d": 48}  # c after the reset, d on c's blocks
    assert idle[10]["kv_blocks"]["cached"] == 0 and idle[9]["kv_blocks"]["cached"] == 3
    running = steps("prefix_cache_reset_running", pin)
    assert running[5]["prefix_cache_reset"] is True and running[5]["preempted"] == ["a", "b"]
    assert {rid: r["cached_tokens"] for rid, r in running[5]["requests"].items()} == {"a": 0, "b": 64}
    connector = steps("prefix_cache_reset_connector", pin)
    assert [connector[i]["prefix_cache_reset"] for i in (3, 4, 8)] == [False, True, True]
    assert hits(connector[9:]) == {"c": 0}
    later = steps("prefix_cache_reset_async_scheduling", pin)
    made = [(st["step"], st["prefix_cache_reset"], st["preempted"], st["new"]) for st in later
            if st["prefix_cache_reset"] is not None]
    assert made == [(4, True, ["a", "b"], []), (7, False, [], []), (13, True, [], ["c"])]
    assert hits(later)["c"] == 0


@pytest.mark.parametrize("pin", EVERY_PIN)
def test_the_event_scenarios_do_what_their_descriptions_say(pin):
    hits_ = steps("kv_events_prefix_hits", pin)
    stored = {st["step"]: [(e["block_hashes"], e["parent_block_hash"], e["lora_name"]) for e in st["kv_events"]
                           if e["type"] == "BlockStored"] for st in hits_}
    assert stored[0] == [([0, 1, 2, 3], None, None)]
    # b hits 32 and stores its third block; c (report mode full) also reports the two it hit
    assert stored[2] == [([4], 1, None), ([0, 1], None, None), ([5], 1, None)]
    # d runs adapter alpha: the same prompt tokens, other hashes, its adapter's keys
    (d,) = [e for e in hits_[3]["kv_events"]]
    assert d["block_hashes"] == [6, 7, 8] and d["lora_name"] == "alpha" and d["lora_id"] == 1
    assert d["extra_keys"] is not None and all("alpha" in str(k) for k in d["extra_keys"])
    # e (alpha, full) reports d's blocks it hit, then stores its own
    assert [e["block_hashes"] for e in hits_[8]["kv_events"]] == [[6, 7], [9]]
    eviction = steps("kv_events_eviction", pin)
    assert [(e["type"], e["block_hashes"][:1]) for e in eviction[6]["kv_events"]] == [
        ("BlockRemoved", [5]), ("BlockRemoved", [4]), ("BlockStored", [6])]
    eagle = steps("kv_events_eagle3", pin)
    assert eagle[4]["requests"]["b"]["cached_tokens"] == 32
    if pin == "0.33.0":  # a block's hash takes the token after it, and no hit block is dropped
        assert [e["block_hashes"] for e in eagle[4]["kv_events"]] == [[4]]  # b's own third block
        assert eagle[6]["requests"]["c"]["cached_tokens"] == 32
    else:  # 48 shared tokens, the last hit block dropped: b stores it again, as a stored it
        assert [e["block_hashes"] for e in eagle[4]["kv_events"]] == [[2]]
        assert eagle[6]["requests"]["c"]["cached_tokens"] == 16
    hybrid = steps("kv_events_sliding_window", pin)
    assert {(e["group_idx"], e["kv_cache_spec_kind"], e["kv_cache_spec_sliding_window"])
            for e in hybrid[0]["kv_events"]} in ({(0, "sliding_window", 128), (1, "full_attention", None)},
                                                 {(0, "full_attention", None), (1, "sliding_window", 128)})
    # b's full report: all 18 hit blocks in each group, then its own two
    assert [e["block_hashes"] for e in hybrid[2]["kv_events"]] == [list(range(18))] * 2 + [[20, 21]] * 2
