"""The workload validator and the deterministic stand-in (not a model)."""

import json
import shutil

import pytest

from conformance.formats.features import needed
from conformance.formats.scenario import ScenarioError, load_scenario
from conformance.formats.workload import (allowed_ids, check_stop, draft, expected_output, masked_choice, prefix_tokens,
                                          prompt_tokens, repeats, request_prompts, target_next, validate_workload,
                                          verify, verify_masked)
from tests.helpers import REPO


def test_stand_in_is_a_pure_function():
    tokens = prompt_tokens(1, "r0", 50, 1000)
    assert tokens == prompt_tokens(1, "r0", 50, 1000)
    assert tokens != prompt_tokens(2, "r0", 50, 1000) and tokens != prompt_tokens(1, "r1", 50, 1000)
    assert all(0 <= t < 1000 for t in tokens)
    assert target_next(1, tokens, 1000) == target_next(1, list(tokens), 1000)


@pytest.mark.parametrize("accept", [0, 1, 5, 8, 20])
def test_drafts_verify_to_the_target_sequence(accept):
    seed, vocab, k = 3, 97, 8
    tokens = prompt_tokens(seed, "r", 30, vocab)
    drafts = draft(seed, tokens, k, accept, vocab)
    assert len(drafts) == k
    sampled = verify(seed, tokens, drafts, vocab)
    assert len(sampled) == min(accept, k) + 1
    # whatever was accepted, the tokens are exactly what the target alone would produce
    expected, seq = [], list(tokens)
    for _ in sampled:
        expected.append(target_next(seed, seq, vocab))
        seq.append(expected[-1])
    assert sampled == expected


@pytest.mark.parametrize("mutate, field", [
    (lambda w: w["requests"][0].update(prompt_len=9000), "workload.requests[0]"),
    (lambda w: w["requests"][0].update(id="../x"), "workload.requests[0].id"),
    (lambda w: w["requests"].append(dict(w["requests"][0])), "workload.requests[1].id"),
    (lambda w: w.update(vocab_size=True), "workload.vocab_size"),
    (lambda w: w.update(bogus=1), "workload.bogus"),
    (lambda w: w["requests"][0].update(acceptance=[-1]), "workload.requests[0].acceptance"),
])
def test_bad_workload_names_the_field(tmp_path, mutate, field):
    shutil.copytree(REPO / "scenarios" / "models", tmp_path / "models")
    data = json.loads((REPO / "scenarios" / "prefill_budget_binds.json").read_text())
    data["workload"]["requests"] = data["workload"]["requests"][:1]
    mutate(data["workload"])
    (tmp_path / "s.json").write_text(json.dumps(data))
    with pytest.raises(ScenarioError) as err:
        load_scenario(tmp_path / "s.json")
    assert err.value.field.startswith(field), err.value


# --- shared prefixes, continuations, aborts -------------------------------------------------

def workload(*requests, prefixes=None, seed=7, vocab=1000, max_steps=50):
    raw = {"seed": seed, "vocab_size": vocab, "max_steps": max_steps, "requests": list(requests)}
    if prefixes is not None:
        raw["prefixes"] = prefixes
    return raw


def req(rid, plen, max_tokens=3, arrival=0, **extra):
    return {"id": rid, "arrival_step": arrival, "prompt_len": plen, "max_tokens": max_tokens, **extra}


def test_worked_values_of_prefixes_and_continuations():
    """The values engines/PROTOCOL.md states, and the C++ kit's stand-in must reproduce."""
    t = prompt_tokens(7, "r0", 4, 1000)
    assert prefix_tokens(7, "sys", 4, 1000) == [376, 287, 538, 275]
    assert expected_output(7, t, 3, [], 100, 1000) == [744, 524, 481]
    assert expected_output(7, t, 3, [], 100, 1000) == verify(7, t, draft(7, t, 4, 2, 1000), 1000)
    assert expected_output(7, t, 5, [524], 100, 1000) == [744, 524]  # the stop token is kept
    assert expected_output(7, t, 5, [], 6, 1000) == [744, 524]  # max_model_len: 4 + 2 tokens
    w = validate_workload(workload(req("r0", 4), req("r1", 2, continues="r0")), "s", {"max_model_len": 100})
    assert request_prompts(w, 100)["r1"] == [956, 25, 201, 167, 744, 524, 481, 892, 264]


