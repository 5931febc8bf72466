"""Golden files: atomic writes, oracle-only, clear errors for broken files, orphans found."""

import json
import os
from unittest import mock

import pytest

from conformance import goldens
from conformance.goldens import GoldenRefused, golden_path, load_golden, orphans, write_golden
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
