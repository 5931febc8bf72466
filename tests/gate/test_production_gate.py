"""Integration, production scale through the command lines a user types: `make parity
SCALE=production` judges every prod_* scenario and the oracle passes its digest goldens, and a
TEST DEVICE mutant acting after step 1000 is `diverged` at its step through `parity gate`, both
sides' records shown. (The gate once joined a scenario's config piece and its steps+outputs piece
without the second's digests, so every engine of this mode, the oracle included, was
`unsupported`; the tests that took another path than the command line did not see it.)"""

import os
import re
import subprocess
import sys

import pytest

from conformance.formats.pins import load_pins
from tests.helpers import REPO

pytestmark = pytest.mark.oracle
ORACLE = load_pins().oracle
PRODUCTION = sorted(p.stem for p in (REPO / "scenarios").glob("prod_*.json"))


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


def test_a_mutant_after_step_1000_is_diverged_at_its_step_with_the_records_shown():
    done = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "gate", "--scale", "production",
         "--scenario", str(REPO / "scenarios" / "prod_deep_midsize.json"),
         "--candidate", f"{ORACLE}+mutant:budget-minus-one-after-1000"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
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
