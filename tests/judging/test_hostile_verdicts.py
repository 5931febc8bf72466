"""A hostile candidate's verdicts: a token flip judged by the oracle's margin, a waiver that
leaves the oracle's own divergence failing, a verdict filed under every row of its scenario, and
`make`'s targets saying the gate's own status. Its engines are the hostile TEST DOUBLE
(tests/doubles/hostile_engine.py), which replays the oracle's own goldens with an attacker's
edits; the goldens it is judged against are the real oracle's."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import REPO, gate_engine, hostile_double

VERDICTS_ENGINE_LAYERS = "engine_config,engine_steps,engine_outputs"


@pytest.fixture
def verdicts_gate(tmp_path, monkeypatch, capsys):
    """`parity gate` in this process. Its oracle is a TEST DOUBLE replaying the real oracle's
    goldens (unedited unless `oracle_plan` says), its candidate the hostile TEST DOUBLE; both
    are judged against the committed goldens, as the real oracle and a port would be."""
    from conformance import cli
    from conformance.gate import plan as gate_plan

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(scenario: str, plan: dict, *argv: str, oracle_plan: dict | None = None):
        oracle = hostile_double(tmp_path, "oracle", oracle_plan or {"serve": plan.get("serve")})
        candidate = hostile_double(tmp_path, "candidate", plan)
        engines = [gate_engine("TEST-DOUBLE-oracle=" + oracle, "oracle"),
                   gate_engine("TEST-DOUBLE-candidate=" + candidate, "candidate")]
        monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: engines)
        capsys.readouterr()
        status = cli.main(["gate", "--scenario", str(REPO / "scenarios" / f"{scenario}.json"),
                           "--jobs", "1", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def verdicts_wrong_budget() -> int:
    """The drafting-slot bug's budget on dflash_27b_gate: one the oracle's golden does not hold
    (its budget with the 4 x 15 drafting slots left out of the reservation, or put back in)."""
    from conformance.formats.pins import load_pins
    from conformance.judging.goldens import GOLDENS

    budget = GOLDENS.load("dflash_27b_gate", load_pins().oracle).layers["config"][0]["max_num_scheduled_tokens"]
    return budget + 60 if budget < 4096 else budget - 60


def verdicts_golden_outputs(scenario: str) -> list[dict]:
    from conformance.formats.pins import load_pins
    from conformance.judging.goldens import GOLDENS

    return GOLDENS.load(scenario, load_pins().oracle).layers["engine_outputs"]


def test_a_runner_up_token_beyond_the_oracles_margin_then_junk_fails_the_gate(verdicts_gate, tmp_path):
    """engine_ngram, request r0, output position 0: the oracle's top-1 (1324) leads the runner-up
    (1292) by 2.68 nats, against a tolerance of 0.001. A candidate that emits the runner-up,
    claims a near-tie in its own logprobs, then emits junk for the 63 positions left, diverges."""
    r0 = verdicts_golden_outputs("engine_ngram")[0]
    top = r0["logprobs"][0]
    assert r0["id"] == "r0" and [t for t, _ in top[:2]] == [1324, 1292]
    assert round(top[0][1] - top[1][1], 2) == 2.68 and len(r0["output_token_ids"]) == 64
    plan = {"serve": VERDICTS_ENGINE_LAYERS.split(","), "edits": [
        {"layer": "engine_outputs", "seq": 0, "path": ["output_token_ids"], "value": [1292] + [7] * 63},
        {"layer": "engine_outputs", "seq": 0, "path": ["logprobs", 0],
         "value": [[1292, -0.08], [1324, -0.0801]]}]}
    status, out, err = verdicts_gate("engine_ngram", plan, "--layers", VERDICTS_ENGINE_LAYERS, "--waivers", "/dev/null")
    assert status == 1, out + err
    assert "TEST-DOUBLE-candidate" in out and "r0.output_token_ids[0]" in out
    assert ("evidence: output token differs at request r0, output position 0: the oracle's top-1 margin "
            "over the candidate's token there is 2.683, beyond the tolerance 0.001") in out
    assert "== vllm-parity gate: FAIL" in out.splitlines()[0]


def test_the_closest_call_in_the_goldens_is_judged_by_the_scenarios_tolerance(verdicts_gate):
    """engine_eagle3, request r2, output position 31 (its last): the closest call of any engine
    golden, the oracle's top-1 (863) ahead of the runner-up (1700) by 0.0015, against a
    tolerance of 0.001 (no golden holds a margin within it: a genuine near-tie staying
    `numerics` is tests/judging/test_numerics.py's). A candidate emitting 1700 there, its top-k the
    oracle's own, diverges, the margin named."""
    r2 = next(r for r in verdicts_golden_outputs("engine_eagle3") if r["id"] == "r2")
    top = r2["logprobs"][31]
    assert [t for t, _ in top[:2]] == [863, 1700] and round(top[0][1] - top[1][1], 4) == 0.0015
    swapped = [[1700, top[1][1]], [863, top[0][1]]] + top[2:]
    plan = {"serve": VERDICTS_ENGINE_LAYERS.split(","), "edits": [
        {"layer": "engine_outputs", "seq": 2, "path": ["output_token_ids", 31], "value": 1700},
        {"layer": "engine_outputs", "seq": 2, "path": ["logprobs", 31], "value": swapped}]}
    status, out, err = verdicts_gate("engine_eagle3", plan, "--layers", VERDICTS_ENGINE_LAYERS, "--waivers", "/dev/null")
    # 0.0015 is beyond 0.001: a mismatch, not a near-tie (the tolerance is the scenario's)
    assert status == 1, out + err
    assert "margin over the candidate's token there is 0.0015, beyond the tolerance 0.001" in out


def test_a_verdict_is_filed_under_every_row_of_its_scenario_in_the_terminal_and_junit(verdicts_gate, tmp_path):
    """The drafting-slot bug (max_num_scheduled_tokens 4096 where 0.27.1 resolves 4036) on
    dflash_27b_gate, whose rows are ENG-SCHED-CORE and SPEC-DFLASH, beside method_matrix (filed
    under SPEC-DFLASH first). SPEC-DFLASH must count the divergence, not read `2 pass`."""
    import xml.etree.ElementTree as ET

    plan = {"serve": ["config", "methods"], "edits": [
        {"scenario": "dflash_27b_gate", "layer": "config", "seq": 0, "path": ["max_num_scheduled_tokens"],
         "value": verdicts_wrong_budget()}]}
    reports = tmp_path / "reports"
    status, out, err = verdicts_gate("dflash_27b_gate", plan, "--scenario", str(REPO / "scenarios" / "method_matrix.json"),
                                     "--waivers", "/dev/null", "--reports", str(reports))
    assert status == 1, out + err
    rows = out[out.index("-- by engine-matrix row"):].splitlines()
    # per role, never summed: the candidate's divergence beside the oracle's self-check
    assert any(line.split() == ["ENG-SCHED-CORE", "candidate:", "1", "diverged;", "oracle", "self-check:", "1", "pass"]
               for line in rows), rows
    assert any(line.split() == ["SPEC-DFLASH", "candidate:", "1", "pass,", "1", "diverged;", "oracle", "self-check:",
                                "2", "pass"] for line in rows), rows
    suites = {s.get("name"): s for s in ET.parse(reports / "junit.xml").getroot().iter("testsuite")}
    for row in ("ENG-SCHED-CORE", "SPEC-DFLASH"):
        failed = [c.get("name") for c in suites[row].iter("testcase") if c.find("failure") is not None]
        assert failed == [f"{row} / dflash_27b_gate / TEST-DOUBLE-candidate / config"], (row, failed)
        assert suites[row].get("failures") == "1"


VERDICTS_SLOT_BUG = {"serve": ["config"], "edits": [
    {"layer": "config", "seq": 0, "path": ["max_num_scheduled_tokens"], "value": verdicts_wrong_budget()}]}


@pytest.mark.parametrize("engine", ["", 'engine = "TEST-DOUBLE-candidate"', 'engine = "TEST-DOUBLE-*"'])
def test_a_waiver_for_a_candidate_leaves_the_oracles_own_divergence_failing(verdicts_gate, tmp_path, engine):
    """The oracle's worker (a TEST DOUBLE in its role) fails to reproduce its golden at the very
    field a port's waiver names: the port is waived, the oracle still fails the gate, whether
    the waiver names no engine, the candidate, or a pattern that matches the oracle's label too."""
    waivers = tmp_path / "waivers.toml"
    waivers.write_text(f'''[[waiver]]
row = "SPEC-DFLASH"
scenario = "dflash_27b_gate"
field = "config.max_num_scheduled_tokens"
reason = "the port lacks the drafting reservation"
owner = "port-team"
expires = 2999-01-01
{engine}
''', encoding="utf-8")
    status, out, err = verdicts_gate("dflash_27b_gate", VERDICTS_SLOT_BUG, "--waivers", str(waivers),
                                     oracle_plan=VERDICTS_SLOT_BUG)
    assert status == 1, out + err
    cells = out.splitlines()[out.splitlines().index("-- by engine-matrix row") + 2].split()
    assert cells == ["SPEC-DFLASH", "candidate:", "1", "waived;", "oracle", "self-check:", "1", "diverged"], out
    assert "== TEST-DOUBLE-oracle [oracle, must reproduce its golden] on dflash_27b_gate" in out
    assert "unused waiver" not in out


# A TEST DOUBLE of the `parity` command for the Makefile's targets (make is run with BIN=its
# folder): `parity gate ...` is the real gate, on dflash_27b_gate's config, its oracle's worker
# and its candidate hostile TEST DOUBLEs (the candidate with the drafting-slot bug when asked).
VERDICTS_PARITY_SHIM = """#!{python}
import sys
sys.path[:0] = [{repo!r}]
from conformance import cli
from conformance.formats.engine_ref import EngineRef
from conformance.gate import plan
if sys.argv[1] != "gate":
    sys.exit(0)  # `parity envs`: nothing to build for TEST DOUBLEs
oracle, candidate = {oracle!r}, {candidate!r}
plan.gate_engines = lambda pins, candidates, log, stand_ins=None: [
    EngineRef.parse("TEST-DOUBLE-oracle=" + oracle, pins, named=True).with_role("oracle"),
    EngineRef.parse("TEST-DOUBLE-candidate=" + candidate, pins, named=True).with_role("candidate")]
sys.exit(cli.main(sys.argv[1:] + ["--scenario", {scenario!r}, "--layers", "config", "--jobs", "1",
                                  "--waivers", "/dev/null"]))
"""


@pytest.mark.parametrize("target", ["parity", "gate"])
@pytest.mark.parametrize("diverges", [True, False])
def test_make_says_the_gates_own_status(tmp_path, target, diverges):
    """GNU make exits 2 whenever a command fails (0 or 2 only); the target says the gate's own
    status, so a reader of a `make parity` log can tell a divergence (1) from an error (2)."""
    plan = VERDICTS_SLOT_BUG if diverges else {"serve": ["config"]}
    done = verdicts_make(tmp_path, target, VERDICTS_PARITY_SHIM.format(
        python=sys.executable, repo=str(REPO), scenario=str(REPO / "scenarios" / "dflash_27b_gate.json"),
        oracle=hostile_double(tmp_path, "oracle", {"serve": ["config"]}),
        candidate=hostile_double(tmp_path, "candidate", plan)))
    said = (f"make {target}: parity gate exited with status 1 (1: a gating engine diverged, 2: a gating "
            "run could not be compared or bad input, 3: a bug of the harness (traceback above)); make exits 2 on any failure, so CI that needs "
            "this status calls .venv/bin/parity gate")
    if diverges:
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in done.stderr and "[gate] exit status 1" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "exited with status" not in done.stderr
    # the command, as it ran, on stderr: stdout holds the report alone (`make parity > report.txt`)
    said = [line for line in done.stderr.splitlines() if line.startswith(f"{tmp_path}/bin/parity gate")]
    assert said, done.stderr
    assert done.stdout.startswith("== vllm-parity gate: "), done.stdout[:300]
    assert "[gate]" not in done.stdout and "parity gate --" not in done.stdout
    assert (tmp_path / "out" / "gate" / "junit.xml").is_file() == (target == "gate")


def test_make_fuzz_says_the_fuzzers_own_status(tmp_path):
    # the fuzzer's part is a TEST DOUBLE here: a `parity fuzz` that reports a confirmed finding
    done = verdicts_make(tmp_path, "fuzz", f"#!{sys.executable}\nimport sys\nsys.exit(1 if sys.argv[1] == 'fuzz' else 0)\n",
                         "CANDIDATE=./port --parity")
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("make fuzz: parity fuzz exited with status 1 (1: a confirmed finding, 2: bad input, an engine "
            "that cannot start, or a finding that did not repeat, 3: a bug of the harness (traceback above)); make exits 2 on any failure, so CI that "
            "needs this status calls .venv/bin/parity fuzz") in done.stderr


@pytest.mark.parametrize("target", ["parity", "gate"])
def test_make_builds_only_the_environments_its_gate_runs(tmp_path, target):
    """`make parity CANDIDATE=...` builds the pins the gate's plan runs (the oracle's alone for
    a port), not every pin: `parity envs` is given the plan's options, the gate the same ones."""
    said = tmp_path / "argv.jsonl"
    shim = (f"#!{sys.executable}\nimport json, sys\n"
            f"open({str(said)!r}, 'a', encoding='utf-8').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    done = verdicts_make(tmp_path, target, shim, "CANDIDATE=./port --parity", "LAYERS=config,steps", "DRIFT=1")
    assert done.returncode == 0, done.stdout + done.stderr
    envs, gate = [json.loads(line) for line in said.read_text(encoding="utf-8").splitlines()]
    plan = ["--candidate", "./port --parity", "--layers", "config,steps"]
    assert envs == ["envs", *plan]
    assert gate[0] == "gate" and gate[-len(plan) - 1:] == [*plan, "--drift"]


@pytest.mark.parametrize("variables, plan", [((), ["--stand-ins", "goldens"]),
                                             (("STAND_INS=live",), ["--stand-ins", "live"]),
                                             (("SCALE=production",), ["--stand-ins", "live", "--scale", "production"])])
def test_make_parity_without_a_candidate_builds_what_its_stand_ins_need(tmp_path, variables, plan):
    """With no CANDIDATE the stand-ins are read from their goldens, so `parity envs` is given
    the plan that builds the oracle's environment alone (tests/gate/test_recorded.py); STAND_INS=live
    gives the plan that builds every pin's."""
    said = tmp_path / "argv.jsonl"
    shim = (f"#!{sys.executable}\nimport json, sys\n"
            f"open({str(said)!r}, 'a', encoding='utf-8').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    done = verdicts_make(tmp_path, "parity", shim, *variables)
    assert done.returncode == 0, done.stdout + done.stderr
    envs, gate = [json.loads(line) for line in said.read_text(encoding="utf-8").splitlines()]
    assert envs == ["envs", *plan] and gate == ["gate", *plan]


def verdicts_make(tmp_path, target: str, shim: str, *variables: str):
    """`make TARGET` with the project's Makefile, run in tmp_path (its reports land there), with
    BIN= a folder holding `shim` as `parity`; -o setup, -o envs: nothing is installed or built
    (plan-envs runs the shim's `parity envs`)."""
    import os
    import shutil
    import subprocess

    assert shutil.which("make"), "make is needed to run the Makefile's targets"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "parity").write_text(shim, encoding="utf-8")
    (bin_dir / "parity").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "MAKEFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "-o", "setup", "-o", "envs", target, f"BIN={bin_dir}",
                           *variables], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
