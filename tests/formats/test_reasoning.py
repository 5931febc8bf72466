"""Structured outputs after reasoning in the scenario format: engine_args.reasoning_parser,
tokenizer and structured_outputs_config, a request's reasoning_end, the feature `reasoning`, and
the stand-in's reasoning_next (engines/PROTOCOL.md "Structured outputs after reasoning")."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from conformance.formats.scenario import ScenarioError, load_scenario
from conformance.formats.workload import (Context, reasoning_end, reasoning_next, request_prompts, target_next,
                                          verify_masked)
from tests.helpers import REPO

SCENARIOS = REPO / "scenarios"
NAMES = ("grammar_reasoning", "grammar_reasoning_eagle3", "grammar_reasoning_dflash", "grammar_reasoning_constrained")


def _copy(tmp_path, mutate=None, name="grammar_reasoning_eagle3") -> Path:
    shutil.copytree(SCENARIOS / "models", tmp_path / "models", dirs_exist_ok=True)
    data = json.loads((SCENARIOS / f"{name}.json").read_text())
    if mutate:
        mutate(data)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name", NAMES)
def test_the_reasoning_scenarios_need_the_feature_and_hash_the_reasoning_tokenizer(name):
    s = load_scenario(SCENARIOS / f"{name}.json")
    assert "reasoning" in s.features and "structured_outputs" in s.features
    assert s.engine_args["reasoning_parser"] == "deepseek_r1"
    assert Path(s.engine_args["tokenizer"]) == (SCENARIOS / "models" / "reasoning-tokenizer").resolve()
    assert s.layers == ["config", "steps", "outputs"]


def test_the_tokenizer_is_hashed_by_its_content_not_its_place(tmp_path):
    path = _copy(tmp_path)
    here = load_scenario(path)
    assert here.sha256 == load_scenario(SCENARIOS / "grammar_reasoning_eagle3.json").sha256
    assert here.engine_args["tokenizer"] == str((tmp_path / "models" / "reasoning-tokenizer").resolve())
    (tmp_path / "models" / "reasoning-tokenizer" / "tokenizer_config.json").write_text("{}")
    assert load_scenario(path).sha256 != here.sha256


def test_the_tiny_targets_own_tokenizer_is_not_the_reasoning_one():
    """The grammar scenarios without a reasoning parser keep the tiny target's tokenizer, whose
    ids 2046 and 2047 are the recipe's ordinary tokens: their hashes and goldens did not move."""
    base = json.loads((SCENARIOS / "models" / "tiny-qwen3" / "tokenizer.json").read_text())
    think = json.loads((SCENARIOS / "models" / "reasoning-tokenizer" / "tokenizer.json").read_text())
    assert "<think>" not in base["model"]["vocab"]
    added = {t["content"]: t["id"] for t in think["added_tokens"]}
    assert (added["<think>"], added["</think>"]) == (2046, 2047)
    assert not any(t["special"] for t in think["added_tokens"] if t["content"].endswith("think>"))
    assert len(think["model"]["vocab"]) == 2046
    assert {k: v for k, v in base["model"]["vocab"].items() if v < 2046} == think["model"]["vocab"]