def test_requests_sharing_a_prefix_share_its_tokens_exactly():
    w = validate_workload(workload(req("a", 3, prefix="sys"), req("b", 0, prefix="sys"), req("c", 5),
                                   prefixes=[{"name": "sys", "len": 8}]), "s", {"max_model_len": 100})
    prompts = request_prompts(w, 100)
    sys_tokens = prefix_tokens(7, "sys", 8, 1000)
    assert prompts["a"] == sys_tokens + prompt_tokens(7, "a", 3, 1000)
    assert prompts["b"] == sys_tokens  # a prompt that is the prefix exactly: a full hit
    assert prompts["c"] == prompt_tokens(7, "c", 5, 1000)
    assert prefix_tokens(7, "a", 3, 1000) != prompt_tokens(7, "a", 3, 1000)  # "prefix/" + name


def test_a_continuation_of_a_request_that_stops_early_continues_after_its_stop():
    stop = expected_output(7, prompt_tokens(7, "r0", 4, 1000), 10, [], 100, 1000)[3]
    w = validate_workload(workload(req("r0", 4, max_tokens=10, stop_token_ids=[stop]),
                                   req("r1", 1, continues="r0"), req("r2", 0, continues="r1")),
                          "s", {"max_model_len": 100})
    prompts = request_prompts(w, 100)
    r0 = prompt_tokens(7, "r0", 4, 1000)
    out0 = expected_output(7, r0, 10, [stop], 100, 1000)
    assert len(out0) == 4 and out0[-1] == stop
    assert prompts["r1"] == r0 + out0 + prompt_tokens(7, "r1", 1, 1000)
    assert prompts["r2"] == prompts["r1"] + expected_output(7, prompts["r1"], 3, [], 100, 1000)


def test_optional_keys_are_kept_only_when_given():
    """So a scenario that uses none of them hashes and runs as before."""
    w = validate_workload(workload(req("a", 3), req("b", 1, prefix="p", abort_step=4, priority=0),
                                   req("c", 1, priority=-2), prefixes=[{"name": "p", "len": 2}]),
                          "s", {"max_model_len": 100})
    assert set(w["requests"][0]) == {"id", "arrival_step", "prompt_len", "max_tokens", "stop_token_ids", "acceptance"}
    assert w["requests"][1]["prefix"] == "p" and w["requests"][1]["abort_step"] == 4
    assert "priority" not in w["requests"][1] and w["requests"][2]["priority"] == -2
    assert "prefixes" not in validate_workload(workload(req("a", 3)), "s", {"max_model_len": 100})


SYS = [{"name": "sys", "len": 8}]


@pytest.mark.parametrize("raw, field, words", [
    (workload(req("a", 0)), "workload.requests[0].prompt_len", "between 1 and"),
    (workload(req("a", 1, prefix="nope"), prefixes=SYS), "workload.requests[0].prefix", "names 'nope'"),
    (workload(req("a", 1, prefix="sys")), "workload.requests[0].prefix", "prefixes: []"),
    (workload(req("a", 1), prefixes=[{"name": "sys", "len": 0}]), "workload.prefixes[0].len", "between 1 and"),
    (workload(req("a", 1), prefixes=[{"name": "a/b", "len": 2}]), "workload.prefixes[0].name", "1-32 characters"),
    (workload(req("a", 1), prefixes=SYS + SYS), "workload.prefixes[1].name", "duplicate prefix name"),
    (workload(req("a", 1), prefixes=[{"name": "sys", "len": 2, "x": 1}]), "workload.prefixes[0].x", "unknown key"),
    (workload(req("a", 1), prefixes={"sys": 8}), "workload.prefixes", "must be an array"),
    (workload(req("a", 1), prefixes=[{"name": f"p{i}", "len": 1} for i in range(65)]), "workload.prefixes",
     "at most 64"),
    (workload(req("a", 1, continues="b"), req("b", 1)), "workload.requests[0].continues",
     "not an earlier request; earlier: []"),
    (workload(req("a", 1), req("b", 1, continues="a", prefix="sys"), prefixes=SYS),
     "workload.requests[1].continues", "not both"),
    (workload(req("a", 1, abort_step=3), req("b", 1, continues="a")), "workload.requests[1].continues",
     "has an abort_step"),
    (workload(req("a", 1, arrival=5, abort_step=4)), "workload.requests[0].abort_step", "between 5 and 49"),
    (workload(req("a", 1, abort_step=50)), "workload.requests[0].abort_step", "between 0 and 49"),
    (workload(req("a", 1, priority=2**31)), "workload.requests[0].priority", "between"),
    (workload(req("a", 1, priority=True)), "workload.requests[0].priority", "must be an integer"),
    (workload(req("a", 90, max_tokens=5), req("b", 3, max_tokens=5, continues="a")),
     "workload.requests[1].max_tokens", "a prompt of 98 tokens (request 'a''s prompt and output + 3 own) "
     "+ max_tokens 5 = 103 exceeds engine_args.max_model_len = 100"),
    (workload(req("a", 2, max_tokens=1, prefix="sys"), prefixes=[{"name": "sys", "len": 98}]),
     "workload.requests[0].max_tokens", "a prompt of 100 tokens (prefix 'sys' + 2 own)"),
    (workload(req("r0", 1, max_tokens=1), *[req(f"r{i}", 0, max_tokens=1, continues=f"r{i - 1}")
                                            for i in range(1, 18)]),
     "workload.requests[17].continues", "a chain of 17 continuations; at most 16"),
])
def test_bad_shared_prefixes_continuations_and_aborts_name_the_field(raw, field, words):
    with pytest.raises(ScenarioError) as err:
        validate_workload(raw, "s.json", {"max_model_len": 100})
    assert err.value.field == field, err.value
    assert words in err.value.problem, err.value


