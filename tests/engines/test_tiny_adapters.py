"""The committed tiny LoRA adapters (scenarios/models/tiny-*/adapters/*) and
tiny_adapters.materialize: PEFT's format, what vLLM's Qwen3 LoRA layers take, rebuilt byte for byte.

Stdlib only, but for the test marked `oracle`, which runs the recipe in the oracle pin's
environment (numpy is there, not in the harness)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess

import pytest

from tests.helpers import REPO

MODELS = REPO / "scenarios" / "models"
ADAPTERS = sorted(p for p in MODELS.glob("tiny-*/adapters/*") if p.is_dir())
SCRIPT = REPO / "engines" / "vllm" / "tiny_adapters.py"
# vLLM 0.27.1's Qwen3ForCausalLM packs q/k/v into qkv_proj and gate/up into gate_up_proj
# (packed_modules_mapping): a PEFT adapter names the unpacked modules, as HF's model does
QWEN3_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
SCENARIO_RANK = 8  # engine_lora's max_lora_rank


def _json(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_tiny_target_has_two_adapters():
    assert [p.name for p in ADAPTERS] == ["alpha", "beta"]
    assert {p.parent.parent.name for p in ADAPTERS} == {"tiny-qwen3"}


@pytest.mark.parametrize("folder", ADAPTERS, ids=lambda p: p.name)
def test_an_adapter_folder_is_peft_config_and_a_recipe(folder):
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "weights.json"]  # no weights
    config = _json(folder / "adapter_config.json")
    assert config["peft_type"] == "LORA" and config["bias"] == "none" and not config["modules_to_save"]
    assert not config["use_dora"] and not config["use_rslora"]
    assert 1 <= config["r"] <= SCENARIO_RANK and config["lora_alpha"] > 0
    assert config["target_modules"] and set(config["target_modules"]) <= QWEN3_MODULES
    meta = _json(folder / "weights.json")
    assert meta["schema"] == "vllm-parity/tiny-adapter/1" and meta["recipe"] == "lora"
    assert isinstance(meta["seed"], int) and re.fullmatch(r"[0-9a-f]{64}", meta["sha256"])


def test_the_adapters_differ():
    shas = [_json(f / "weights.json")["sha256"] for f in ADAPTERS]
    assert len(set(shas)) == len(shas)


def _load():
    from engines.vllm import tiny_adapters  # stdlib at import: numpy only to build tensors

    return tiny_adapters


def test_the_recipe_names_peft_tensors_of_the_base_models_shapes():
    tiny_adapters = _load()
    base = _json(MODELS / "tiny-qwen3" / "config.json")
    spec = tiny_adapters.recipe_lora(base, {"r": 4, "target_modules": ["k_proj", "down_proj"]})
    assert len(spec) == 2 * 2 * base["num_hidden_layers"]
    hd = base["head_dim"]
    assert spec["base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"] == ((4, base["hidden_size"]), "lora_A")
    assert spec["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"] == (
        (base["num_key_value_heads"] * hd, 4), "lora_B")
    assert spec["base_model.model.model.layers.3.mlp.down_proj.lora_A.weight"] == (
        (4, base["intermediate_size"]), "lora_A")


def test_materialize_builds_the_peft_folder_once_and_checks_its_hash(tmp_path, monkeypatch):
    tiny_adapters = _load()
    payload = b"adapter bytes"
    model = tmp_path / "tiny-fake"
    folder = model / "adapters" / "alpha"
    folder.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (folder / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}')
    (folder / "weights.json").write_text(json.dumps({"schema": tiny_adapters.SCHEMA, "recipe": "lora", "seed": 1,
                                                     "sha256": hashlib.sha256(payload).hexdigest()}))
    calls = []

    def write(folder_, path):
        calls.append(path)
        path.write_bytes(payload)
        return hashlib.sha256(payload).hexdigest()

    monkeypatch.setattr(tiny_adapters, "write_safetensors", write)
    out = tiny_adapters.materialize(folder, tmp_path / "cache")
    assert out.name == f"tiny-fake-adapter-alpha-{hashlib.sha256(payload).hexdigest()[:12]}"
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (out / "adapter_config.json").read_bytes() == (folder / "adapter_config.json").read_bytes()
    assert tiny_adapters.materialize(folder, tmp_path / "cache") == out and len(calls) == 1
    (folder / "weights.json").write_text(json.dumps({"schema": tiny_adapters.SCHEMA, "recipe": "lora", "seed": 1,
                                                     "sha256": "0" * 64}))
    with pytest.raises(ValueError, match="sha256 mismatch"):
        tiny_adapters.materialize(folder, tmp_path / "cache")


@pytest.mark.oracle
def test_every_adapter_recipe_makes_its_committed_sha():
    """Byte-identical adapters: each recipe, run in the oracle's environment, makes exactly the
    sha256 its weights.json commits to."""
    from conformance.formats.pins import load_pins
    from conformance.process.envs import ensure_env

    python = ensure_env(load_pins().oracle, log=lambda m: None)
    out = subprocess.run([str(python), str(SCRIPT), "--print-sha", *map(str, ADAPTERS)],
                         capture_output=True, text=True, check=True).stdout
    got = dict(reversed(line.split()) for line in out.splitlines())
    assert got == {f.name: _json(f / "weights.json")["sha256"] for f in ADAPTERS}
