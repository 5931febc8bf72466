"""Engine faults and bad input, one test per case, with real processes (the TEST DOUBLE engines
in tests/doubles/) driven through the `parity` command line where one is involved.

Every case must end in a named verdict or a clear error (exit status 2), never in a traceback,
a hang, a stray process, a green run, or a golden file touched.

Tests that once were xfail(strict=True) pinned bugs found in files this suite did not own; each
names the file and the fix. tests/formats/test_fuzz_readers.py tolerates exactly these (KNOWN_BUGS there).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import cli
from conformance.formats import protocol
from conformance.formats.pins import load_pins
from conformance.formats.scenario import ScenarioError, load_scenario
from conformance.formats.trace import load_trace
from conformance.judging.verdict import (CANDIDATE, DIVERGED, FAILURE_KINDS, KINDS, NUMERICS, ORACLE, PASS,
                                         ROLES, STAND_IN, Verdict, exit_status, judge)
from conformance.process.client import EngineFailure, EngineProcess
from conformance.process.session import EngineSession
from conformance.report.render_text import render, render_summary
from tests.helpers import (GATE, REPO, alive, assert_ended, bounded, double_command, double_spec,
                           read_pids)

# the double lays these over a complete config record of its own (tests/doubles/double_engine.py)
RECORD = {"max_num_scheduled_tokens": 4036, "max_num_batched_tokens": 4096,
          "budget_log_lines": ["max_num_scheduled_tokens is set to 4036 based on the speculative decoding settings."]}
GOLDENS = REPO / "goldens"
ORACLE_PIN = load_pins().oracle


@pytest.fixture
def record_file(tmp_path):
    path = tmp_path / "record.json"
    path.write_text(json.dumps(RECORD))
    return str(path)


@pytest.fixture
def goldens_untouched():
    """The test may not write, regenerate or delete a committed golden. (Per test, not per
    module: a module-wide snapshot would race with anyone regenerating goldens meanwhile.)"""
    def snapshot():
        return {str(p.relative_to(GOLDENS)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(GOLDENS.rglob("*")) if p.is_file()}
    before = snapshot()
    yield
    assert snapshot() == before, "a golden file was written, changed or removed"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = cli.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def good_trace(tmp_path, record_file, capsys, scenario: Path = GATE) -> Path:
    path = tmp_path / f"good-{scenario.stem}.json"
    status, _, err = run_cli(capsys, "run", "--engine", double_command("--record", record_file),
                             "--scenario", str(scenario), "--out", str(path), "--layers", "config")
    assert status == 0, err
    return path


# ---------------------------------------------------------------------------------------------
# engine faults, through `parity run` (+ `parity compare`)
# ---------------------------------------------------------------------------------------------

def test_crash_mid_scenario_names_scenario_and_record_and_keeps_partial_trace(
        tmp_path, record_file, capsys):
    out = tmp_path / "crash.json"
    engine = double_command("--record", record_file, "--steps", "5", "--fault", "crash", "--crash-after", "3")
    status, _, err = run_cli(capsys, "run", "--engine", engine, "--scenario", str(GATE),
                             "--out", str(out), "--layers", "config,steps")
    assert status == 2
    assert f"partial trace kept in {out}" in err
    trace = load_trace(out)
    assert trace.failure.kind == "crash"
    # the records that arrived before the crash are kept, in order
    assert list(trace.layers) == ["config", "steps"] and len(trace.layers["config"]) == 1
    assert trace.layers["config"][0].items() >= RECORD.items()
    assert [record["step"] for record in trace.layers["steps"]] == [0, 1]
    message = trace.failure.message
    assert "exited (status 3)" in message and "scenario dflash_27b_gate" in message
    assert "after 3 records (last: steps #1, step 1)" in message, message

    golden = good_trace(tmp_path, record_file, capsys)
    status, report, _ = run_cli(capsys, "compare", "--trace", str(out), "--golden", str(golden))
    assert status == 2
    assert "on dflash_27b_gate" in report and ": CRASH" in report and "last: steps #1, step 1" in report
    assert "1 crash" in report


def test_crash_before_any_record_says_so(tmp_path, record_file, capsys):
    out = tmp_path / "crash0.json"
    status, _, _ = run_cli(capsys, "run", "--engine", double_command("--fault", "crash", "--crash-after", "0"),
                           "--scenario", str(GATE), "--out", str(out), "--layers", "config")
    assert status == 2
    trace = load_trace(out)
    assert trace.failure.kind == "crash" and trace.layers == {"config": []}
    assert "before any record" in trace.failure.message


def test_hang_is_ended_by_the_run_timeout_from_the_environment(tmp_path, monkeypatch, capsys):
    """VLLM_PARITY_RUN_TIMEOUT is read when the engine starts, not when the module is imported;
    the hung engine and the child it forked are both ended (no orphan)."""
    monkeypatch.setenv("VLLM_PARITY_RUN_TIMEOUT", "1")
    pidfile, out = tmp_path / "pids", tmp_path / "hang.json"
    engine = double_command("--fault", "fork-hang", "--pidfile", str(pidfile))
    (status, _), took = bounded(
        lambda: (cli.main(["run", "--engine", engine, "--scenario", str(GATE), "--out", str(out),
                           "--layers", "config"]), None),
        30, lambda: read_pids(pidfile) if pidfile.exists() else [])
    assert status == 2 and took < 15
    trace = load_trace(out)
    assert trace.failure.kind == "timeout"
    assert "scenario dflash_27b_gate" in trace.failure.message
    assert "ended" in trace.failure.message
    assert_ended(read_pids(pidfile))


def failed_run(tmp_path, fault: str, timeout: float = 60) -> EngineFailure:
    """One run of the gate's config on the TEST DOUBLE with `fault`, bounded: the EngineFailure it
    ended in, once every process of it is gone."""
    pidfile = tmp_path / "pids"
    proc = EngineProcess(double_spec("--fault", fault, "--pidfile", str(pidfile)))
    proc.start()
    with pytest.raises(EngineFailure) as failure:
        bounded(lambda: proc.run(load_scenario(GATE), ["config"], timeout=timeout), 30, lambda: read_pids(pidfile))
    assert_ended(read_pids(pidfile))
    return failure.value


def test_hang_is_ended_by_the_timeout_argument(tmp_path):
    failure = failed_run(tmp_path, "fork-hang", timeout=0.5)
    assert failure.kind == "timeout"


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf"])
def test_bad_timeout_setting_is_bad_input(tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv("VLLM_PARITY_RUN_TIMEOUT", value)
    status, _, err = run_cli(capsys, "run", "--engine", double_command(), "--scenario", str(GATE),
                             "--out", str(tmp_path / "t.json"), "--layers", "config")
    assert status == 2
    assert "VLLM_PARITY_RUN_TIMEOUT" in err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("fault, words", [
    ("garbage", ["expected a JSON object on one line", "Segmentation fault?"]),
    ("wrong-version", ["expected protocol version 3, got 99"]),
    ("out-of-order", ["records out of order in layer 'config'", "expected seq 0, got 1"]),
    ("bad-count", ["done says 5 records, 1 arrived"]),
    ("wrong-id", ["expected messages for 'run-1', got id 'someone-else'"]),
])
def test_protocol_violation_is_a_named_verdict(tmp_path, record_file, capsys, fault, words):
    out = tmp_path / f"{fault}.json"
    status, _, err = run_cli(capsys, "run", "--engine", double_command("--record", record_file, "--fault", fault),
                             "--scenario", str(GATE), "--out", str(out), "--layers", "config")
    assert status == 2
    trace = load_trace(out)
    assert trace.failure.kind == "protocol"
    for w in words:
        assert w in trace.failure.message, trace.failure.message
    golden = good_trace(tmp_path, record_file, capsys)
    status, report, _ = run_cli(capsys, "compare", "--trace", str(out), "--golden", str(golden))
    assert status == 2 and ": PROTOCOL" in report


def test_engine_error_is_a_named_verdict(tmp_path, record_file, capsys):
    out = tmp_path / "error.json"
    status, _, _ = run_cli(capsys, "run", "--engine", double_command("--fault", "error"), "--scenario", str(GATE),
                           "--out", str(out), "--layers", "config")
    assert status == 2
    trace = load_trace(out)
    assert trace.failure.kind == "engine_error"
    assert "internal: the double was told to fail" in trace.failure.message


def test_closing_stdout_without_exiting_is_a_crash_not_a_hang(tmp_path):
    failure = failed_run(tmp_path, "close-stdout")
    assert failure.kind == "crash" and "closed its stdout" in str(failure)


def test_crash_while_a_child_holds_stdout_is_a_crash_and_the_child_is_ended(tmp_path):
    failure = failed_run(tmp_path, "crash-with-child")
    assert failure.kind == "crash" and "exited (status 3)" in str(failure)
    assert "child" in str(failure)


def test_crash_leaves_no_orphan_child(tmp_path):
    failure = failed_run(tmp_path, "crash-orphan")
    assert failure.kind == "crash"


def test_endless_records_are_ended_by_the_timeout(tmp_path, monkeypatch):
    """A stream of valid records that never ends must not outlive the run's deadline. The run's
    limits are raised far past what a second carries, so that the deadline ends it, not a limit:
    the harness reads about 90,000 of these records a second, and 61,000 of them fill the default
    32 MiB."""
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_RECORDS", str(100 * protocol.MAX_RUN_RECORDS))
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_BYTES", str(100 * protocol.MAX_RUN_BYTES))
    proc = EngineProcess(double_spec("--fault", "flood"))
    proc.start()
    pid = proc._proc.pid
    with pytest.raises(EngineFailure) as err:
        bounded(lambda: proc.run(load_scenario(GATE), ["config"], timeout=1), 30, lambda: [pid])
    assert err.value.kind == "timeout"
    assert len(err.value.partial["config"]) > 0  # what arrived is kept
    assert_ended([pid])


def test_engine_that_never_reads_stdin_is_ended_by_the_timeout(tmp_path):
    """A `run` larger than the pipe's buffer must not block the harness forever."""
    data = json.loads(GATE.read_text())
    data["workload"] = {"seed": 0, "vocab_size": 1000, "max_steps": 10, "requests": [
        {"id": f"r{i}", "arrival_step": 0, "prompt_len": 1, "max_tokens": 1, "acceptance": [1] * 100}
        for i in range(1000)]}
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    big = tmp_path / "big.json"
    big.write_text(json.dumps(data))
    scenario = load_scenario(big)
    assert len(json.dumps(scenario.to_wire())) > 256 * 1024  # several times a pipe's buffer
    proc = EngineProcess(double_spec("--fault", "no-read"))
    proc.start()
    pid = proc._proc.pid
    with pytest.raises(EngineFailure) as err:
        bounded(lambda: proc.run(scenario, ["config"], timeout=1), 30, lambda: [pid])
    assert err.value.kind == "timeout"
    assert_ended([pid])