# -- the stops a request may ask for: min_tokens, its eos, repetition detection ------------------

def rep(high, low=0, count=2):
    return {"max_pattern_size": high, "min_pattern_size": low, "min_count": count}


@pytest.mark.parametrize("raw, field, words", [
    (workload(req("a", 1, max_tokens=5, min_tokens=6)), "workload.requests[0].min_tokens",
     "must be at most max_tokens (5), got 6"),
    (workload(req("a", 1, min_tokens=-1)), "workload.requests[0].min_tokens", "between 0 and"),
    (workload(req("a", 1, min_tokens=1.5)), "workload.requests[0].min_tokens", "must be an integer"),
    (workload(req("a", 1, eos_token_id=1000)), "workload.requests[0].eos_token_id", "between 0 and 999, got 1000"),
    (workload(req("a", 1, eos_token_id=None)), "workload.requests[0].eos_token_id", "must be an integer, got null"),
    (workload(req("a", 1, eos_token_id=True)), "workload.requests[0].eos_token_id", "must be an integer"),
    (workload(req("a", 1, repetition_detection=[2, 1, 2])), "workload.requests[0].repetition_detection",
     "must be an object"),
    (workload(req("a", 1, repetition_detection={"max_pattern": 2})),
     "workload.requests[0].repetition_detection.max_pattern", "unknown key"),
    (workload(req("a", 1, repetition_detection=rep(2, 3))),
     "workload.requests[0].repetition_detection.min_pattern_size", "must be at most max_pattern_size (2), got 3"),
    (workload(req("a", 1, repetition_detection=rep(0, 1))),
     "workload.requests[0].repetition_detection.min_pattern_size", "set both to 0"),
    (workload(req("a", 1, repetition_detection=rep(2, 0, 1))),
     "workload.requests[0].repetition_detection.min_count", "must be at least 2 when max_pattern_size is above 0"),
    (workload(req("a", 1, repetition_detection=rep(-1))),
     "workload.requests[0].repetition_detection.max_pattern_size", "between 0 and 1024"),
    (workload(req("a", 1, repetition_detection=rep(2000))),
     "workload.requests[0].repetition_detection.max_pattern_size", "between 0 and 1024"),
    (workload(req("a", 1, min_tokens=2), req("b", 1, continues="a")), "workload.requests[1].continues",
     "has min_tokens"),
])
def test_bad_stop_conditions_name_the_field(raw, field, words):
    with pytest.raises(ScenarioError) as err:
        validate_workload(raw, "s.json", {"max_model_len": 100})
    assert err.value.field == field, err.value
    assert words in err.value.problem, err.value


