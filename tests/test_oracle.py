"""Integration: the real pinned vLLM releases, on CPU, through the real worker and protocol."""

import json
import shutil
import subprocess
import sys

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import judge
from conformance.report.render_text import render
from conftest import GATE, REPO

pytestmark = pytest.mark.oracle
PINS = load_pins()
SEED_LINE = "max_num_scheduled_tokens is set to 4036 based on the speculative decoding settings."


def trace_of(warm_sessions, release, scenario, layers=("config",)):
    trace = warm_sessions(release).trace(scenario, list(layers))
    assert "failure" not in trace, trace["failure"]
    return trace


def test_gate_oracle_resolves_the_seed_budget(warm_sessions):
    record = trace_of(warm_sessions, PINS.oracle, load_scenario(GATE))["layers"]["config"][0]
    assert record["max_num_scheduled_tokens"] == 4036
    assert record["max_num_batched_tokens"] == 4096
    assert record["drafting_slots_per_request"] == 15  # K - 1 for parallel drafting, times 4 seqs = 60
    assert any(line.startswith(SEED_LINE) for line in record["budget_log_lines"])


def test_committed_gate_golden_holds_the_seed_line():
    golden = GOLDENS.load("dflash_27b_gate", PINS.oracle)
    assert golden["provenance"]["environment"]["vllm"] == PINS.oracle
    assert any(line.startswith(SEED_LINE) for line in golden["layers"]["config"][0]["budget_log_lines"])


@pytest.mark.parametrize("release", PINS.candidates)
def test_later_pins_diverge_at_the_budget(warm_sessions, release):
    golden = GOLDENS.load("dflash_27b_gate", PINS.oracle)
    verdict = judge(trace_of(warm_sessions, release, load_scenario(GATE)), golden, role="candidate")
    assert verdict.kind == "diverged"
    first = verdict.comparisons[0].first
    assert (first.path, first.expected, first.actual) == ("max_num_scheduled_tokens", 4036, 4096)
    text = render([verdict], PINS.oracle)
    assert "oracle   : " + SEED_LINE in text
    assert "candidate: max_num_scheduled_tokens is set to 4096" in text


def test_no_draft_reservation_double_of_the_port_is_caught(warm_sessions):
    """A candidate resolving the budget without the reservation (the seed's port) diverges."""
    trace = trace_of(warm_sessions, PINS.oracle, load_scenario(GATE))
    record = trace["layers"]["config"][0]
    record["max_num_scheduled_tokens"] = record["max_num_batched_tokens"]
    golden = GOLDENS.load("dflash_27b_gate", PINS.oracle)
    assert judge(trace, golden, role="candidate").kind == "diverged"


@pytest.mark.parametrize("release", PINS.releases)
def test_each_pin_runs_a_scenario_outside_the_repository(tmp_path, warm_sessions, release):
    """Model folders relative to a scenario anywhere. (The `parity run` command itself, out of
    the repository, is the next test: one process per pin here would only repeat it.)"""
    shutil.copytree(REPO / "scenarios" / "models", tmp_path / "models")
    scenario = json.loads(GATE.read_text())
    scenario["name"] = "outside"
    scenario["engine_args"]["max_num_batched_tokens"] = 2048
    (tmp_path / "s.json").write_text(json.dumps(scenario))
    trace = trace_of(warm_sessions, release, load_scenario(tmp_path / "s.json"))
    record = trace["layers"]["config"][0]
    assert trace["engine"]["version"] == release
    assert record["max_num_batched_tokens"] == 2048
    # 0.27.1 subtracts (K - 1) * max_num_seqs in the config; 0.28.0 on charge it per step.
    expected = {"0.27.1": 2048 - 15 * 4}.get(release, 2048)
    assert record["max_num_scheduled_tokens"] == expected


def test_parity_run_per_step_layer_on_a_scenario_outside_the_repository(tmp_path):
    shutil.copytree(REPO / "scenarios" / "models", tmp_path / "models")
    scenario = json.loads((REPO / "scenarios" / "prefill_budget_binds.json").read_text())
    scenario["name"] = "outside-steps"
    scenario["workload"]["requests"] = scenario["workload"]["requests"][:3]
    (tmp_path / "s.json").write_text(json.dumps(scenario))
    out = tmp_path / "trace.json"
    result = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--engine", f"vllm=={PINS.oracle}",
                             "--scenario", str(tmp_path / "s.json"), "--out", str(out)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    layers = json.loads(out.read_text())["layers"]
    assert set(layers) == {"config", "steps", "outputs"}
    assert layers["steps"][0]["total_num_scheduled_tokens"] == 4036  # the budget binds at step 0
    assert sorted(r["id"] for r in layers["outputs"]) == ["r0", "r1", "r2"]
