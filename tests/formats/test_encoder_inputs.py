"""A request's encoder inputs (multimodal items) in the workload, the feature, the scenario hash."""

import json
import shutil

import pytest

from conformance.formats.features import needed
from conformance.formats.scenario import ScenarioError, load_scenario
from conformance.formats.workload import validate_workload
from tests.helpers import REPO

ARGS = {"max_model_len": 200}
ENCODER_SCENARIOS = ("encoder_budget_binding", "encoder_cache_hits", "encoder_prefix_cache_miss",
                     "encoder_preemption", "encoder_unchunked_items", "encoder_aborts", "encoder_cache_hits_async")


def workload(*requests, prefixes=None):
    raw = {"seed": 7, "vocab_size": 1000, "max_steps": 50, "requests": list(requests)}
    if prefixes is not None:
        raw["prefixes"] = prefixes
    return raw


def req(rid, plen, **extra):
    return {"id": rid, "arrival_step": 0, "prompt_len": plen, "max_tokens": 3, **extra}


def item(offset, length, hashed="clip"):
    return {"offset": offset, "length": length, "hash": hashed}


def test_items_are_kept_in_order_with_their_hashes():
    raw = workload(req("a", 60, encoder_inputs=[item(0, 10, "x"), item(10, 20, "y")]),
                   req("b", 10, prefix="sys", encoder_inputs=[item(30, 20, "y")]),
                   prefixes=[{"name": "sys", "len": 40}])
    out = validate_workload(raw, "s.json", ARGS)
    assert out["requests"][0]["encoder_inputs"] == [item(0, 10, "x"), item(10, 20, "y")]
    assert out["requests"][1]["encoder_inputs"] == [item(30, 20, "y")]  # inside prefix + own tokens
    assert "encoder_inputs" not in validate_workload(workload(req("c", 5)), "s.json", ARGS)["requests"][0]


@pytest.mark.parametrize("raw, field, words", [
    (workload(req("a", 20, encoder_inputs=[])), "workload.requests[0].encoder_inputs", "1 to 64 items"),
    (workload(req("a", 20, encoder_inputs=item(0, 5))), "workload.requests[0].encoder_inputs", "must be an array"),
    (workload(req("a", 20, encoder_inputs=[{"offset": 0, "length": 5}])),
     "workload.requests[0].encoder_inputs[0].hash", "is required"),
    (workload(req("a", 20, encoder_inputs=[dict(item(0, 5), modality="image")])),
     "workload.requests[0].encoder_inputs[0].modality", "unknown key"),
    (workload(req("a", 20, encoder_inputs=[item(0, 0)])), "workload.requests[0].encoder_inputs[0].length",
     "between 1 and 200, got 0"),
    (workload(req("a", 20, encoder_inputs=[item(-1, 5)])), "workload.requests[0].encoder_inputs[0].offset",
     "between 0 and 199"),
    (workload(req("a", 20, encoder_inputs=[item(0, 5, "a/b")])), "workload.requests[0].encoder_inputs[0].hash",
     "1-32 characters"),
    (workload(req("a", 20, encoder_inputs=[item(5, 5, "x"), item(8, 2, "y")])),
     "workload.requests[0].encoder_inputs[1].offset", "must be at least 10"),
    (workload(req("a", 20, encoder_inputs=[item(15, 6)])), "workload.requests[0].encoder_inputs[0]",
     "ends at 21, past the prompt's 20 tokens"),
    (workload(req("a", 20, encoder_inputs=[item(0, 5)]), req("b", 20, encoder_inputs=[item(0, 6)])),
     "workload.requests[1].encoder_inputs[0].length", "item 'clip' has length 5 in an earlier placeholder, got 6"),
    (workload(req("a", 20), req("b", 0, continues="a", encoder_inputs=[item(0, 5)])),
     "workload.requests[1].encoder_inputs", "not taken with `continues`"),
])
def test_bad_encoder_inputs_name_the_field(raw, field, words):
    with pytest.raises(ScenarioError) as err:
        validate_workload(raw, "s.json", ARGS)
    assert err.value.field == field, err.value
    assert words in err.value.problem, err.value


def test_the_feature_is_a_request_with_items():
    assert "encoder_inputs" in needed({}, {"requests": [{"id": "a"}, {"id": "b", "encoder_inputs": [item(0, 1)]}]})
    assert "encoder_inputs" not in needed({}, {"requests": [{"id": "a", "encoder_inputs": []}]})


@pytest.mark.parametrize("name", ENCODER_SCENARIOS)
def test_library_scenarios_need_the_feature(name):
    assert "encoder_inputs" in load_scenario(REPO / "scenarios" / f"{name}.json").features


def test_the_hash_covers_the_processor_files_and_a_missing_one_is_named(tmp_path):
    """The encoder budget is computed from the model folder's processor files: a change to them
    is a new scenario; without them the scenario is refused, naming the file."""
    model = tmp_path / "scenarios" / "models" / "qwen2-audio-tiny"
    shutil.copytree(REPO / "scenarios" / "models" / "qwen2-audio-tiny", model)
    src = tmp_path / "scenarios" / "s.json"
    shutil.copy(REPO / "scenarios" / "encoder_budget_binding.json", src)
    before = load_scenario(src).sha256
    assert before == load_scenario(REPO / "scenarios" / "encoder_budget_binding.json").sha256
    config = json.loads((model / "preprocessor_config.json").read_text())
    (model / "preprocessor_config.json").write_text(json.dumps(dict(config, chunk_length=3)))
    assert load_scenario(src).sha256 != before
    (model / "preprocessor_config.json").unlink()
    with pytest.raises(ScenarioError, match="preprocessor_config.json"):
        load_scenario(src)


def test_the_engine_layers_refuse_encoder_inputs(tmp_path):
    raw = json.loads((REPO / "scenarios" / "encoder_budget_binding.json").read_text())
    raw["engine"] = {}
    shutil.copytree(REPO / "scenarios" / "models" / "qwen2-audio-tiny", tmp_path / "models" / "qwen2-audio-tiny")
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.field == "workload.requests[0].encoder_inputs", err.value
    assert "is not run by the engine layers" in err.value.problem