def test_interrupted_run_ends_the_engine(tmp_path, monkeypatch):
    """Ctrl-C (or any error) inside a run must not leave the engine's process group running:
    it is in its own session, so the terminal's SIGINT never reaches it."""
    pidfile = tmp_path / "pids"
    proc = EngineProcess(double_spec("--fault", "fork-hang", "--pidfile", str(pidfile)))
    proc.start()
    original = proc._lines.get

    def get(timeout=None):  # Ctrl-C arrives while the harness waits for the hung engine
        if pidfile.exists() and pidfile.read_text().endswith("\n"):
            raise KeyboardInterrupt
        return original(timeout=0.05)

    monkeypatch.setattr(proc._lines, "get", get)
    with pytest.raises(KeyboardInterrupt):
        bounded(lambda: proc.run(load_scenario(GATE), ["config"], timeout=20), 30, lambda: read_pids(pidfile))
    assert_ended(read_pids(pidfile))


def test_what_an_interrupt_ended_is_told_by_end_all_not_carried_by_the_exception(tmp_path, monkeypatch):
    """An engine ended while Ctrl-C unwound (a child of it that had left its process group
    killed by pid) is told by the next end_all, as parity's handler calls it; the exception
    carries no attribute of the harness."""
    from conformance.process.reaper import end_all, ended_words, resume
    pidfile = tmp_path / "pids"
    proc = EngineProcess(double_spec("--fault", "setsid-hang", "--pidfile", str(pidfile)))
    proc.start()
    original = proc._lines.get

    def get(timeout=None):  # Ctrl-C arrives once the engine's child has left its group
        if len(read_pids(pidfile)) > 1:
            raise KeyboardInterrupt
        return original(timeout=0.05)

    monkeypatch.setattr(proc._lines, "get", get)
    try:
        with pytest.raises(KeyboardInterrupt) as err:
            bounded(lambda: proc.run(load_scenario(GATE), ["config"], timeout=20), 30, lambda: read_pids(pidfile))
        told = end_all()
    finally:
        resume()
        for pid in read_pids(pidfile)[1:]:  # never leave the escaped child behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not [name for name in vars(err.value) if name.startswith("parity")], vars(err.value)
    assert told.killed == read_pids(pidfile)[1:2], ended_words(told)
    assert end_all().killed == []  # told once
    resume()


