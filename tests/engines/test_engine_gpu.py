"""The engine layers on a GPU runner: the real DFlash 27B gate configuration, real weights.

Needs a CUDA GPU (the `gpu` marker: skipped on CPU runners) and VLLM_PARITY_GATE_MODELS, a
folder holding `qwen3-27b/` (the target) and `dflash-27b-draft/` (its DFlash drafter), each a
Hugging Face checkpoint with weights. The scenario is scenarios/dflash_27b_gate.json with those
folders, the engine block and a workload whose four ~2,000-token prompts make the budget bind
at step 0. The code path is the CPU one (engines/vllm/engine_layer.py), on the official wheel.
"""

import json
import os
from pathlib import Path

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.judging.numerics import capacity_excess
from tests.helpers import GATE, records_of

pytestmark = pytest.mark.gpu
MODELS_ENV = "VLLM_PARITY_GATE_MODELS"


def gate_engine_scenario(tmp_path: Path, models: Path):
    raw = json.loads(GATE.read_text())
    raw["name"] = "engine_dflash_27b_gate"
    raw["engine_args"]["model"] = str(models / "qwen3-27b")
    raw["engine_args"]["speculative_config"]["model"] = str(models / "dflash-27b-draft")
    raw["workload"] = {"seed": 11, "vocab_size": 151936, "max_steps": 400, "requests": [
        {"id": f"r{i}", "arrival_step": 0, "prompt_len": n, "max_tokens": 64}
        for i, n in enumerate((1900, 2100, 2000, 1800))]}
    raw["engine"] = {"logprobs": 5}
    path = tmp_path / "engine_dflash_27b_gate.json"
    path.write_text(json.dumps(raw))
    return load_scenario(path)


def test_the_27b_gate_on_the_real_gpu_engine(tmp_path, warm_sessions):
    models = os.environ.get(MODELS_ENV)
    if not models:
        pytest.skip(f"{MODELS_ENV} is not set (a folder with qwen3-27b/ and dflash-27b-draft/, weights included)")
    scenario = gate_engine_scenario(tmp_path, Path(models))
    oracle = load_pins().oracle
    records = records_of(warm_sessions(oracle), scenario)
    # the oracle's budget for the gate, as its golden of the same engine_args holds it
    budget = GOLDENS.load("dflash_27b_gate", oracle).layers["config"][0]["max_num_scheduled_tokens"]
    stated = f"max_num_scheduled_tokens is set to {budget} based on the speculative decoding settings."
    lines = records["engine_config"][0]["budget_log_lines"]
    assert any(line.startswith(stated) for line in lines), lines
    step0 = records["engine_steps"][0]  # the budget binds at step 0, less any slots charged there
    charged = step0.get("drafting_slots_per_request", 0) * len(step0["running"]) if "input_budget" in step0 else 0
    assert step0["total_num_scheduled_tokens"] == budget - charged
    print("capacity excess of the oracle:", capacity_excess(records["engine_steps"]))
