"""Scenario validation: every malformed file is refused with the field named, before any engine."""

import json
import shutil
from pathlib import Path

import pytest

from conformance.formats.scenario import ScenarioError, load_scenario
from tests.helpers import GATE, REPO



@pytest.fixture
def scenario_dir(tmp_path):
    """A copy of the gate scenario and its model configs, outside the repository."""
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    return tmp_path


def write(folder: Path, mutate) -> Path:
    data = json.loads(GATE.read_text())
    mutate(data)
    path = folder / "scenario.json"
    path.write_text(json.dumps(data))
    return path


def test_gate_scenario_loads_with_absolute_model_paths():
    s = load_scenario(GATE)
    assert s.name == "dflash_27b_gate"
    assert Path(s.engine_args["model"]).is_absolute()
    assert Path(s.engine_args["speculative_config"]["model"]).joinpath("config.json").is_file()
    assert s.engine_args["speculative_config"]["num_speculative_tokens"] == 16


def test_the_engine_block_chooses_the_layers_and_its_tolerance_stays_out_of_the_hash():
    path = GATE.parent / "engine_dflash_gate.json"
    s = load_scenario(path)
    assert s.layers == ["config", "engine_config", "engine_steps", "engine_outputs"]
    assert s.engine == {"logprobs": 5, "logprob_decimals": 4} and s.logprob_atol == 0.001
    assert s.logprob_noise == 1.8e-05  # measured, recorded by benchmarks/bench_noise.py --write
    data = json.loads(path.read_text())
    data["engine"]["logprob_atol"] = 0.3
    data["engine"]["logprob_noise"] = 0.01
    other = path.parent / ".engine_atol_test.json"
    try:
        other.write_text(json.dumps(data))
        assert load_scenario(other).sha256 == s.sha256 and load_scenario(other).logprob_atol == 0.3
        data["engine"]["logprobs"] = 3
        other.write_text(json.dumps(data))
        assert load_scenario(other).sha256 != s.sha256
    finally:
        other.unlink()


def test_async_scheduling_may_be_left_to_vllm_and_hashes_apart(scenario_dir):
    """null is vLLM's default, which each platform resolves by its own rule: a scenario of its own."""
    unset = load_scenario(write(scenario_dir, lambda d: d["engine_args"].update(async_scheduling=None)))
    assert unset.engine_args["async_scheduling"] is None
    assert unset.sha256 != load_scenario(GATE).sha256


def test_hash_depends_on_content_not_location(scenario_dir):
    moved = load_scenario(write(scenario_dir, lambda d: None))
    assert moved.sha256 == load_scenario(GATE).sha256
    (scenario_dir / "models" / "dflash-27b-draft" / "config.json").write_text('{"changed": 1}')
    assert load_scenario(scenario_dir / "scenario.json").sha256 != moved.sha256


