"""benchmarks/gpu_precision.py, the measure behind the float32 precision the engines are pinned
to (conformance/formats/precision.py), run on CPU as its docs show it: Hugging Face's Qwen3 on
the tiny model reproduces the committed engine goldens' logprobs within their tolerance, and
the measure sees a lowered precision (bfloat16) move them. The GPU figures are in
docs/release-gate.md (On a GPU runner); only a GPU can give them."""

import json
import subprocess

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.precision import TOLERANCE
from conformance.process import envs
from tests.helpers import REPO


@pytest.mark.oracle
def test_the_precision_measure_runs_on_cpu_and_sees_bfloat16(tmp_path):
    python = envs.ensure_env(load_pins().oracle, log=lambda m: None)  # torch and transformers
    out = tmp_path / "figures.json"
    result = subprocess.run([str(python), str(REPO / "benchmarks/gpu_precision.py"), "--device", "cpu", "--quick",
                             "--json", str(out)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text(encoding="utf-8"))
    forced = figures["teacher_forced"]["cpu-highest"]
    assert forced["logprobs"] == 3680 and forced["argmax_changes"] == 0
    assert forced["max_abs"] < TOLERANCE / 10  # the goldens' logprobs, through another implementation
    assert figures["random_tiny_qwen3"]["highest"]["max_abs"] == 0  # the same device: the same floats
    lowered = figures["random_tiny_qwen3"]["bf16"]
    assert lowered["max_abs"] > TOLERANCE and lowered["beyond_tolerance"] > 0
    assert figures["teacher_forced"]["cpu-bf16"]["max_abs"] > TOLERANCE
