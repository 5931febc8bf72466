"""Grammars under async scheduling (engines/PROTOCOL.md "Structured outputs", "Under async
scheduling"): what each pin's goldens of the async grammar scenarios say about vLLM's deferred
sampling, the drafts delivered into a deferred step's output (update_draft_token_ids_in_output:
cut by the grammar, padded with -1) and the bitmask computed over them."""

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from tests.helpers import REPO

PINS = load_pins()
NAMES = ("grammar_dflash_async", "grammar_eagle3_async", "grammar_mixed_async", "grammar_kv_pressure_async")
SCENARIOS = {n: load_scenario(REPO / "scenarios" / f"{n}.json") for n in NAMES}
# the releases and the commit pin whose goldens were written (every pin of the gate)
WRITTEN = tuple(p for p in PINS.declared if GOLDENS.path(NAMES[0], p).exists())


def steps(name: str, release: str) -> list[dict]:
    return GOLDENS.load(name, release).layers["steps"]


EOS = {n: {r["id"]: r.get("eos_token_id") for r in s.workload["requests"]} for n, s in SCENARIOS.items()}


def grammar_ids(name: str) -> set[str]:
    return {r["id"] for r in SCENARIOS[name].workload["requests"] if "structured_output" in r}


@pytest.mark.parametrize("release", WRITTEN)
@pytest.mark.parametrize("name", NAMES)
def test_a_deferred_step_holds_the_drafts_cut_and_padded(name, release):
    """In a deferred step each request's drafts in the output are what the model runner
    delivered, trimmed to the drafts scheduled; a grammar request's are the longest prefix its
    grammar accepts, padded with -1 (invalid_draft_tokens of them), and the target accepts none
    past the cut. A step sampled at once keeps the scheduler's -1 placeholders."""
    grammars = grammar_ids(name)
    for step in steps(name, release):
        for rid, entry in step["requests"].items():
            held, invalid = entry["bitmask_draft_token_ids"], entry["invalid_draft_tokens"]
            assert len(held) == entry["draft_tokens"], (step["step"], rid)
            if not step["deferred_sampling"] or entry["delivery"] == "dropped":
                assert held == entry["draft_token_ids"] and invalid == 0, (step["step"], rid)
                continue
            kept = len(held) - invalid
            assert held[kept:] == [-1] * invalid and -1 not in held[:kept], (step["step"], rid)
            if rid in grammars:
                proposed = entry["proposed_draft_token_ids"]
                assert proposed[:kept] == held[:kept] and len(proposed) in (0, len(held)), (step["step"], rid)
                # past a kept eos the grammar has terminated: its rows allow every id, so the
                # target may accept the runner's own drafts there; the stop cuts them at the update
                assert entry["accepted_draft_tokens"] <= kept or (
                    held[kept - 1] == EOS[name][rid] and rid in step["finished"]), (step["step"], rid)
            else:
                assert invalid == 0 and "proposed_draft_token_ids" not in entry


@pytest.mark.parametrize("release", WRITTEN)
def test_the_library_cuts_pads_and_mixes(release):
    """Across the async grammar scenarios: steps deferred and steps sampled at once, drafts cut
    in part (some kept, some -1) and whole, every draft kept and accepted; grammar_mixed_async
    defers a step holding a request without a grammar, whose delivered drafts are never cut."""
    deferred = at_once = partial = whole = all_kept = 0
    for name in NAMES:
        for step in steps(name, release):
            deferred += step["deferred_sampling"]
            at_once += not step["deferred_sampling"] and step["total_num_scheduled_tokens"] > 0
            for entry in step["requests"].values():
                invalid, n = entry["invalid_draft_tokens"], entry["draft_tokens"]
                partial += 0 < invalid < n
                whole += n > 0 and invalid == n
                all_kept += bool(step["deferred_sampling"] and n > 0 and entry.get("proposed_draft_token_ids")
                                 and invalid == 0 and entry["accepted_draft_tokens"] == n)
    assert deferred and at_once and partial and whole and all_kept, (deferred, at_once, partial, whole, all_kept)
    plain = [entry for step in steps("grammar_mixed_async", release) if step["deferred_sampling"]
             for rid, entry in step["requests"].items()
             if rid not in grammar_ids("grammar_mixed_async") and entry["draft_tokens"]]
    assert any(-1 not in entry["bitmask_draft_token_ids"] for entry in plain)


def test_every_pin_has_the_goldens():
    assert set(PINS.releases) < set(WRITTEN)
    for name in NAMES:
        assert all(GOLDENS.path(name, p).exists() for p in WRITTEN), name


@pytest.mark.parametrize("release", WRITTEN)
def test_a_preempted_grammar_request_takes_its_tokens_in_flight_stale(release):
    """grammar_kv_pressure_async: a grammar request preempted while its batch is in flight gets
    that batch's tokens stale (its grammar follows them), is resumed, and generates what its
    synchronous twin does (tests/engines/test_async_loop.py), which is preempted too."""
    records = steps("grammar_kv_pressure_async", release)
    stale = {rid for s in records for rid, e in s["requests"].items() if e["delivery"] == "stale"}
    assert stale & grammar_ids("grammar_kv_pressure_async")
    assert any(s["resumed"] for s in records)
    assert any(s["preempted"] for s in steps("grammar_kv_pressure", release))