@pytest.mark.parametrize("mutate, field, words", [
    (lambda d: d["engine_args"].update(max_num_seqz=4), "engine_args.max_num_seqz", "unknown key"),
    (lambda d: d.update(extra=1), "extra", "unknown key"),
    (lambda d: d["engine_args"].update(max_num_seqs="4"), "engine_args.max_num_seqs", "must be int"),
    (lambda d: d["engine_args"].update(max_num_seqs=True), "engine_args.max_num_seqs", "must be int"),
    (lambda d: d["engine_args"].update(max_num_batched_tokens=-1), "engine_args.max_num_batched_tokens", "between"),
    (lambda d: d["engine_args"].update(max_model_len=10**9), "engine_args.max_model_len", "between"),
    (lambda d: d["engine_args"].pop("block_size"), "engine_args.block_size", "required"),
    (lambda d: d["engine_args"].pop("async_scheduling"), "engine_args.async_scheduling", "required"),
    (lambda d: d["engine_args"].update(async_scheduling="auto"), "engine_args.async_scheduling",
     "must be bool or null, got str"),
    (lambda d: d["engine_args"]["speculative_config"].pop("model"),
     "engine_args.speculative_config.model", "needs a draft model"),
    (lambda d: d["engine_args"]["speculative_config"].update(model="nowhere"),
     "engine_args.speculative_config.model", "not a local folder"),
    (lambda d: d["engine_args"].update(model="Qwen/Qwen3-32B"), "engine_args.model", "hub ids are not allowed"),
    (lambda d: d["engine_args"]["speculative_config"].update(method="magic"),
     "engine_args.speculative_config.method", "unknown method"),
    (lambda d: d["engine_args"]["speculative_config"].update(num_speculative_tokens=1.5),
     "engine_args.speculative_config.num_speculative_tokens", "must be int"),
    (lambda d: d["engine_args"].update(load_format="auto"), "engine_args.load_format", "dummy"),
    (lambda d: d.update(name="../../etc/passwd"), "name", "a-z 0-9"),
    (lambda d: d.update(schema="v0"), "schema", "must be"),
    (lambda d: d.update(engine={}), "workload", "is required with `engine`"),
    (lambda d: d.update(engine={"logprob": 5}), "engine.logprob", "unknown key"),
    (lambda d: d.update(engine={"logprobs": 50}), "engine.logprobs", "in [1, 20]"),
    (lambda d: d.update(engine={"logprob_atol": 0}), "engine.logprob_atol", "in (0.0, 10.0]"),
    (lambda d: d.update(engine=[]), "engine", "must be an object"),
])
def test_malformed_scenario_names_the_field(scenario_dir, mutate, field, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(write(scenario_dir, mutate))
    assert err.value.field == field
    assert words in str(err.value)
    assert field in str(err.value)


def test_prefix_caching_left_out_is_vllms_default_written_in_before_hashing(scenario_dir):
    """vLLM 0.27.1 turns prefix caching on by default; a file that leaves the key out runs and
    hashes as one that says true, and the run message carries the value."""
    said = load_scenario(write(scenario_dir, lambda d: d["engine_args"].update(enable_prefix_caching=True)))
    left_out = load_scenario(write(scenario_dir, lambda d: d["engine_args"].pop("enable_prefix_caching")))
    off = load_scenario(write(scenario_dir, lambda d: None))
    assert left_out.engine_args["enable_prefix_caching"] is True
    assert left_out.to_wire()["engine_args"]["enable_prefix_caching"] is True
    assert left_out.sha256 == said.sha256 != off.sha256
    assert off.engine_args["enable_prefix_caching"] is False


@pytest.mark.parametrize("key, value", [("continues", "r0"), ("abort_step", 1)])
def test_the_engine_layers_refuse_what_only_the_stand_in_runs(tmp_path, key, value):
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    data = json.loads((GATE.parent / "engine_ngram.json").read_text())
    data["workload"]["requests"].append(dict(data["workload"]["requests"][0], id="extra", **{key: value}))
    (tmp_path / "s.json").write_text(json.dumps(data))
    with pytest.raises(ScenarioError) as err:
        load_scenario(tmp_path / "s.json")
    assert err.value.field == f"workload.requests[{len(data['workload']['requests']) - 1}].{key}"
    assert "not run by the engine layers" in err.value.problem


def test_the_engine_layers_run_a_shared_prefix(tmp_path):
    """A prefix's tokens are the stand-in's (workload.prefix_tokens): the engine's prompt is
    them, then the request's own, so two requests can share a prompt exactly."""
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    data = json.loads((GATE.parent / "engine_ngram.json").read_text())
    data["workload"]["prefixes"] = [{"name": "sys", "len": 4}]
    data["workload"]["requests"].append(dict(data["workload"]["requests"][0], id="extra", prefix="sys",
                                             prompt_len=0))
    (tmp_path / "s.json").write_text(json.dumps(data))
    scenario = load_scenario(tmp_path / "s.json")
    assert scenario.engine is not None and scenario.workload["requests"][-1]["prefix"] == "sys"


def test_the_engine_layers_run_a_requests_priority(tmp_path):
    """The engine's add_request takes a priority, so an engine scenario may give one (the
    priority policy's victim chosen by it, as in engine_priority_victim_drafts)."""
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    data = json.loads((GATE.parent / "engine_ngram.json").read_text())
    data["engine_args"]["scheduling_policy"] = "priority"
    data["workload"]["requests"][0]["priority"] = 2
    (tmp_path / "s.json").write_text(json.dumps(data))
    scenario = load_scenario(tmp_path / "s.json")
    assert scenario.engine is not None and scenario.workload["requests"][0]["priority"] == 2


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"schema": NaN}', "\xff"])
def test_unparseable_scenario_is_a_clear_error(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text, errors="surrogateescape") if text != "\xff" else path.write_bytes(b"\xff")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "absent.json")