# ---------------------------------------------------------------------------------------------
# goldens: missing, truncated, not JSON, older schema -> clear error, exit 2, nothing rewritten
# ---------------------------------------------------------------------------------------------

def _golden_variants(good: str) -> dict[str, str | None]:
    older = json.loads(good)
    older["schema"] = "vllm-parity/trace/0"
    return {
        "missing": None,
        "truncated": good[: len(good) // 2],
        "empty": "",
        "not-json": "<html>502 Bad Gateway</html>\n",
        "older-schema": json.dumps(older),
        "a-list": "[]",
        "failed-run": json.dumps({**json.loads(good), "failure": {"kind": "crash", "message": "x"}}),
    }


@pytest.mark.parametrize("variant, kind, words", [
    ("missing", "MISSING_GOLDEN", "no golden at"),
    ("truncated", "INVALID_GOLDEN", "not valid JSON"),
    ("empty", "INVALID_GOLDEN", "not valid JSON"),
    ("not-json", "INVALID_GOLDEN", "not valid JSON"),
    ("older-schema", "INVALID_GOLDEN", "expected schema 'vllm-parity/trace/1', got 'vllm-parity/trace/0'"),
    ("a-list", "INVALID_GOLDEN", "expected schema"),
    ("failed-run", "INVALID_GOLDEN", "must come from a finished oracle run"),
])
def test_broken_golden_is_named_and_never_rewritten(tmp_path, record_file, capsys, variant, kind, words):
    trace = good_trace(tmp_path, record_file, capsys)
    folder = tmp_path / "goldens"
    folder.mkdir()
    golden = folder / "vllm-0.27.1.json"
    content = _golden_variants(trace.read_text())[variant]
    if content is not None:
        golden.write_text(content)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    status, report, err = run_cli(capsys, "compare", "--trace", str(trace), "--golden", str(golden))
    assert status == 2
    assert f": {kind}" in report and str(golden) in report and words in report, report
    assert "Traceback" not in report + err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # unchanged, nothing new


def test_missing_default_golden_is_not_created(tmp_path, record_file, capsys, goldens_untouched):
    """Without --golden, compare looks in goldens/<scenario>/; a missing one stays missing."""
    data = json.loads(GATE.read_text())
    data["name"] = "fault_probe_without_golden"
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    scenario = tmp_path / "probe.json"
    scenario.write_text(json.dumps(data))
    trace = good_trace(tmp_path, record_file, capsys, scenario)
    status, report, _ = run_cli(capsys, "compare", "--trace", str(trace))
    assert status == 2 and ": MISSING_GOLDEN" in report
    assert str(GOLDENS / "fault_probe_without_golden" / f"vllm-{ORACLE_PIN}.json") in report
    assert not (GOLDENS / "fault_probe_without_golden").exists()


def test_failed_run_compared_with_the_committed_golden_leaves_it_untouched(
        tmp_path, record_file, capsys, goldens_untouched):
    out = tmp_path / "crash.json"
    run_cli(capsys, "run", "--engine", double_command("--record", record_file, "--fault", "crash"),
            "--scenario", str(GATE), "--out", str(out), "--layers", "config")
    status, report, _ = run_cli(capsys, "compare", "--trace", str(out))
    # the one record the double sent before crashing is not the oracle's: reported first
    assert status == 2 and f"on dflash_27b_gate vs oracle vllm-{ORACLE_PIN} golden: DIVERGED" in report
    assert "then the engine failed (crash)" in report and "layer config: first divergence" in report


def test_unreadable_trace_is_bad_input(tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text('{"schema": "vllm-parity/trace/1", "engine": ')
    status, _, err = run_cli(capsys, "compare", "--trace", str(bad))
    assert status == 2 and str(bad) in err and "not valid JSON" in err


# Bugs in conformance/formats/trace.py (load_trace checks the top-level keys only) and
# conformance/report/render_text.py: a golden or trace that is valid JSON of the right schema but lacks
# or mistypes a field the comparison reads ends in a traceback instead of INVALID_GOLDEN / exit 2.

def _mangled(tmp_path, record_file, capsys, mutate_golden=None, mutate_trace=None) -> tuple[Path, Path]:
    trace = good_trace(tmp_path, record_file, capsys)
    golden = tmp_path / "golden.json"
    g, t = json.loads(trace.read_text()), json.loads(trace.read_text())
    (mutate_golden or (lambda d: None))(g)
    (mutate_trace or (lambda d: None))(t)
    golden.write_text(json.dumps(g))
    trace.write_text(json.dumps(t))
    return trace, golden


def test_golden_without_scenario_sha256_is_invalid_golden(tmp_path, record_file, capsys):
    trace, golden = _mangled(tmp_path, record_file, capsys, lambda g: g["scenario"].pop("sha256"))
    status, report, _ = run_cli(capsys, "compare", "--trace", str(trace), "--golden", str(golden))
    assert status == 2 and ": INVALID_GOLDEN" in report


def test_trace_without_scenario_name_is_a_clear_error(tmp_path, record_file, capsys):
    trace, _ = _mangled(tmp_path, record_file, capsys, mutate_trace=lambda edited: edited["scenario"].pop("name"))
    status, _, err = run_cli(capsys, "compare", "--trace", str(trace))
    assert status == 2 and str(trace) in err


def test_golden_with_mistyped_budget_log_lines_is_invalid_golden(tmp_path, record_file, capsys):
    def mangle(g):
        g["layers"]["config"][0]["budget_log_lines"] = 5
        g["layers"]["config"][0]["max_num_scheduled_tokens"] = 4096
    trace, golden = _mangled(tmp_path, record_file, capsys, mangle)
    status, report, _ = run_cli(capsys, "compare", "--trace", str(trace), "--golden", str(golden))
    assert status == 2 and ": INVALID_GOLDEN" in report


def test_deeply_nested_golden_is_invalid_golden(tmp_path, record_file, capsys):
    trace = good_trace(tmp_path, record_file, capsys)
    golden = tmp_path / "golden.json"
    golden.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    status, report, _ = run_cli(capsys, "compare", "--trace", str(trace), "--golden", str(golden))
    assert status == 2 and ": INVALID_GOLDEN" in report


# ---------------------------------------------------------------------------------------------
# a report over several scenarios where one engine crashed never reads green
# ---------------------------------------------------------------------------------------------

def _scenarios(tmp_path, names):
    shutil.copytree(GATE.parent / "models", tmp_path / "models", dirs_exist_ok=True)
    out = []
    for name in names:
        data = json.loads(GATE.read_text())
        data["name"] = name
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        out.append(load_scenario(path))
    return out


def test_report_counts_each_kind_and_a_crash_is_never_green(tmp_path, record_file):
    scenarios = _scenarios(tmp_path, ["alpha", "beta", "gamma"])
    def run(spec):
        with EngineSession(spec) as session:
            return [session.trace(s, ["config"]) for s in scenarios], session.cold_starts

    goldens = {t.scenario_name: t for t in run(double_spec("--record", record_file))[0]}
    # the oracle reproduces its goldens; the candidate crashes on the second scenario only
    oracle, _ = run(double_spec("--record", record_file))
    candidate, starts = run(double_spec("--record", record_file, "--fault", "crash", "--after-runs", "1"))
    assert starts == 2  # restarted after the crash: one bad scenario hides no other
    verdicts = [judge(t, goldens[t.scenario_name], ORACLE) for t in oracle]
    verdicts += [judge(t, goldens[t.scenario_name], CANDIDATE) for t in candidate]
    assert [v.kind for v in verdicts] == ["pass"] * 4 + ["crash", "pass"]
    assert verdicts[4].scenario == "beta" and "scenario beta" in verdicts[4].message

    summary = render_summary(verdicts)
    assert summary == "-- 6 verdicts: 5 pass, 1 crash; gating: 5 pass, 1 crash"
    assert exit_status(verdicts) == 2
    report = render(verdicts, "0.27.1")
    assert "== double [candidate] on beta vs oracle vllm-0.27.1 golden: CRASH" in report

    # mixed failures: each kind its own count; the worst gating kind sets the status
    more = verdicts + [Verdict("x", "delta", "timeout", CANDIDATE), Verdict("x", "delta", DIVERGED, CANDIDATE),
                       Verdict("y", "delta", "protocol", STAND_IN)]
    assert render_summary(more) == ("-- 9 verdicts: 5 pass, 1 diverged, 1 crash, 1 timeout, 1 protocol; "
                                    "gating: 5 pass, 1 diverged, 1 crash, 1 timeout")
    assert exit_status(more) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(ROLES)), max_size=8))
