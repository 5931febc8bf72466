"""Integration: `parity gate` end to end with the real oracle and a candidate with the seed's
bug. The candidate is the TEST DOUBLE engine answering the oracle's own config record with the
budget by the other rule (a process that starts in a fraction of a second): the real engine with that bug is
tests/engines/test_steps_oracle.py's and tests/engines/test_engine_layer.py's mutant."""

import json
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conformance.formats.pins import load_pins
from conformance.judging.goldens import GOLDENS
from tests.helpers import DOUBLE, GATE

pytestmark = pytest.mark.oracle
PINS = load_pins()
RECORD = GOLDENS.load("dflash_27b_gate", PINS.oracle).layers["config"][0]
BUDGET, BATCHED = RECORD["max_num_scheduled_tokens"], RECORD["max_num_batched_tokens"]
# the seed's bug where the oracle reserves the drafting slots of 4 requests in the config (all
# 4096); where it does not, a port reserving them anyway (4096 - 4 x 15)
BUGGED = BATCHED if BUDGET != BATCHED else BATCHED - 4 * 15
WAIVER = """
[[waiver]]
row = "ENG-SCHED-CORE"
scenario = "dflash_27b_gate"
field = "config.max_num_scheduled_tokens"
reason = "the port lacks the drafting-slot reservation (PORT-129/156)"
owner = "port-team"
expires = {expires}
"""


def waivers(folder, expires):
    (folder / "waivers.toml").write_text(WAIVER.format(expires=expires))
    (folder / "step_summary.md").write_text("an earlier step's summary\n")
    return dict(os.environ, GITHUB_STEP_SUMMARY=str(folder / "step_summary.md"))


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """One real gate run (the oracle's cold start is the cost), its results folder kept for
    `parity merge` to judge again under other waivers."""
    folder = tmp_path_factory.mktemp("gate")
    env = waivers(folder, "2099-12-31")
    (folder / "record.json").write_text(json.dumps({**RECORD, "max_num_scheduled_tokens": BUGGED}))
    candidate = shlex.join([sys.executable, str(DOUBLE), "--record", str(folder / "record.json")])
    result = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "gate", "--scenario", str(GATE), "--candidate", candidate,
         "--waivers", str(folder / "waivers.toml"), "--reports", str(folder / "out"),
         "--results", str(folder / "results")],
        capture_output=True, text=True, timeout=900, env=env)
    return folder, result


@pytest.mark.xdist_group("gate-cli")  # both tests read the one gate run
def test_gate_with_a_waiver_passes_and_writes_three_reports(gated):
    folder, result = gated
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"max_num_scheduled_tokens: oracle {BUDGET}, candidate {BUGGED}" in result.stdout
    junit = ET.parse(folder / "out" / "junit.xml").getroot()
    assert junit.find(".//skipped").get("message").startswith("waived by ")
    assert "waived" in (folder / "out" / "summary.md").read_text()
    assert "<svg" not in (folder / "out" / "report.html").read_text()  # config layer only: no steps
    assert "cold starts: 2 for 2 engines" in result.stderr


@pytest.mark.xdist_group("gate-cli")
def test_an_expired_waiver_fails_the_gate(gated, tmp_path):
    """The same run judged again by `parity merge` (the gate's own judging, from its results
    folder), now under an expired waiver."""
    folder, _ = gated
    env = waivers(tmp_path, "2020-01-01")
    result = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "merge", str(folder / "results"),
         "--waivers", str(tmp_path / "waivers.toml"), "--reports", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "EXPIRED waiver" in result.stdout
    summary = (tmp_path / "step_summary.md").read_text()  # appended, as GitHub Actions expects
    assert summary.startswith("an earlier step's summary\n") and "EXPIRED" in summary.upper()