# -- a KV connector (engines/vllm/kv_connector.py): kv_transfer_config and a request's `external`

def _connector_scenario(tmp_path, args=None, request=None, engine=None):
    """kv_connector_sync with these engine_args (None: the key left out), first request's keys
    and engine block."""
    raw = json.loads((REPO / "scenarios" / "kv_connector_sync.json").read_text(encoding="utf-8"))
    raw["engine_args"]["model"] = str(REPO / "scenarios" / "models" / "qwen3-27b")
    for key, value in (args or {}).items():
        if value is None:
            raw["engine_args"].pop(key)
        else:
            raw["engine_args"][key] = value
    raw["workload"]["requests"][0].update(request or {})
    if engine is not None:
        raw["engine"] = engine
    path = tmp_path / "s.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


@pytest.mark.parametrize("args, request_, engine, field, words", [
    ({"kv_transfer_config": None}, {}, None, "workload.requests[0].external", "needs engine_args.kv_transfer_config"),
    ({"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"}}, {}, None,
     "engine_args.kv_transfer_config.kv_connector", "must be one of ['StandInConnector']"),
    ({"kv_transfer_config": {"kv_connector": "StandInConnector"}}, {}, None,
     "engine_args.kv_transfer_config.kv_role", "is required"),
    ({"kv_transfer_config": {"kv_connector": "StandInConnector", "kv_role": "kv_both",
                             "kv_load_failure_policy": "retry"}}, {}, None,
     "engine_args.kv_transfer_config.kv_load_failure_policy", "must be one of ['recompute', 'fail']"),
    ({}, {"external": {"tokens": 0}}, None, "workload.requests[0].external.tokens", "between 1 and"),
    ({}, {"external": {"tokens": 8, "fail": "yes"}}, None, "workload.requests[0].external.fail", "true or false"),
    ({}, {"external": {"tokens": 8, "load": 1}}, None, "workload.requests[0].external.load", "unknown key"),
    ({}, {}, {}, "engine_args.kv_transfer_config", "not run by the engine layers"),
])
def test_a_kv_connector_scenario_is_checked_field_by_field(tmp_path, args, request_, engine, field, words):
    path = _connector_scenario(tmp_path, args, request_, engine)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert f"{field}:" in str(err.value) and words in str(err.value), str(err.value)


# -- LoRA: engine_args.enable_lora, max_loras, max_lora_rank and a request's `lora` -------------

@pytest.mark.parametrize("args, engine, field, words", [
    ({"max_loras": 0}, None, "engine_args.max_loras", "between 1 and"),
    ({"max_loras": True}, None, "engine_args.max_loras", "must be int"),
    ({"max_lora_rank": 0}, None, "engine_args.max_lora_rank", "between 1 and"),
    ({"enable_lora": "yes"}, None, "engine_args.enable_lora", "must be bool"),
    ({"enable_lora": False}, None, "workload.requests[0].lora", "needs engine_args.enable_lora true"),
    # the engine layers load an adapter from the model folder: qwen3-27b's has none
    ({}, {}, "workload.requests[0].lora.name", "adapters/alpha/adapter_config.json cannot be read"),
])
def test_a_lora_scenario_is_checked_field_by_field(tmp_path, args, engine, field, words):
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    raw = json.loads((GATE.parent / "lora_max_loras_admission.json").read_text(encoding="utf-8"))
    raw["engine_args"].update(args)
    if engine is not None:
        raw["engine"] = engine
    (tmp_path / "s.json").write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ScenarioError) as err:
        load_scenario(tmp_path / "s.json")
    assert f"{field}:" in str(err.value) and words in str(err.value), str(err.value)


