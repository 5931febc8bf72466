"""Golden files: atomic writes, oracle-only, clear errors for broken files, orphans found."""

import json
import os
from unittest import mock

import pytest

from conformance.gate import golden_store as goldens
from conformance.gate.golden_store import GoldenRefused, golden_path, load_golden, orphans, write_golden
from conformance.trace import SCHEMA, TraceError, dumps

TRACE = {"schema": SCHEMA, "engine": {"label": "vllm-0.27.1"}, "scenario": {"name": "s", "sha256": "x"},
         "provenance": {"harness": "0"}, "layers": {"config": [{"max_num_scheduled_tokens": 4036}]}}


def test_candidate_may_not_write(tmp_path):
    with pytest.raises(GoldenRefused, match="never by a candidate"):
        write_golden(tmp_path / "g.json", TRACE, release=None)
    assert not (tmp_path / "g.json").exists()


def test_failed_run_may_not_write(tmp_path):
    with pytest.raises(GoldenRefused, match="failed"):
        write_golden(tmp_path / "g.json", {**TRACE, "failure": {"kind": "crash"}}, release="0.27.1")


def test_write_is_atomic_when_interrupted(tmp_path):
    path = tmp_path / "g.json"
    write_golden(path, TRACE, "0.27.1")
    before = path.read_bytes()
    changed = {**TRACE, "layers": {"config": [{"max_num_scheduled_tokens": 1}]}}
    with mock.patch.object(goldens.os, "replace", side_effect=KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            write_golden(path, changed, "0.27.1")
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["g.json"]  # no temporary file left behind
    assert write_golden(path, changed, "0.27.1") is True
    assert write_golden(path, changed, "0.27.1") is False
    assert json.loads(path.read_text())["layers"]["config"][0]["max_num_scheduled_tokens"] == 1


@pytest.mark.parametrize("content, words", [
    (None, "no such file"),
    (dumps(TRACE)[:40], "not valid JSON"),
    ("[]", "expected schema"),
    (json.dumps({**TRACE, "schema": "vllm-parity/trace/0"}), "older schema"),
    (json.dumps({**TRACE, "layers": {"config": 3}}), "must be a list"),
    (json.dumps({**TRACE, "failure": {"kind": "crash"}}), "finished oracle run"),
])
def test_broken_golden_names_the_file(tmp_path, content, words):
    path = tmp_path / "g.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TraceError) as err:
        load_golden(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_orphans(tmp_path):
    keep = golden_path("gate", "0.27.1", tmp_path)
    stray = golden_path("gone", "0.27.1", tmp_path)
    old_pin = golden_path("gate", "0.20.0", tmp_path)
    for p in (keep, stray, old_pin):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    assert orphans({"gate"}, ("0.27.1",), tmp_path) == sorted([stray, old_pin])


def test_killing_a_regeneration_leaves_every_golden_whole(tmp_path):
    """A real process rewriting goldens is SIGKILLed midway: each file is the old or the new one."""
    import signal
    import subprocess
    import sys
    import time

    script = f"""
import json, sys
sys.path.insert(0, {str(goldens.REPO_ROOT)!r})
from conformance.gate.golden_store import write_text_atomic
from pathlib import Path
big = [{{"step": i, "requests": {{"r": i}}}} for i in range(20000)]
n = 0
while True:
    for k in range(5):
        write_text_atomic(Path({str(tmp_path)!r}) / f"g{{k}}.json", json.dumps({{"n": n, "steps": big}}))
    n += 1
    print(n, flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()  # at least one full round written
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for k in range(5):
        data = json.loads((tmp_path / f"g{k}.json").read_text())  # parses: whole, never half
        assert len(data["steps"]) == 20000