def test_exit_status_is_green_only_when_every_gating_verdict_passes(pairs):
    verdicts = [Verdict("e", f"s{i}", kind, role) for i, (kind, role) in enumerate(pairs)]
    gating = [v.kind for v in verdicts if v.role != STAND_IN]
    status = exit_status(verdicts)
    # a candidate within numerics passes; the oracle must reproduce its golden exactly
    assert (status == 0) == all(k == PASS or (k == NUMERICS and v.role == CANDIDATE)
                                for k, v in ((v.kind, v) for v in verdicts if v.role != STAND_IN))
    assert (status == 2) == any(k in FAILURE_KINDS for k in gating)
    counts = render_summary(verdicts).split("; gating:")[0]
    for kind in KINDS:
        n = sum(1 for k, _ in pairs if k == kind)
        assert (f" {n} {kind}" in counts) == (n > 0), (kind, n, counts)


# ---------------------------------------------------------------------------------------------
# bad scenario input: bugs in conformance/formats/scenario.py, formats/workload.py, formats/method_matrix.py
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def scenario_dir(tmp_path):
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    return tmp_path


def _write(folder: Path, mutate, base: Path = GATE, text: str | None = None) -> Path:
    path = folder / "scenario.json"
    if text is None:
        data = json.loads(base.read_text())
        mutate(data)
        text = json.dumps(data)
    path.write_text(text)
    return path