def test_a_requests_adapter_on_the_engine_layers_is_the_model_folders(tmp_path):
    """The engine layers load adapter NAME from <model>/adapters/NAME/; the scenario hash
    covers its files, so an adapter's recipe edited changes the scenario's identity."""
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    data = json.loads((GATE.parent / "engine_ngram.json").read_text())
    data["engine_args"].update(enable_lora=True, max_loras=1, max_lora_rank=8)
    data["workload"]["requests"][0]["lora"] = {"id": 1, "name": "gamma"}
    (tmp_path / "s.json").write_text(json.dumps(data))
    with pytest.raises(ScenarioError) as err:
        load_scenario(tmp_path / "s.json")
    assert err.value.field == "workload.requests[0].lora.name" and "adapters/gamma" in err.value.problem
    data["workload"]["requests"][0]["lora"] = {"id": 1, "name": "alpha"}
    (tmp_path / "s.json").write_text(json.dumps(data))
    before = load_scenario(tmp_path / "s.json").sha256
    recipe = tmp_path / "models" / "tiny-qwen3" / "adapters" / "alpha" / "weights.json"
    recipe.write_text(recipe.read_text().replace('"seed": 1', '"seed": 3'))
    assert load_scenario(tmp_path / "s.json").sha256 != before


def _grammar(tmp_path, mutate=None) -> Path:
    shutil.copytree(GATE.parent / "models", tmp_path / "models", dirs_exist_ok=True)
    data = json.loads((GATE.parent / "grammar_eagle3.json").read_text())
    if mutate:
        mutate(data)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    return path


def test_a_grammar_needs_the_model_folders_tokenizer_and_the_hash_covers_it(tmp_path):
    path = _grammar(tmp_path)
    here = load_scenario(path)
    assert here.sha256 == load_scenario(GATE.parent / "grammar_eagle3.json").sha256
    (tmp_path / "models" / "tiny-qwen3" / "tokenizer.json").write_text("{}")
    assert load_scenario(path).sha256 != here.sha256  # another tokenizer, another scenario
    (tmp_path / "models" / "tiny-qwen3" / "tokenizer.json").unlink()
    with pytest.raises(ScenarioError, match="needs the model folder's tokenizer.json") as err:
        load_scenario(path)
    assert err.value.field == "workload.requests"


def test_a_grammar_runs_under_either_loop(tmp_path):
    """The batch-queue loop runs grammars too (engines/PROTOCOL.md "Structured outputs"): async
    scheduling on, or left to vLLM's default, is another scenario, with the same tokenizer."""
    hashes = set()
    for value in (False, True, None):
        path = _grammar(tmp_path, lambda d: d["engine_args"].update(async_scheduling=value))
        scenario = load_scenario(path)
        assert "structured_outputs" in scenario.features
        assert ("async_scheduling" in scenario.features) == (value is True)
        hashes.add(scenario.sha256)
    assert len(hashes) == 3


def test_the_engine_layers_run_a_grammar():
    """The whole engine takes a request's structured_output (SamplingParams.structured_outputs):
    the engine layers, with the feature, and the tokenizer in the hash."""
    s = load_scenario(GATE.parent / "engine_grammar_eagle3.json")
    assert "engine_steps" in s.layers and "structured_outputs" in s.features
    assert sum("structured_output" in r for r in s.workload["requests"]) == 3


def test_reasoning_runs_in_the_synchronous_loop_only(tmp_path):
    """The async stand-in runner follows grammars, not a reasoning end: a reasoning parser with
    async scheduling on, or left to vLLM's default, is refused by its field."""
    shutil.copytree(GATE.parent / "models", tmp_path / "models", dirs_exist_ok=True)
    data = json.loads((GATE.parent / "grammar_reasoning.json").read_text())
    for value in (True, None):
        data["engine_args"]["async_scheduling"] = value
        (tmp_path / "s.json").write_text(json.dumps(data))
        with pytest.raises(ScenarioError, match="synchronous loop only") as err:
            load_scenario(tmp_path / "s.json")
        assert err.value.field == "engine_args.async_scheduling"
