"""Golden files: one store and one lifecycle (atomic, oracle-only writes; a golden that holds is
kept), clear errors for broken files, orphans found."""

import json
import os
from unittest import mock

import pytest

from conformance.formats import files
from conformance.formats.pins import load_pins
from conformance.formats.trace import SCHEMA, Trace, TraceError, dumps
from conformance.judging import goldens, provenance
from conformance.judging.goldens import GOLDENS, KEEP, NEW, REWRITE, GoldenRefused, GoldenStore, read_golden

# A golden of the gate oracle as it writes one (every field of its provenance and record), for
# a scenario "s" and a CPU of its own
ORACLE = load_pins().oracle
OTHER = next(r for r in load_pins().releases if r != ORACLE)
GATE = GOLDENS.load("dflash_27b_gate", ORACLE)
BUDGET = GATE.layers["config"][0]["max_num_scheduled_tokens"]  # what the oracle resolves
ENV = {**GATE.provenance["environment"], "cpu": {"model": "x", "isa": "avx2", "flags_sha256": "f"}}
TRACE_JSON = {"schema": SCHEMA, "engine": GATE.engine, "scenario": {"name": "s", "sha256": "x"},
              "provenance": {"harness": "0", "environment": ENV}, "layers": GATE.layers}


def T(data) -> Trace:
    """A trace from its JSON (a test's edit of one)."""
    return Trace.from_json(dict(data), "test")


TRACE = T(TRACE_JSON)


def test_candidate_may_not_write(tmp_path):
    with pytest.raises(GoldenRefused, match="never by a candidate"):
        GoldenStore(tmp_path).update(TRACE, release=None)
    assert not list(tmp_path.iterdir())


def test_failed_run_may_not_write(tmp_path):
    with pytest.raises(GoldenRefused, match="failed"):
        GoldenStore(tmp_path).update(T({**TRACE_JSON, "failure": {"kind": "crash"}}), release=ORACLE)


def test_another_releases_trace_may_not_write(tmp_path):
    with pytest.raises(GoldenRefused, match=f"not the trace of vLLM {OTHER}"):
        GoldenStore(tmp_path).update(TRACE, release=OTHER)


def test_one_lifecycle_new_kept_rewritten(tmp_path):
    store = GoldenStore(tmp_path)
    first = store.update(TRACE, ORACLE)
    assert first.action == NEW and first.summary.startswith(f"[goldens] new: {store.path('s', ORACLE)}: config 1 record(s)")
    assert store.write(first) and store.path("s", ORACLE).read_text() == dumps(TRACE)
    again = store.update(TRACE, ORACLE)
    assert again.action == KEEP and again.check.rule == "bytes" and not store.write(again)
    changed = T({**TRACE_JSON, "layers": {"config": [{**GATE.layers["config"][0], "max_num_scheduled_tokens": 1}]}})
    rewrite = store.update(changed, ORACLE)
    assert rewrite.action == REWRITE and "byte for byte" in rewrite.reason
    assert (f"config record 0, max_num_scheduled_tokens: golden says {BUDGET}, the oracle run now gives 1"
            in rewrite.summary)
    store.path("s", ORACLE).write_text("{not json")
    broken = store.update(TRACE, ORACLE)
    assert broken.action == REWRITE and broken.reason.startswith("unreadable:")
    assert "the old file was unreadable" in broken.summary


def test_an_unreadable_golden_is_rewritten(tmp_path):
    store = GoldenStore(tmp_path)
    path = store.path("s", ORACLE)
    path.parent.mkdir()
    path.write_bytes(b"\xff\xfe not UTF-8")
    outcome = store.regenerate(TRACE, ORACLE, write=True)
    assert outcome.update.action == REWRITE and outcome.update.reason.startswith("unreadable:")
    assert outcome.written and path.read_text() == dumps(TRACE)


def on_gpu(trace: Trace, release: str) -> Trace:
    """`trace` as pin `release` run on a GPU would have written it (its provenance says so)."""
    env = {**trace.provenance["environment"], "device": "gpu", "vllm": release, "build": f"vllm=={release}"}
    return T({**trace.to_json(), "engine": {**trace.engine, "version": release, "label": f"vllm-{release}"},
              "provenance": {"harness": "0", "environment": env}})