def _refused(path: Path, field: str | None = None) -> ScenarioError:
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(path) in str(err.value)
    if field is not None:
        assert err.value.field == field
    return err.value


def test_deeply_nested_scenario_is_a_scenario_error(scenario_dir):
    _refused(_write(scenario_dir, None, text='{"workload":' * 100_000 + "1" + "}" * 100_000))


def test_deeply_nested_model_config_is_a_scenario_error(scenario_dir):
    (scenario_dir / "models" / "qwen3-27b" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    _refused(_write(scenario_dir, lambda d: None), "engine_args.model")


def test_overlong_model_path_is_a_scenario_error(scenario_dir):
    _refused(_write(scenario_dir, lambda d: d["engine_args"].update(model="x" * 5000)), "engine_args.model")


def test_nul_in_model_path_is_a_scenario_error(scenario_dir):
    path = _write(scenario_dir, lambda d: d["engine_args"]["speculative_config"].update(
        model="models/dflash-27b-draft\x00"))
    try:
        load_scenario(path)
    except ScenarioError as err:
        assert err.field == "engine_args.speculative_config.model"
        return
    except ValueError as err:
        assert "embedded null byte" in str(err)  # the bug, exactly
        raise
    pytest.fail("accepted a model path with a NUL byte")


def test_lone_surrogate_in_model_path_is_a_scenario_error(scenario_dir):
    path = scenario_dir / "scenario.json"
    path.write_text(GATE.read_text().replace('"models/dflash-27b-draft"', '"models/\\ud800"'))
    assert "\\ud800" in path.read_text()
    _refused(path, "engine_args.speculative_config.model")


def test_name_with_trailing_newline_is_refused(scenario_dir):
    _refused(_write(scenario_dir, lambda d: d.update(name="dflash_27b_gate\n")), "name")


def test_request_id_with_trailing_newline_is_refused(scenario_dir):
    def mutate(d):
        d["workload"]["requests"][0]["id"] = "r0\n"
    _refused(_write(scenario_dir, mutate, REPO / "scenarios" / "steady_decode.json"),
             "workload.requests[0].id")


def test_matrix_row_name_with_trailing_newline_is_refused(scenario_dir):
    def mutate(d):
        d["method_matrix"]["rows"][0]["name"] = "eagle3\n"
    _refused(_write(scenario_dir, mutate, REPO / "scenarios" / "method_matrix.json"),
             "method_matrix.rows[0].name")


def test_engine_matrix_row_with_trailing_newline_is_refused(scenario_dir):
    _refused(_write(scenario_dir, lambda d: d.update(rows=["ENG-SCHED-CORE\n"])), "rows")


# The optional integers are range-checked too (scenarios/README.md: an absurd size is an error naming the field).
@pytest.mark.parametrize("field, mutate", [
    ("engine_args.long_prefill_token_threshold", lambda d: d["engine_args"].update(long_prefill_token_threshold=-5)),
    ("engine_args.seed", lambda d: d["engine_args"].update(seed=10**30)),
    ("engine_args.seed", lambda d: d["engine_args"].update(seed=-1)),
    ("engine_args.speculative_config.prompt_lookup_max",
     lambda d: d["engine_args"]["speculative_config"].update(prompt_lookup_max=-3)),
    ("engine_args.speculative_config.prompt_lookup_min",
     lambda d: d["engine_args"]["speculative_config"].update(prompt_lookup_min=0)),
])
def test_optional_engine_args_numbers_are_range_checked(scenario_dir, field, mutate):
    _refused(_write(scenario_dir, mutate), field)


# ---------------------------------------------------------------------------------------------
# static: no unsafe deserialisation, code evaluation or shell anywhere in the repository
# ---------------------------------------------------------------------------------------------

UNSAFE = re.compile(r"pickle\.load|(?<![\w.])eval\(|(?<![\w.])exec\(|shell\s*=\s*True|os\.system\(")


def _python_files() -> list[Path]:
    files = [p for d in ("conformance", "engines", "tests") for p in (REPO / d).rglob("*.py")]
    files += list(REPO.glob("*.py"))
    return sorted(p for p in files if ".venv" not in p.parts and p.resolve() != Path(__file__).resolve())


def test_no_pickle_eval_exec_or_shell_in_the_repository():
    files = _python_files()
    assert any(p.name == "client.py" for p in files) and any(p.name == "worker.py" for p in files)
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
            for p in files for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if UNSAFE.search(line)]
    assert not hits, "unsafe calls found:\n" + "\n".join(hits)


@pytest.mark.parametrize("line, bad", [
    ("data = pickle.load(f)", True), ("pickle.loads(b)", True), ("x = eval(text)", True),
    ("exec(code)", True), ("subprocess.run(cmd, shell=True)", True), ("os.system('ls')", True),
    ("ast.literal_eval(s)", False), ("model.eval()", False), ("os.execvp(a, b)", False),
    ("asyncio.create_subprocess_exec(x)", False), ("shell=False", False),
])
def test_the_unsafe_call_scan_is_not_vacuous(line, bad):
    assert bool(UNSAFE.search(line)) == bad
