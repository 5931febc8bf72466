"""Integration, production scale through the command lines a user types: `make parity
SCALE=production` judges every prod_* scenario and the oracle passes its digest goldens, and a
TEST DEVICE mutant acting after step 1000 is `diverged` at its step through `parity gate`, both
sides' records shown. (The gate once joined a scenario's config piece and its steps+outputs piece
without the second's digests, so every engine of this mode, the oracle included, was
`unsupported`; the tests that took another path than the command line did not see it.)

The mutant's gate runs once per module (`midsize_gate`): its report is checked, and so is the
trace it wrote to its results folder (the candidate's records as they arrived, judged in the
digest form, with the oracle's window replayed live from step 0 and checked against the golden's
digests): the divergence deep in the run is reported at its first step with both sides' records
in full."""

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.formats.pins import load_pins
from conformance.gate.results import read_results
from conformance.gate.run import assemble
from conformance.judging.goldens import GOLDENS
from conformance.judging.judging import judge_trace
from conformance.judging.verdict import CANDIDATE
from conformance.report.render_text import render
from tests.helpers import REPO

pytestmark = pytest.mark.oracle
PINS = load_pins()
ORACLE = PINS.oracle
PRODUCTION = sorted(p.stem for p in (REPO / "scenarios").glob("prod_*.json"))
MIDSIZE_MUTANT = f"{ORACLE}+mutant:budget-minus-one-after-1000"


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "MAKEFLAGS", "MAKELEVEL")}


def test_make_parity_scale_production_passes_the_oracle_on_every_production_scenario():
    # STAND_INS=goldens: the other pins read from their goldens, so the oracle is the one engine
    # run (the make target's default, live stand-ins, is the same gate with two more engines)
    assert len(PRODUCTION) >= 5, PRODUCTION
    done = subprocess.run(["make", "-s", "parity", "SCALE=production", "STAND_INS=goldens"], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # make prints the command line it runs first ($(info)); the report's first line follows
    first = next((line for line in done.stdout.splitlines() if line.startswith("== vllm-parity gate")), "")
    assert first.startswith("== vllm-parity gate: PASS"), done.stdout[:2000]
    assert f"{len(PRODUCTION)} scenarios" in first
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()
            if line.split() and line.split()[0] in PRODUCTION}
    assert rows == {name: "pass" for name in PRODUCTION}, done.stdout[:3000]  # the oracle's column
    assert "unsupported" not in done.stdout.split("-- details")[0]


@pytest.fixture(scope="module")
def midsize_gate(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`parity gate` of the mutant budget-minus-one-after-1000 on prod_deep_midsize, and the
    results folder it wrote."""
    results = tmp_path_factory.mktemp("midsize") / "results"
    done = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "gate", "--scale", "production",
         "--scenario", str(REPO / "scenarios" / "prod_deep_midsize.json"),
         "--candidate", MIDSIZE_MUTANT, "--results", str(results)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    return done, results


def test_a_mutant_after_step_1000_is_diverged_at_its_step_with_the_records_shown(midsize_gate):
    done, _results = midsize_gate
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    assert out.startswith("== vllm-parity gate: FAIL"), out[:2000]
    found = re.search(r"layer steps: first divergence at step (\d+), field (\S+): oracle (\S+), candidate (\S+)", out)
    assert found, out[:4000]
    step, field, oracle, candidate = found.groups()
    # the first step from schedule() call 1000 on where the oracle's budget binds: its records
    # replayed live, so the field is named (not `<digest>`) with both values
    assert int(step) >= 1000 and field != "<digest>" and int(oracle) == int(candidate) + 1
    assert re.search(r"total_num_scheduled_tokens\s+1024\s+1023", out), out[:4000]
    assert "per request at this step" in out  # every request's state there, both sides


def test_a_deep_divergence_is_reported_at_its_first_step_in_full(midsize_gate):
    golden = GOLDENS.lookup("prod_deep_midsize", ORACLE)
    assert golden.trace is not None, "no golden for prod_deep_midsize: `parity goldens --scale production`"
    manifest, traces = read_results([midsize_gate[1]], PINS)
    [replayed] = [t for e, t in assemble(manifest.engines, ["prod_deep_midsize"], manifest.units, traces)
                  if e.role == CANDIDATE]
    assert replayed.failure is None, replayed.failure
    # the candidate's steps as the gate keeps them (golden_sinks): digests and the window there
    assert "window" in replayed.digests["steps"] and "steps" not in replayed.layers
    window = replayed.digests["steps"]["oracle_window"]  # the oracle's, replayed live
    assert "problem" not in window, window.get("problem")
    trace = replace(replayed, digests=dict(replayed.digests, steps={
        k: v for k, v in replayed.digests["steps"].items() if k != "oracle_window"}))

    verdict = judge_trace(replayed, golden, "candidate")
    assert verdict.kind == "diverged"
    steps = next(c for c in verdict.comparisons if c.layer == "steps" and not c.equal)
    n = steps.index
    oracle, mine = steps.record, steps.actual_record
    # the first step from schedule() call 1000 on where the oracle's budget binds: every
    # earlier record has the golden's digest, and the candidate cannot schedule a full budget
    assert n >= 1000 and oracle["step"] == mine["step"] == n
    assert oracle["total_num_scheduled_tokens"] == oracle["token_budget"] == 1024
    assert (mine["token_budget"], mine["total_num_scheduled_tokens"]) == (1023, 1023)
    paths = [f.path for f in steps.fields]
    assert "total_num_scheduled_tokens" in paths and paths[-1] == "token_budget"  # the budget last
    assert steps.first.path != "token_budget"
    # without the oracle's records there (no replay, no checkpoint), the step is still exact
    digests = golden.trace.digests
    bare = replace(golden.trace, digests=dict(digests, steps=dict(digests["steps"], checkpoints={})))
    blind = judge_trace(trace, bare, "candidate")
    blind_steps = next(c for c in blind.comparisons if c.layer == "steps" and not c.equal)
    assert blind_steps.index == n and "live replay" in blind_steps.explanation

    text = render([verdict], ORACLE)
    assert f"step {n}" in text and steps.first.path.split(".")[-1] in text