def test_a_gpu_run_never_writes_a_golden_a_cpu_writes(tmp_path):
    """Whoever asks (`parity goldens`, the goldens suite): a trace with a GPU's provenance writes
    only the engine goldens of a pin without a CPU engine build; nothing else, new or rewritten."""
    store = GoldenStore(tmp_path)
    # 0.33.0's goldens of the stand-in layers: written on CPU by the same build a GPU runs
    with pytest.raises(GoldenRefused, match="from a run on a GPU"):
        store.regenerate(on_gpu(TRACE, "0.33.0"), "0.33.0", write=True)
    engine = GOLDENS.load("engine_ngram", "0.27.1")
    with pytest.raises(GoldenRefused, match="refusing to write"):  # a CPU engine build writes its goldens
        store.regenerate(on_gpu(engine, "0.27.1"), "0.27.1", write=True)
    assert not list(tmp_path.rglob("*.json"))
    outcome = store.regenerate(on_gpu(engine, "0.33.0"), "0.33.0", write=True)  # no CPU can write it
    assert outcome.written and store.path("engine_ngram", "0.33.0").exists()


def test_a_golden_from_another_machine_holds_within_tolerance(tmp_path):
    store = GoldenStore(tmp_path)
    store.write(store.update(TRACE, ORACLE))
    elsewhere = T({**TRACE_JSON, "provenance": {"harness": "0", "environment": {**ENV, "cpu": {**ENV["cpu"], "model": "y"}}}})
    update = store.update(elsewhere, ORACLE)
    assert update.action == KEEP and update.check.rule == "tolerance"


def test_goldens_check_words_the_golden_then_the_fresh_run():
    """A golden edited by hand (one computed_tokens + 1) against the oracle's fresh run: the
    words say what the golden (its path from the repository root) says and what the oracle run
    now gives. Before, the edited golden read as "oracle 271" and the fresh run as "candidate 270",
    naming only the golden's base name."""
    run = GOLDENS.load("steady_decode", ORACLE)
    run = T({**run.to_json(), "provenance": {**run.provenance, "environment": {**run.provenance["environment"], "cpu": ENV["cpu"]}}})
    edited = json.loads(GOLDENS.path("steady_decode", ORACLE).read_text(encoding="utf-8"))
    step = edited["layers"]["steps"][3]
    request = sorted(step["requests"])[0]
    fresh = step["requests"][request]["computed_tokens"]
    step["requests"][request]["computed_tokens"] = fresh + 1
    update = GOLDENS.update(run, ORACLE, json.dumps(edited))
    words = update.explain()
    path = f"goldens/steady_decode/vllm-{ORACLE}.json"
    assert update.action == REWRITE and words.startswith(f"{path} does not hold (tolerance rule)"), words
    assert (f"steps step 3, requests.{request}.computed_tokens: golden ({path}) says {fresh + 1}, "
            f"the oracle run now gives {fresh}") in words, words
    assert "candidate" not in words and "oracle " + str(fresh + 1) not in words


def test_write_is_atomic_when_interrupted(tmp_path):
    store = GoldenStore(tmp_path)
    path = store.path("s", ORACLE)
    store.write(store.update(TRACE, ORACLE))
    before = path.read_bytes()
    changed = T({**TRACE_JSON, "layers": {"config": [{**GATE.layers["config"][0], "max_num_scheduled_tokens": 1}]}})
    with mock.patch.object(files.os, "replace", side_effect=KeyboardInterrupt):  # the one durable writer
        with pytest.raises(KeyboardInterrupt):
            store.write(store.update(changed, ORACLE))
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == [f"vllm-{ORACLE}.json"]  # no temporary file left behind
    assert store.write(store.update(changed, ORACLE)) is True
    assert store.update(changed, ORACLE).action == KEEP
    assert json.loads(path.read_text())["layers"]["config"][0]["max_num_scheduled_tokens"] == 1


def _unfaithful(text: str) -> str:
    """A golden whose provenance says its build's sources are not the official wheel's."""
    edited = json.loads(text)
    edited["provenance"]["environment"]["fidelity"]["equal"] = False
    return dumps(edited)


