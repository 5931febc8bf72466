"""A workload's streaming input sessions: the schema (conformance/formats/sessions.py), the
chunks' tokens, the order the driver gives a step's inputs, and the feature they need."""

import pytest

from conformance.formats.features import needed
from conformance.formats.scenario import ScenarioError
from conformance.formats.sessions import inputs_by_step
from conformance.formats.workload import chunk_tokens, prefix_tokens, prompt_tokens, validate_workload

ARGS = {"max_model_len": 200}


def workload(*requests, **top):
    return {"seed": 1, "vocab_size": 1000, "max_steps": 50, "requests": list(requests), **top}


def session(chunks, end_step, **req):
    return {"id": "s", "arrival_step": 1, "prompt_len": 10, "max_tokens": 4,
            "session": {"chunks": chunks, "end_step": end_step}, **req}


def test_a_session_keeps_its_chunks_with_their_max_tokens_filled_in():
    w = validate_workload(workload(session([{"arrival_step": 1, "prompt_len": 5},
                                            {"arrival_step": 7, "prompt_len": 3, "max_tokens": 9}], 7)),
                          "x.json", ARGS)
    assert w["requests"][0]["session"] == {
        "chunks": [{"arrival_step": 1, "prompt_len": 5, "max_tokens": 4},
                   {"arrival_step": 7, "prompt_len": 3, "max_tokens": 9}], "end_step": 7}
    # no chunk at all: the session is its prompt, ended later
    assert validate_workload(workload(session([], 1)), "x.json", ARGS)["requests"][0]["session"]["chunks"] == []


@pytest.mark.parametrize("req, field, words", [
    (session([{"arrival_step": 0, "prompt_len": 5}], 3), "workload.requests[0].session.chunks[0].arrival_step",
     "between 1 and 49"),
    (session([{"arrival_step": 5, "prompt_len": 5}, {"arrival_step": 4, "prompt_len": 5}], 6),
     "workload.requests[0].session.chunks[1].arrival_step", "between 5 and 49"),
    (session([{"arrival_step": 5, "prompt_len": 5}], 4), "workload.requests[0].session.end_step", "between 5 and 49"),
    (session([{"arrival_step": 5, "prompt_len": 0}], 6), "workload.requests[0].session.chunks[0].prompt_len",
     "between 1 and 200"),
    (session([{"arrival_step": 5, "prompt_len": 1, "max_tokens": 0}], 6),
     "workload.requests[0].session.chunks[0].max_tokens", "between 1 and 200"),
    (session([{"arrival_step": 5}], 6), "workload.requests[0].session.chunks[0].prompt_len", "is required"),
    (session([{"arrival_step": 5, "prompt_len": 1, "tokens": [1]}], 6),
     "workload.requests[0].session.chunks[0].tokens", "unknown key"),
    ({**session([], 6), "session": {"chunks": []}}, "workload.requests[0].session.end_step", "is required"),
    ({**session([], 6), "session": {"chunks": {}, "end_step": 6}}, "workload.requests[0].session.chunks",
     "must be an array"),
    (session([], 6, abort_step=3), "workload.requests[0].session", "cannot go with the request's `abort_step`"),
    (session([], 6, structured_output={"regex": "a+"}), "workload.requests[0].session",
     "cannot go with the request's `structured_output`"),
    (session([{"arrival_step": 5, "prompt_len": 100}, {"arrival_step": 6, "prompt_len": 80}], 6),
     "workload.requests[0].session", "come to 202 tokens, over engine_args.max_model_len = 200"),
])
def test_a_bad_session_is_refused_naming_the_field(req, field, words):
    with pytest.raises(ScenarioError) as err:
        validate_workload(workload(req), "x.json", ARGS)
    assert err.value.field == field and words in err.value.problem, err.value.problem


def test_no_request_continues_a_session():
    later = {"id": "t", "arrival_step": 9, "prompt_len": 1, "max_tokens": 1, "continues": "s"}
    with pytest.raises(ScenarioError) as err:
        validate_workload(workload(session([], 6), later), "x.json", ARGS)
    assert err.value.field == "workload.requests[1].continues" and "a streaming session" in err.value.problem


def test_chunk_tokens_are_no_requests_nor_prefixes():
    chunk = chunk_tokens(1, "s", 0, 20, 1000)
    assert chunk == chunk_tokens(1, "s", 0, 20, 1000) == prompt_tokens(1, "chunk/s/0", 20, 1000)
    assert chunk != chunk_tokens(1, "s", 1, 20, 1000) and chunk != prompt_tokens(1, "s", 20, 1000)
    assert chunk != prefix_tokens(1, "s", 20, 1000)


def test_a_steps_inputs_are_chunks_then_ends_in_workload_order():
    a = session([{"arrival_step": 2, "prompt_len": 1}, {"arrival_step": 4, "prompt_len": 1}], 4)
    b = {**session([{"arrival_step": 4, "prompt_len": 1}], 5), "id": "b"}
    w = validate_workload(workload(a, b), "x.json", ARGS)
    by_step = {step: [(req["id"], j) for req, j in inputs] for step, inputs in inputs_by_step(w).items()}
    assert by_step == {2: [("s", 0)], 4: [("s", 1), ("b", 0), ("s", None)], 5: [("b", None)]}


def test_a_session_needs_the_streaming_input_feature():
    assert needed({}, workload(session([], 3))) == ("prefix_caching", "streaming_input")
    assert "streaming_input" not in needed({}, workload({"id": "a"}))