def test_stop_conditions_are_kept_as_given_but_min_tokens_0():
    """min_tokens 0 is no gate, dropped (a scenario without it hashes the same); as vLLM's
    RepetitionDetectionParams, a size left out is 0, and a detection switched off (a
    max_pattern_size of 0) is kept: vLLM still calls its check (which returns at once), and
    a mutant of that check's guard is caught only by a request that has one."""
    w = validate_workload(workload(req("a", 1, min_tokens=0, repetition_detection={"max_pattern_size": 0}),
                                   req("b", 1, min_tokens=2, eos_token_id=0,
                                       repetition_detection={"max_pattern_size": 3, "min_count": 2})),
                          "s", {"max_model_len": 100})
    assert set(w["requests"][0]) == {"id", "arrival_step", "prompt_len", "max_tokens", "stop_token_ids", "acceptance",
                                     "repetition_detection"}
    assert w["requests"][0]["repetition_detection"] == {"max_pattern_size": 0, "min_pattern_size": 0, "min_count": 0}
    assert needed({}, w) == ("prefix_caching", "min_tokens", "eos", "repetition_detection")
    assert needed({}, {"requests": w["requests"][:1]}) == ("prefix_caching",)  # switched off: no feature
    assert w["requests"][1]["min_tokens"] == 2 and w["requests"][1]["eos_token_id"] == 0
    assert w["requests"][1]["repetition_detection"] == rep(3)


def test_check_stop_follows_vllms_order():
    """vLLM 0.27.1's check_stop: the min_tokens gate first, then the eos (no stop_reason), the
    stop tokens, the length caps, and repetition last."""
    assert check_stop([5, 5], 10, 10, {5}, None, min_tokens=3) is None  # held back
    assert check_stop([5, 5, 5], 10, 10, {5}, None, min_tokens=3) == "stop"
    assert check_stop([1, 5], 10, 2, {5}, None, eos_token_id=5) == "stop"  # eos and max_tokens: stop
    assert check_stop([1, 4], 10, 2, set(), None, repetition=rep(1)) == "length"  # before repetition
    assert check_stop([4, 4], 10, 9, {4}, None, repetition=rep(1)) == "stop"
    assert check_stop([4, 4], 10, 9, set(), None, repetition=rep(1)) == "repetition"
    assert check_stop([4, 4], 10, 9, set(), 10) == "length"  # max_model_len
    assert check_stop([4, 2], 10, 2, set(), None, min_tokens=2) == "length"  # min_tokens = max_tokens


@pytest.mark.parametrize("output, params, expected", [
    ([1, 1], rep(1), True),
    ([1, 1], rep(1, 0, 3), False),  # fewer tokens than pattern x count: no check
    ([2, 1, 2, 1], rep(2, 2), True),
    ([1, 1, 2, 1, 2], rep(2, 2), True),
    ([2, 2, 1], rep(3, 1), False),
    ([3, 1, 1], rep(3, 2), False),  # a run of one token, but patterns of 2 and 3 only
    ([0, 1, 2, 0, 1, 2], rep(3, 1), True),  # the 1- and 2-token patterns fail first
    ([0, 1, 2, 0, 1, 2, 0, 1, 2], rep(3, 3, 3), True),
    ([9, 0, 1, 2, 0, 1, 2, 0, 1, 2], rep(3, 3, 3), True),
    ([9, 1, 2, 0, 1, 2, 0, 1, 2], rep(3, 3, 3), False),  # the first run differs in its first token
    ([9, 1, 2, 7, 1, 2, 0, 1, 2], rep(3, 3, 3), False),
    ([1, 1, 1], rep(0), False),  # off
    ([], rep(2), False),
])
def test_repeats_is_vllms_check_sequence_repetition(output, params, expected):
    assert repeats(output, **params) is expected


def test_expected_output_stops_on_eos_min_tokens_and_repetition():
    t = prompt_tokens(7, "r0", 4, 1000)
    free = expected_output(7, t, 10, [], 100, 1000)
    assert expected_output(7, t, 10, [], 100, 1000, eos_token_id=free[1]) == free[:2]  # the eos is kept
    assert expected_output(7, t, 10, [free[1]], 100, 1000, min_tokens=3) == free  # never again before 10
    # a small vocabulary repeats: the output ends at the first tail of two equal tokens
    small = expected_output(3, prompt_tokens(3, "r", 5, 4), 50, [], None, 4, repetition=rep(1))
    assert small[-1] == small[-2] and all(a != b for a, b in zip(small[:-2], small[1:-1]))
    held = expected_output(3, prompt_tokens(3, "r", 5, 4), 50, [], None, 4, repetition=rep(1),
                           min_tokens=len(small) + 1)
    assert held[:len(small)] == small and len(held) > len(small) and held[-1] == held[-2]