def test_goldens_check_fails_a_golden_written_by_an_unfaithful_build_naming_it():
    """goldens-check judged only the records, so a golden whose provenance says
    `fidelity.equal: false` held (from another CPU, by the tolerance rule)."""
    run = GOLDENS.load("steady_decode", ORACLE)
    run = T({**run.to_json(), "provenance": {**run.provenance, "environment": {**run.provenance["environment"], "cpu": ENV["cpu"]}}})
    path = GOLDENS.path("steady_decode", ORACLE)
    assert GOLDENS.update(run, ORACLE, path.read_text(encoding="utf-8")).action == KEEP  # as committed
    update = GOLDENS.update(run, ORACLE, _unfaithful(path.read_text(encoding="utf-8")))
    words = update.explain()
    assert update.action == REWRITE and words.startswith(f"goldens/steady_decode/vllm-{ORACLE}.json does not hold"), words
    assert "provenance.environment.fidelity.equal: expected true" in words, words
    with pytest.raises(TraceError, match="fidelity.equal"):
        GOLDENS.check(T(json.loads(_unfaithful(path.read_text(encoding="utf-8")))), ORACLE, path)


@pytest.mark.oracle
def test_the_goldens_suite_fails_an_unfaithful_golden_from_a_real_oracle_run(tmp_path, warm_sessions):
    """The goldens suite's front door (parity/test_goldens.py: regenerate, then explain) on the
    oracle's real run, against a golden whose provenance says fidelity.equal false."""
    from conformance.formats.scenario import load_scenario
    from conformance.regenerate.lifecycle import golden_trace
    from tests.helpers import REPO

    store = GoldenStore(tmp_path)
    store.path("steady_decode", ORACLE).parent.mkdir()
    store.path("steady_decode", ORACLE).write_text(_unfaithful(GOLDENS.path("steady_decode", ORACLE).read_text(
        encoding="utf-8")), encoding="utf-8")
    scenario = load_scenario(REPO / "scenarios" / "steady_decode.json")
    outcome = store.regenerate(golden_trace(warm_sessions(ORACLE), scenario), ORACLE)
    assert outcome.update.changes and outcome.update.action == REWRITE
    assert str(store.path("steady_decode", ORACLE)) in outcome.update.explain()
    assert "fidelity.equal" in outcome.update.explain()


def test_a_missing_or_invalid_golden_is_looked_up_as_such(tmp_path):
    store = GoldenStore(tmp_path)
    missing = store.lookup("s", ORACLE)
    assert (missing.trace, missing.kind) == (None, "missing_golden") and "make goldens" in missing.message
    store.path("s", ORACLE).parent.mkdir()
    store.path("s", ORACLE).write_text("[]")
    invalid = store.lookup("s", ORACLE)
    assert invalid.kind == "invalid_golden" and "expected schema" in invalid.message
    with pytest.raises(TraceError, match="expected schema"):
        store.load("s", ORACLE)


