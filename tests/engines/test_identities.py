"""The identities a `steps` record carries (engines/PROTOCOL.md, `steps`: block ids, prefix-cache
hits, drafts, resent token ids, aborts, emitted outputs), read from the oracle's goldens: each
field means what the table says, and each scenario that shares prefixes or aborts shows the
behaviour its description names."""

import pytest

from conformance.formats.pins import load_pins
from conformance.judging.goldens import GOLDENS

ORACLE = load_pins().oracle


def steps(name: str) -> list[dict]:
    return GOLDENS.load(name, ORACLE).layers["steps"]


def outputs(name: str) -> dict[str, dict]:
    return {o["id"]: o for o in GOLDENS.load(name, ORACLE).layers["outputs"]}


def admissions(name: str) -> dict[str, list[tuple[int, int]]]:
    """request id -> (step, cached_tokens) of each admission, new or resumed."""
    seen: dict[str, list[tuple[int, int]]] = {}
    for s in steps(name):
        for rid in s["new"] + s["resumed"]:
            seen.setdefault(rid, []).append((s["step"], s["requests"][rid]["cached_tokens"]))
    return seen


def hits(name: str) -> dict[str, int]:
    """request id -> cached_tokens at its first admission."""
    return {rid: seen[0][1] for rid, seen in admissions(name).items()}


# --- what each field means -----------------------------------------------------------------

def test_running_requests_get_null_without_a_new_block_and_no_hits():
    for s in steps("steady_decode"):
        for rid, r in s["requests"].items():
            if rid not in s["new"]:
                assert r["cached_tokens"] == 0
    running = [r["block_ids"] for s in steps("steady_decode") for rid, r in s["requests"].items()
               if rid not in s["new"]]
    assert None in running and any(b is not None for b in running)


def test_resumed_requests_are_resent_their_tokens_and_new_ones_are_not():
    records = steps("kv_pressure_no_spec_cached")
    resumed = [(s["step"], rid) for s in records for rid in s["resumed"]]
    assert resumed
    for s in records:
        for rid in s["resumed"]:
            assert s["requests"][rid]["resent_token_ids"] is True
        for rid in s["new"]:
            assert s["requests"][rid]["resent_token_ids"] is False
    assert any(cached > 0 for seen in admissions("kv_pressure_no_spec_cached").values() for _, cached in seen[1:])


def test_drafts_scheduled_are_the_drafts_kept_the_step_before():
    """draft_token_ids at step n are next_draft_token_ids of step n - 1, cut to the budget (or
    the -1 placeholders of a padded admission)."""
    checked, before = 0, {}
    for s in steps("drafts_cut_by_budget") + [{"reset": True}] + steps("steady_decode"):
        if "reset" in s:
            before = {}
            continue
        for rid, r in s["requests"].items():
            assert len(r["draft_token_ids"]) == r["draft_tokens"]
            if rid in before and r["draft_token_ids"] and -1 not in r["draft_token_ids"]:
                assert r["draft_token_ids"] == before[rid][:len(r["draft_token_ids"])], (s["step"], rid)
                checked += 1
        before = {rid: r["next_draft_token_ids"] for rid, r in s["requests"].items()}
    assert checked > 100


def test_a_prefill_chunk_emits_no_output():
    records = steps("abort_mid_prefill")
    assert records[0]["requests"]["r0"]["tokens"] == 48 and records[0]["emitted"] == []
    assert all(set(s["emitted"]) <= set(s["requests"]) for s in records)


def test_stop_reason_is_the_stop_token():
    stopped = [o for o in outputs("stop_conditions").values() if o["finish_reason"] == "stop"]
    assert stopped and all(o["stop_reason"] == o["output_token_ids"][-1] for o in stopped)
    assert all(o["stop_reason"] is None for o in outputs("stop_conditions").values() if o["finish_reason"] == "length")


# --- the scenarios that share prefixes and abort ---------------------------------------------