def test_a_continuation_continues_after_its_eos_and_its_repetition():
    r0 = prompt_tokens(7, "r0", 4, 1000)
    free = expected_output(7, r0, 10, [], 100, 1000)
    w = validate_workload(workload(req("r0", 4, max_tokens=10, eos_token_id=free[2]), req("r1", 1, continues="r0")),
                          "s", {"max_model_len": 100})
    assert request_prompts(w, 100)["r1"] == r0 + free[:3] + prompt_tokens(7, "r1", 1, 1000)
    small = expected_output(3, prompt_tokens(3, "r0", 5, 4), 50, [], None, 4, repetition=rep(1))
    w = validate_workload(workload(req("r0", 5, max_tokens=50, repetition_detection=rep(1)),
                                   req("r1", 1, max_tokens=50, continues="r0"), seed=3, vocab=4),
                          "s", {"max_model_len": 200})
    assert request_prompts(w, 200)["r1"] == prompt_tokens(3, "r0", 5, 4) + small + prompt_tokens(3, "r1", 1, 4)


def test_the_stop_scenarios_stop_where_their_descriptions_say():
    """The library's stop scenarios, by expected_output: the stops they were built to show."""
    def outputs(name):
        s = load_scenario(REPO / "scenarios" / f"{name}.json")
        w, limit = s.workload, s.engine_args["max_model_len"]
        prompts = request_prompts(w, limit)
        return {r["id"]: expected_output(w["seed"], prompts[r["id"]], r["max_tokens"], r["stop_token_ids"], limit,
                                         w["vocab_size"], r.get("min_tokens", 0), r.get("eos_token_id"),
                                         r.get("repetition_detection")) for r in w["requests"]}

    assert {k: len(v) for k, v in outputs("stop_eos").items()} == {"r0": 6, "r1": 5, "r2": 15, "r3": 20, "r4": 3}
    assert {k: len(v) for k, v in outputs("stop_min_tokens").items()} == {"r0": 8, "r1": 12, "r2": 12, "r3": 3}
    assert {k: len(v) for k, v in outputs("stop_repetition").items()} == {
        "a": 60, "b": 12, "c": 20, "d": 35, "e": 27, "f": 29, "g": 11, "h": 5}
    assert {k: len(v) for k, v in outputs("stop_dflash").items()} == {"r0": 6, "r1": 12, "r2": 8, "r3": 3, "r4": 45}


# -- LoRA adapters ------------------------------------------------------------------------------

LORA_ON = {"max_model_len": 100, "enable_lora": True}
ALPHA = {"id": 1, "name": "alpha"}


@pytest.mark.parametrize("raw, args, field, words", [
    (workload(req("a", 1, lora=ALPHA)), {"max_model_len": 100}, "workload.requests[0].lora",
     "needs engine_args.enable_lora true"),
    (workload(req("a", 1, lora=ALPHA)), dict(LORA_ON, enable_lora=False), "workload.requests[0].lora",
     "needs engine_args.enable_lora true"),
    (workload(req("a", 1, lora={"id": 0, "name": "alpha"})), LORA_ON, "workload.requests[0].lora.id",
     "between 1 and 2147483647, got 0"),
    (workload(req("a", 1, lora={"id": True, "name": "alpha"})), LORA_ON, "workload.requests[0].lora.id",
     "must be an integer"),
    (workload(req("a", 1, lora={"id": 1})), LORA_ON, "workload.requests[0].lora.name", "is required"),
    (workload(req("a", 1, lora={"id": 1, "name": "a/b"})), LORA_ON, "workload.requests[0].lora.name",
     "1-32 characters"),
    (workload(req("a", 1, lora={"id": 1, "name": "x", "path": "/p"})), LORA_ON, "workload.requests[0].lora.path",
     "unknown key"),
    (workload(req("a", 1, lora="alpha")), LORA_ON, "workload.requests[0].lora", "must be an object"),
    (workload(req("a", 1, lora=ALPHA), req("b", 1, lora={"id": 1, "name": "beta"})), LORA_ON,
     "workload.requests[1].lora.name", "id 1 names adapter 'alpha' in an earlier request, got 'beta'"),
    (workload(req("a", 1, lora=ALPHA), req("b", 1, lora={"id": 2, "name": "alpha"})), LORA_ON,
     "workload.requests[1].lora.id", "adapter 'alpha' has id 1 in an earlier request, got 2"),
])
def test_bad_adapters_name_the_field(raw, args, field, words):
    with pytest.raises(ScenarioError) as err:
        validate_workload(raw, "s.json", args)
    assert err.value.field == field, err.value
    assert words in err.value.problem, err.value