@pytest.mark.parametrize("content, words", [
    (None, "no such file"),
    (dumps(TRACE)[:40], "not valid JSON"),
    ("[]", "expected schema"),
    (json.dumps({**TRACE_JSON, "schema": "vllm-parity/trace/0"}), "older schema"),
    (json.dumps({**TRACE_JSON, "layers": {"config": 3}}), "must be a list"),
    (json.dumps({**TRACE_JSON, "failure": {"kind": "crash"}}), "finished oracle run"),
])
def test_broken_golden_names_the_file(tmp_path, content, words):
    path = tmp_path / "g.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TraceError) as err:
        read_golden(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_orphans(tmp_path):
    store = GoldenStore(tmp_path)
    keep, stray, old_pin = store.path("gate", ORACLE), store.path("gone", ORACLE), store.path("gate", "0.20.0")
    for p in (keep, stray, old_pin):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    assert store.orphans({"gate"}, (ORACLE,)) == sorted([stray, old_pin])


def test_killing_a_regeneration_leaves_every_golden_whole(tmp_path):
    """A real process rewriting goldens is SIGKILLed midway: each file is the old or the new one."""
    import signal
    import subprocess
    import sys
    import time

    script = f"""
import json, sys
sys.path.insert(0, {str(goldens.REPO_ROOT)!r})
from conformance.judging.goldens import write_text_atomic
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


MAX_GOLDEN_BYTES = 2_000_000  # issue 26: a golden, production-scale ones included, in git
COMPRESSED = (b"\x1f\x8b", b"\x28\xb5\x2f\xfd", b"\xfd7zXZ", b"BZh")  # gzip, zstd, xz, bzip2


def test_every_golden_is_at_most_2_mb_in_git_and_not_compressed():
    """The bytes git stores for each golden (the blob at HEAD, or the working file not yet
    committed): a production scenario's golden is its digest form, never a compressed trace."""
    import subprocess

    root = GOLDENS.root
    listed = subprocess.run(["git", "ls-tree", "-r", "-l", "HEAD", "--", str(root)], cwd=root,
                            capture_output=True, text=True, encoding="utf-8", check=True).stdout
    in_git = {line.split("\t")[1]: int(line.split()[3]) for line in listed.splitlines()}
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                         encoding="utf-8", check=True).stdout.strip()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    assert files
    for path in files:
        size = in_git.get(path.relative_to(top).as_posix(), path.stat().st_size)
        assert size <= MAX_GOLDEN_BYTES, f"{path}: {size} bytes in git, more than {MAX_GOLDEN_BYTES}"
        assert path.suffix in (".json",) and not path.read_bytes().startswith(COMPRESSED), f"{path}: compressed"


# --- the float32 matmul precision in provenance (conformance/formats/precision.py) -------------

NUMERICS = {"float32_matmul_precision": "highest", "batch_invariant": False, "cuda": None}


def with_env(trace: Trace, **env) -> Trace:
    return T({**trace.to_json(), "provenance": {**trace.provenance, "environment": {**trace.provenance["environment"], **env}}})


def test_every_committed_golden_keeps_a_valid_provenance_with_or_without_the_precision():
    """Goldens written before the precision was recorded hold the provenance schema as they are."""
    paths = sorted(goldens.GOLDEN_DIR.glob("*/vllm-*.json"))
    assert len(paths) > 300
    for path in paths:
        golden = T(json.loads(path.read_text(encoding="utf-8")))
        provenance.check_provenance(golden, golden.engine["version"], load_pins())
        assert golden.environment.get("float32_matmul_precision", "highest") == "highest"


def test_a_golden_records_the_precision_and_only_full_float32(tmp_path):
    store = GoldenStore(tmp_path)
    store.write(store.update(with_env(TRACE, **NUMERICS), ORACLE))
    assert json.loads(store.path("s", ORACLE).read_text())["provenance"]["environment"]["cuda"] is None
    assert store.load("s", ORACLE).provenance["environment"]["float32_matmul_precision"] == "highest"
    with pytest.raises(GoldenRefused, match="float32_matmul_precision='high': lets torch run float32 matmuls in TF32"):
        GoldenStore(tmp_path / "tf32").update(with_env(TRACE, **{**NUMERICS, "float32_matmul_precision": "high"}), ORACLE)
    edited = json.loads(store.path("s", ORACLE).read_text())
    edited["provenance"]["environment"]["float32_matmul_precision"] = "high"
    with pytest.raises(provenance.RecordError, match="float32_matmul_precision"):
        provenance.check_provenance(T(edited), ORACLE, load_pins())


def test_a_golden_written_before_the_precision_was_recorded_still_holds_byte_for_byte(tmp_path):
    """On the machine that wrote it, the run now records three keys more; only those are set
    aside, and any other difference still fails the byte rule."""
    store = GoldenStore(tmp_path)
    store.write(store.update(TRACE, ORACLE))  # a golden of before: no precision, batch mode, CUDA
    now = with_env(TRACE, **NUMERICS)
    kept = store.update(now, ORACLE)
    assert kept.action == KEEP and kept.check.rule == "bytes"
    moved = store.update(with_env(now, torch="0.0"), ORACLE)
    assert moved.action == REWRITE and moved.check.rule == "bytes"
    assert provenance.as_written(now, TRACE) == TRACE and provenance.as_written(now, now) is now