def _recipe():
    spec = importlib.util.spec_from_file_location("tiny_tokenizer_reasoning", REPO / "engines/vllm/tiny_tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reasoning_variant_is_the_recipe_up_to_its_two_tokens():
    recipe = _recipe()
    vocab, merges = recipe.vocabulary(2046)
    full, full_merges = recipe.vocabulary()
    assert vocab == {k: v for k, v in full.items() if v < 2046} and merges == full_merges[:len(merges)]
    committed = json.loads((SCENARIOS / "models" / "reasoning-tokenizer" / "tokenizer.json").read_text())
    assert committed["model"]["vocab"] == vocab
    assert [tuple(m) for m in committed["model"]["merges"]] == merges


@pytest.mark.parametrize("mutate, field, words", [
    (lambda d: d["engine_args"].update(reasoning_parser="Deep-Seek"), "engine_args.reasoning_parser",
     "a reasoning parser's name"),
    (lambda d: d["engine_args"].update(reasoning_parser=3), "engine_args.reasoning_parser", "str"),
    (lambda d: d["engine_args"].update(tokenizer="models/nowhere"), "engine_args.tokenizer",
     "not a local folder holding tokenizer.json"),
    (lambda d: d["engine_args"].update(tokenizer="models/tiny-dflash"), "engine_args.tokenizer",
     "not a local folder holding tokenizer.json"),
    (lambda d: d["engine_args"].update(structured_outputs_config={"enable_in_reasoning": 1}),
     "engine_args.structured_outputs_config.enable_in_reasoning", "bool"),
    (lambda d: d["engine_args"].update(structured_outputs_config={"backend": "xgrammar"}),
     "engine_args.structured_outputs_config.backend", "unknown"),
    (lambda d: d["engine_args"].pop("reasoning_parser"), "workload.requests[0].reasoning_end",
     "needs engine_args.reasoning_parser"),
    (lambda d: d["workload"]["requests"][0].pop("structured_output"), "workload.requests[0].reasoning_end",
     "needs a structured_output"),
    (lambda d: d["workload"]["requests"][0]["reasoning_end"].update(at=40), "workload.requests[0].reasoning_end.at",
     "between 0 and 39"),
    (lambda d: d["workload"]["requests"][0]["reasoning_end"].update(token_id=2048),
     "workload.requests[0].reasoning_end.token_id", "between 0 and 2047"),
    (lambda d: d["workload"]["requests"][0]["reasoning_end"].pop("at"), "workload.requests[0].reasoning_end.at",
     "is required"),
    (lambda d: d["workload"]["requests"][0]["reasoning_end"].update(after=1),
     "workload.requests[0].reasoning_end.after", "unknown key"),
])
def test_bad_reasoning_fields_name_the_field(tmp_path, mutate, field, words):
    with pytest.raises(ScenarioError, match=words) as err:
        load_scenario(_copy(tmp_path, mutate))
    assert err.value.field == field


def test_the_engine_layers_refuse_a_reasoning_end(tmp_path):
    def engine(d):
        d.update(engine={})  # the engine layers
        for req in d["workload"]["requests"]:
            req.pop("eos_token_id", None)
    with pytest.raises(ScenarioError, match="not run by the engine layers") as err:
        load_scenario(_copy(tmp_path, engine))
    assert err.value.field == "workload.requests[0].reasoning_end"


def test_reasoning_next_gives_the_end_token_at_its_place_only():
    tokens = list(range(40))
    end = reasoning_end({"reasoning_end": {"token_id": 2047, "at": 3}}, 40)
    assert end == (43, 2047) and reasoning_end({}, 40) is None
    assert reasoning_next(5, tokens, 2048, None) == target_next(5, tokens, 2048)
    assert reasoning_next(5, tokens, 2048, end) == target_next(5, tokens, 2048)
    at_end = tokens + [7, 8, 9]
    assert reasoning_next(5, at_end, 2048, end) == 2047 and reasoning_next(5, Context.of(at_end), 2048, end) == 2047
    assert reasoning_next(5, at_end + [2047], 2048, end) == target_next(5, at_end + [2047], 2048)


def test_verify_masked_takes_the_end_token_where_every_id_is_allowed():
    every = list(range(2048))
    tokens = list(range(40))
    end = (41, 2047)
    first = target_next(5, tokens, 2048)
    sampled = verify_masked(5, tokens, [first, 2047, 0], 2048, [every] * 4, end)
    assert sampled[:2] == [first, 2047] and len(sampled) == 3
    # a row that allows only "0" and "1" (ids 19, 20) masks the end token like any other
    assert verify_masked(5, tokens, [first], 2048, [every, [19, 20]], end)[1] in (19, 20)


def test_the_scenarios_end_token_is_not_in_their_prompts():
    """A prompt holding </think> after its last <think> would end the reasoning before the first
    token (should_fill_bitmask reads the prompt): the library's prompts hold neither token."""
    for name in NAMES:
        s = load_scenario(SCENARIOS / f"{name}.json")
        for rid, prompt in request_prompts(s.workload, s.engine_args["max_model_len"]).items():
            assert not {2046, 2047} & set(prompt), (name, rid)