@pytest.mark.parametrize("spec, field, words", [
    ({}, "workload.requests[0].structured_output", "exactly one of"),
    ({"regex": "a", "choice": ["a"]}, "workload.requests[0].structured_output", "exactly one of"),
    ({"grammar": "root ::= x"}, "workload.requests[0].structured_output.grammar", "unknown key"),
    ({"json": 3}, "workload.requests[0].structured_output.json", "a JSON schema"),
    ({"json": " "}, "workload.requests[0].structured_output.json", "1 to 4096 characters"),
    ({"json": {"enum": ["x" * 5000]}}, "workload.requests[0].structured_output.json", "1 to 4096 characters"),
    ({"regex": ""}, "workload.requests[0].structured_output.regex", "1 to 4096 characters"),
    ({"regex": 7}, "workload.requests[0].structured_output.regex", "must be a string"),
    ({"choice": []}, "workload.requests[0].structured_output.choice", "list of 1 to 64 strings"),
    ({"choice": ["a", 2]}, "workload.requests[0].structured_output.choice", "list of 1 to 64 strings"),
    ("json", "workload.requests[0].structured_output", "must be an object"),
])
def test_bad_structured_outputs_name_the_field(spec, field, words):
    with pytest.raises(ScenarioError) as err:
        validate_workload(workload(req("a", 1, structured_output=spec)), "s.json", {"max_model_len": 100})
    assert err.value.field == field, err.value
    assert words in err.value.problem, err.value


def test_an_adapter_is_kept_as_given_and_changes_no_token():
    """The stand-in plays the base model under every adapter: LoRA changes what the scheduler
    admits and which blocks are shared, not the tokens."""
    w = validate_workload(workload(req("a", 3, lora=ALPHA), req("b", 3)), "s", LORA_ON)
    assert w["requests"][0]["lora"] == ALPHA and "lora" not in w["requests"][1]
    plain = validate_workload(workload(req("a", 3), req("b", 3)), "s", {"max_model_len": 100})
    assert request_prompts(w, 100) == request_prompts(plain, 100)


def test_structured_outputs_are_kept_as_given_and_a_grammar_request_is_never_continued():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    kept = validate_workload(workload(req("a", 1, structured_output={"json": schema}),
                                      req("b", 1, structured_output={"choice": ["x", "y"]}), req("c", 1)),
                             "s.json", {"max_model_len": 100})
    assert [r.get("structured_output") for r in kept["requests"]] == [{"json": schema}, {"choice": ["x", "y"]}, None]
    with pytest.raises(ScenarioError, match="has a structured_output"):
        validate_workload(workload(req("a", 1, structured_output={"regex": "x+"}), req("b", 1, continues="a")),
                          "s.json", {"max_model_len": 100})


def _row(*allowed, width=64):
    """A bitmask row as vLLM's int32 words: allowed ids set, a word with bit 31 negative."""
    words = [0] * width
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def test_allowed_ids_read_a_bitmask_row_and_masked_choice_counts_among_them():
    assert allowed_ids(_row(5, 31, 40, 2047)) == [5, 31, 40, 2047]
    assert allowed_ids([-1] * 64) == list(range(2048))
    allowed = [5, 31, 40, 2047]
    assert [masked_choice(allowed, t) for t in range(6)] == [5, 31, 40, 2047, 5, 31]
    assert masked_choice(list(range(2048)), 1234) == 1234  # every id allowed: the usual choice
    assert masked_choice([], 77) == 77  # none allowed: the usual choice


def test_verify_masked_is_verify_when_all_is_allowed_and_follows_what_is_allowed():
    seed, vocab, tokens = 5, 2048, [1, 2, 3]
    drafts = draft(seed, tokens, 4, 2, vocab)
    full = [list(range(vocab))] * 5
    assert verify_masked(seed, tokens, drafts, vocab, full) == verify(seed, tokens, drafts, vocab)
    # one allowed id per position: every position's target is that id, whatever the stand-in says
    only = [[10 + i] for i in range(5)]
    assert verify_masked(seed, tokens, [10, 11, 99, 13], vocab, only) == [10, 11, 12]
    assert verify_masked(seed, tokens, [10, 11, 12, 13], vocab, only) == [10, 11, 12, 13, 14]
