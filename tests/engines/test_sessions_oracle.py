"""Streaming input sessions in the stand-in layers (engines/vllm/new_requests.py session_inputs,
engines/PROTOCOL.md "Streaming input sessions"): what each pin's goldens of the session scenarios
say, checked against the workload and the scenarios' descriptions."""

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from tests.helpers import REPO

PINS = load_pins()
SESSIONS = [s for s in (load_scenario(p) for p in sorted(REPO.glob("scenarios/streaming_*.json")))
            if "streaming_input" in s.features]


def layers(name: str, release: str) -> dict:
    return GOLDENS.load(name, release).layers


def test_the_library_has_the_session_scenarios():
    assert {s.name for s in SESSIONS} >= {"streaming_session_chunks", "streaming_session_slots",
                                          "streaming_session_preemption", "streaming_session_drafts",
                                          "streaming_session_batch_queue", "streaming_session_stops"}


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", SESSIONS, ids=[s.name for s in SESSIONS])
def test_a_session_is_admitted_once_per_input_chunk_and_finishes_once(scenario, release):
    """Each chunk that runs is a new admission of the session's id (its first prompt and each
    later chunk: none is lost, none runs twice), and the session finishes once, at or after the
    end of its input."""
    steps = layers(scenario.name, release)["steps"]
    for req in scenario.workload["requests"]:
        if "session" not in req:
            continue
        rid, session = req["id"], req["session"]
        admitted = [st["step"] for st in steps if rid in st["new"]]
        assert len(admitted) == 1 + len(session["chunks"]), (rid, admitted)
        ended = [st["step"] for st in steps if rid in st["finished"] or rid in st.get("aborted", ())]
        assert len(ended) == 1 and ended[0] >= min(session["end_step"], len(steps) - 1), (rid, ended)


@pytest.mark.parametrize("release", PINS.releases)
def test_the_session_scenarios_show_what_they_claim(release):
    chunks = layers("streaming_session_chunks", release)
    steps = chunks["steps"]
    # the queued chunk starts as the first stops: new again, with its computed tokens
    assert "s0" in steps[5]["waiting"] and "s0" in steps[6]["new"]
    assert steps[6]["requests"]["s0"]["cached_tokens"] == 45
    # waiting for input: listed as waiting, scheduled nothing, until its input ends (an abort)
    assert all(st["waiting"] == ["s0"] and not st["requests"] for st in steps[24:30])
    assert steps[30]["aborted"] == ["s0"]
    finish = {o["id"]: o["finish_reason"] for o in chunks["outputs"]}
    assert finish == {"r1": "length", "s0": "abort", "s2": "length"}

    # a session waiting for input holds a slot: r2 waits beside a single running request
    slots = layers("streaming_session_slots", release)["steps"]
    held = [st["step"] for st in slots if "r2" in st["waiting"]]
    assert held == list(range(4, 10)) and all(slots[n]["running"] == ["r1"] for n in held[:-1])  # r1 ends at 9
    assert slots[10]["new"] == ["r2"]

    # preempted after its second chunk, it resumes on the blocks of its first two
    pressure = layers("streaming_session_preemption", release)["steps"]
    assert pressure[1]["requests"]["r1"]["cached_tokens"] == 32
    assert [st["step"] for st in pressure if "s0" in st["preempted"]] == [33]
    resumed = next(st for st in pressure if "s0" in st["resumed"])
    assert resumed["step"] == 74 and resumed["requests"]["s0"]["cached_tokens"] == 80

    # a chunk stopped by a stop token does not end the session, and leaves its stop_reason set
    stops = layers("streaming_session_stops", release)
    assert "s0" in stops["steps"][2]["waiting"] and stops["steps"][3]["new"] == ["s0"]
    s0 = next(o for o in stops["outputs"] if o["id"] == "s0")
    assert (s0["finish_reason"], s0["stop_reason"]) == ("length", 63672)
    assert 63672 not in s0["output_token_ids"]
