"""Integration: the real pinned vLLM releases, on CPU, through the real worker and protocol."""

import json
import shutil
import subprocess
import sys

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.compare import compare_layer
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import judge
from conformance.report.render_text import render
from tests.helpers import GATE, REPO

pytestmark = pytest.mark.oracle
PINS = load_pins()
# Which releases subtract the drafting slots of max_num_seqs requests from the budget in the
# config ((K - 1) x max_num_seqs); later ones charge them per step (vllm#51725, 0.28.0).
RESERVES_IN_CONFIG = {"0.27.1": True, "0.28.0": False, "0.33.0": False}


def gate_config(release: str) -> dict:
    """The gate scenario's config record as the release's golden holds it."""
    return GOLDENS.load("dflash_27b_gate", release).layers["config"][0]


def budget_line(release: str) -> str:
    return (f"max_num_scheduled_tokens is set to {gate_config(release)['max_num_scheduled_tokens']} "
            "based on the speculative decoding settings.")


def trace_of(warm_sessions, release, scenario, layers=("config",)):
    trace = warm_sessions(release).trace(scenario, list(layers))
    assert trace.failure is None, trace.failure
    return trace


def test_gate_oracle_resolves_the_seed_budget(warm_sessions):
    record = trace_of(warm_sessions, PINS.oracle, load_scenario(GATE)).layers["config"][0]
    batched, slots = record["max_num_batched_tokens"], record["drafting_slots_per_request"]
    assert batched == 4096  # the scenario's
    assert slots == gate_config(PINS.oracle)["drafting_slots_per_request"]
    # 4096 - 4 seqs x 15 slots = 4036 where the config reserves them, else the whole 4096
    assert record["max_num_scheduled_tokens"] == (batched - 4 * slots if RESERVES_IN_CONFIG[PINS.oracle] else batched)
    assert any(line.startswith(budget_line(PINS.oracle)) for line in record["budget_log_lines"])


def test_committed_gate_golden_holds_the_seed_line():
    golden = GOLDENS.load("dflash_27b_gate", PINS.oracle)
    assert golden.provenance["environment"]["vllm"] == PINS.oracle
    assert RESERVES_IN_CONFIG.keys() >= set(PINS.releases), "say how each pin resolves the budget"
    assert any(line.startswith(budget_line(PINS.oracle)) for line in golden.layers["config"][0]["budget_log_lines"])


@pytest.mark.parametrize("release", PINS.candidates)
def test_other_pins_diverge_where_their_goldens_do(warm_sessions, release):
    """Another pin's live run, judged against the oracle's golden, first differs where the two
    releases' goldens first differ (on the budget between 0.27.1 and 0.28.0 on)."""
    golden = GOLDENS.load("dflash_27b_gate", PINS.oracle)
    verdict = judge(trace_of(warm_sessions, release, load_scenario(GATE)), golden, role="candidate")
    expected = compare_layer("config", [gate_config(PINS.oracle)], [gate_config(release)]).first
    if expected is None:
        assert verdict.kind == "pass", verdict
        return
    assert verdict.kind == "diverged"
    first = verdict.comparisons[0].first
    assert (first.path, first.expected, first.actual) == (expected.path, expected.expected, expected.actual)
    text = render([verdict], PINS.oracle)
    if gate_config(release)["max_num_scheduled_tokens"] != gate_config(PINS.oracle)["max_num_scheduled_tokens"]:
        assert "oracle   : " + budget_line(PINS.oracle) in text
        assert "candidate: " + budget_line(release) in text


def test_no_draft_reservation_double_of_the_port_is_caught(warm_sessions):
    """A candidate resolving the budget by the other rule than the oracle's (the seed's port left
    the reservation out where 0.27.1 makes it) diverges."""
    trace = trace_of(warm_sessions, PINS.oracle, load_scenario(GATE))
    record = trace.layers["config"][0]
    batched, slots = record["max_num_batched_tokens"], record["drafting_slots_per_request"] or 15
    record["max_num_scheduled_tokens"] = batched if RESERVES_IN_CONFIG[PINS.oracle] else batched - 4 * slots
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
    record = trace.layers["config"][0]
    assert trace.engine["version"] == release
    assert record["max_num_batched_tokens"] == 2048
    expected = 2048 - 4 * record["drafting_slots_per_request"] if RESERVES_IN_CONFIG[release] else 2048
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
    # the budget binds at step 0, as in the oracle's golden of the whole scenario
    step0 = GOLDENS.load("prefill_budget_binds", PINS.oracle).layers["steps"][0]
    assert layers["steps"][0]["total_num_scheduled_tokens"] == step0["total_num_scheduled_tokens"]
    assert sorted(r["id"] for r in layers["outputs"]) == ["r0", "r1", "r2"]