def test_hits_across_requests_in_the_same_step_and_on_blocks_others_hold():
    assert hits("prefix_shared_hits") == {"a": 0, "a2": 64, "b": 64, "c": 48, "d": 64, "e": 0}
    first = steps("prefix_shared_hits")[0]["requests"]
    assert first["a2"]["block_ids"][0][:4] == first["a"]["block_ids"][0][:4]  # a's blocks, cached when scheduled


def test_the_last_block_is_recomputed_on_a_full_hit_only():
    assert hits("prefix_full_hit") == {"a": 0, "b": 48, "c": 0, "d": 64}


def test_hits_on_generated_tokens():
    assert hits("prefix_multi_turn") == {"t1": 0, "t2": 32, "u1": 0, "t3": 64}


def test_eviction_takes_the_prefixs_last_blocks_and_a_waiting_hit_counts_against_the_free_blocks():
    records = steps("prefix_eviction")
    a = records[0]["requests"]["a"]["block_ids"][0]
    big = next(s for s in records if "big" in s["new"])["requests"]["big"]["block_ids"][0]
    assert big[-2:] == [a[5], a[4]]  # the prefix's 6th and 5th blocks, evicted
    assert admissions("prefix_eviction")["b"] == [(12, 64)]  # arrived at 8, waited for big to finish
    assert hits("prefix_eviction")["c"] == 96


def test_several_blocks_under_one_hash():
    assert hits("prefix_duplicate_blocks") == {"a": 0, "b": 48, "c": 48, "big": 0, "d": 48}
    tables = {rid: s["requests"][rid]["block_ids"][0] for s in steps("prefix_duplicate_blocks") for rid in s["new"]}
    assert len({tables["a"][3], tables["b"][3], tables["c"][3]}) == 3  # the 4th block recomputed, each into its own


def test_aborts_while_waiting_running_and_preempted():
    records = steps("abort_states")
    aborted = {rid: s["step"] for s in records for rid in s["aborted"]}
    assert aborted == {"w": 2, "run": 35, "r4": 39}
    assert "w" not in {rid for s in records for rid in s["requests"]}  # never scheduled
    preempted = {rid: s["step"] for s in records for rid in s["preempted"]}
    assert preempted["run"] < aborted["run"] and "run" not in records[aborted["run"] - 1]["running"]
    assert "r4" in records[aborted["r4"] - 1]["running"]
    assert {rid: o["finish_reason"] for rid, o in outputs("abort_states").items()} == {
        "r0": "length", "r1": "length", "r4": "abort", "run": "abort", "w": "abort"}
    assert len(outputs("abort_states")["r4"]["output_token_ids"]) == 3


def test_an_abort_mid_prefill_leaves_its_computed_blocks_to_hit():
    assert hits("abort_mid_prefill") == {"r0": 0, "r1": 96}
    assert steps("abort_mid_prefill")[2]["aborted"] == ["r0"]


def test_hits_after_preemption():
    for name in ("kv_pressure_no_spec_cached", "eagle_kv_pressure_cached", "priority_kv_pressure_cached"):
        resumed = [cached for seen in admissions(name).values() for _, cached in seen[1:]]
        assert resumed and max(resumed) > 0, name


@pytest.mark.parametrize("name, dropped", [("prefix_eagle3", True), ("prefix_dflash", True), ("prefix_mtp", True),
                                           ("prefix_draft_model", False), ("prefix_pard", False),
                                           ("prefix_ngram", False)])
def test_each_speculative_method_drops_the_last_hit_block_or_not(name, dropped):
    """b shares the prefix's 4 blocks, c is the prefix alone (a full hit), d continues a's turn
    (5 blocks cached): EAGLE-family methods drop the last hit block."""
    expected = {"b": 48, "c": 32, "d": 64} if dropped else {"b": 64, "c": 48, "d": 80}
    assert {rid: n for rid, n in hits(name).items() if rid != "a"} == expected
