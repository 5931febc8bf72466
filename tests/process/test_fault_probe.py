"""The fault probe's defects (issue 21), one test each, with real processes: the TEST DOUBLE
engines in tests/doubles/, driven through the `parity` command line where one is involved.

No timing assertions: a wait is bounded only so that a regression into a hang fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.process.client import EngineFailure, EngineProcess
from conformance.process.launch import EngineSpec
from tests.helpers import (GATE, REPO, alive, assert_ended, bounded, double_command, double_gate_engines, double_spec,
                           gate_driver, read_pids, run_gate)


# ---------------------------------------------------------------------------------------------
# 2. a child that leaves the engine's process group (setsid) is ended by pid, and said so
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fault, kind", [("setsid-hang", "timeout"), ("setsid-crash", "crash")])
def test_a_child_that_left_the_process_group_is_ended_by_pid_and_named(tmp_path, fault, kind):
    pidfile = tmp_path / "pids"
    proc = EngineProcess(double_spec("--fault", fault, "--pidfile", str(pidfile)))
    proc.start()
    try:
        with pytest.raises(EngineFailure) as err:
            bounded(lambda: proc.run(load_scenario(GATE), ["config"], timeout=2), 60,
                    lambda: read_pids(pidfile))
        pids = read_pids(pidfile)
        assert_ended(pids)
    finally:
        for pid in read_pids(pidfile)[1:]:  # never leave the escaped child behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert err.value.kind == kind
    assert (f"the engine and its children were ended (1 of them by pid, {pids[1]}: it had left "
            "the engine's process group)") in str(err.value), str(err.value)


# ---------------------------------------------------------------------------------------------
# 1, 2. Ctrl-C and SIGTERM stop a gate running engines side by side: every engine ended, none
# restarted, a message and status 128 + the signal, no traceback
# ---------------------------------------------------------------------------------------------

def start_gate(tmp_path, jobs: int, faults=("fork-hang", "no-read")) -> tuple[subprocess.Popen, list[Path], Path]:
    """`parity gate` in a process of its own, its two engines hanging TEST DOUBLEs (in place of
    the oracle's and a candidate's worker: the stop does not depend on which engine hangs), each
    hanging on its first unit of two scenarios; their pid files."""
    pidfiles = [tmp_path / f"pids-{i}" for i in range(2)]
    starts = tmp_path / "starts"
    oracle, candidate = [double_command("--fault", fault, "--pidfile", str(pidfile), "--startfile", str(starts))
                         for fault, pidfile in zip(faults, pidfiles)]
    argv = gate_driver(oracle, "TEST-DOUBLE-candidate=" + candidate, "gate", "--scenario", str(GATE),
                       "--scenario", str(REPO / "scenarios" / "steady_decode.json"), "--layers", "config",
                       "--waivers", "/dev/null", "--jobs", str(jobs), "--reports", str(tmp_path / "reports"))
    gate = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return gate, pidfiles, starts


def written(folder: Path) -> list[str]:
    """The reports in a folder (a gate claims its folder, so it exists from the start)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.05)


def started(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize("jobs, sig", [(2, signal.SIGINT), (2, signal.SIGTERM), (1, signal.SIGINT)])
def test_a_signal_stops_the_gate_ends_every_engine_and_restarts_none(tmp_path, jobs, sig):
    gate, pidfiles, starts = start_gate(tmp_path, jobs, ("fork-hang", "fork-hang") if jobs == 1
                                        else ("fork-hang", "no-read"))
    try:
        # every engine side by side is hanging in its first unit (with --jobs 1, the first)
        wait_for(lambda: len(started(starts)) == jobs and (jobs == 1 or pidfiles[0].exists()), 120,
                 "the engines to start")
        if jobs == 1:
            wait_for(lambda: pidfiles[0].exists(), 60, "the first engine to hang")
        engines = started(starts)
        hung = [pid for f in pidfiles if f.exists() for pid in read_pids(f)]
        gate.send_signal(sig)
        try:
            out, err = gate.communicate(timeout=60)  # bounded: not a timing assertion
        except subprocess.TimeoutExpired:
            pytest.fail("the gate did not stop within 60 s of the signal")
    finally:
        if gate.poll() is None:
            gate.kill()
        for pid in started(starts) + [p for f in pidfiles if f.exists() for p in read_pids(f)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert gate.returncode == 128 + sig, err
    assert "Traceback" not in err, err
    words = "interrupted (Ctrl-C)" if sig == signal.SIGINT else "stopped by SIGTERM"
    assert f"parity gate: {words}: every engine process and its children were ended; no verdict" in err, err
    assert started(starts) == engines  # no engine was started again after the signal
    assert_ended(engines + hung)
    assert out == "" and not written(tmp_path / "reports")  # no verdict, no report


# ---------------------------------------------------------------------------------------------
# 3. a 1,000-digit integer in a record is a protocol error, and every report is still written
# ---------------------------------------------------------------------------------------------

REPORTS = ("junit.xml", "summary.md", "report.html", "annotation.md")


def test_a_huge_integer_in_a_record_is_a_protocol_error_and_the_reports_are_written(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    record = tmp_path / "record.json"
    record.write_text('{"max_num_scheduled_tokens": ' + "9" * 1000 + "}")
    status, text = run_gate(double_gate_engines("--record", str(record)), tmp_path / "reports")
    assert status == 2
    assert "TEST-DOUBLE-candidate" in text and "PROTOCOL" in text.upper()
    assert "out of the 64-bit range" in text and "(1000 digits)" in text
    for name in REPORTS:
        assert (tmp_path / "reports" / name).is_file(), name


# ---------------------------------------------------------------------------------------------
# 4. the engine's stderr in a failure's message is bounded, in lines and in bytes, and says so
# ---------------------------------------------------------------------------------------------

def test_a_huge_stderr_line_is_cut_in_the_message_and_the_reports(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    huge = 20 * 1024 * 1024
    engines = double_gate_engines("--stderr-line", str(huge), "--fault", "crash", "--crash-after", "0")
    status, text = run_gate(engines, tmp_path / "reports")
    assert status == 2 and "exited (status 3)" in text
    assert "characters cut ...]" in text and "x" * 300 in text and "x" * 1000 not in text
    for name in REPORTS:
        size = (tmp_path / "reports" / name).stat().st_size
        assert size < 200_000, (name, size)  # each holds the message: bounded, not 20 MiB


# ---------------------------------------------------------------------------------------------
# 5. `parity merge` refuses a trace changed after its shard wrote it; 9. and names the engine
# two shards disagree on
# ---------------------------------------------------------------------------------------------

def two_shards(tmp_path, engines) -> list[Path]:
    folders = [tmp_path / f"s{i}" for i in (1, 2)]
    for i, folder in enumerate(folders, 1):
        status, _ = run_gate(engines, None, shard=(i, 2), results=folder)
        assert (folder / "manifest.json").is_file()
    return folders


def test_merge_refuses_a_trace_rewritten_after_its_shard_wrote_it(tmp_path, capsys, monkeypatch):
    from conformance import cli
    from conformance.judging import goldens

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    record = tmp_path / "record.json"
    record.write_text('{"max_num_scheduled_tokens": 4096}')  # the golden says 4036: a divergence
    folders = two_shards(tmp_path, double_gate_engines("--record", str(record)))
    assert cli.main(["merge", *map(str, folders), "--waivers", "/dev/null"]) == 1  # untouched: FAIL
    capsys.readouterr()
    # rewrite the candidate's trace with the golden's records: it would now pass
    manifest = json.loads((folders[1] / "manifest.json").read_text())
    entry = next(u for u in manifest["units"] if u["engine"] == "TEST-DOUBLE-candidate")
    path = folders[1] / entry["trace"]
    edited = json.loads(path.read_text())
    golden = goldens.GOLDENS.load("dflash_27b_gate", "0.27.1")
    edited["layers"]["config"] = golden.layers["config"]
    path.write_text(json.dumps(edited))
    status = cli.main(["merge", *map(str, folders), "--waivers", "/dev/null", "--reports", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and not written(tmp_path / "r")
    assert f"parity merge: error: {path}: changed after its shard wrote it" in err, err


def test_merge_names_the_engine_two_shards_disagree_on(tmp_path, monkeypatch):
    from conformance.formats.pins import load_pins
    from conformance.gate import run as gate_run
    from conformance.gate.context import RunContext
    from conformance.gate.shards import ShardError

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    folders = two_shards(tmp_path, double_gate_engines("--steps", "1"))
    manifest = json.loads((folders[1] / "manifest.json").read_text())
    manifest["engines"][1]["command"] += " --extra"
    (folders[1] / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError) as err:
        gate_run.merge(RunContext(load_pins(), log=lambda m: None), folders)
    assert "they differ in engines (TEST-DOUBLE-candidate: command " in str(err.value), str(err.value)
    assert "--steps 1\" vs " in str(err.value) and "--steps 1 --extra\"" in str(err.value)


# ---------------------------------------------------------------------------------------------
# 7. a --reports path or $GITHUB_STEP_SUMMARY that cannot be written is bad input, found before
# any engine runs; 8. a second gate given the folder another gate is writing to is refused
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def gate_cli(tmp_path, monkeypatch, capsys):
    """`parity gate` in this process, its engines TEST DOUBLEs that log each start."""
    from conformance import cli
    from conformance.gate import plan as gate_plan

    starts = tmp_path / "starts"
    engines = double_gate_engines("--steps", "1", "--startfile", str(starts))
    monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: engines)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main(["gate", "--scenario", str(GATE), "--layers", "config", "--waivers", "/dev/null",
                           "--jobs", "1", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    run.starts = starts
    return run


def test_a_reports_path_that_is_a_file_is_bad_input(tmp_path, gate_cli):
    path = tmp_path / "reports"
    path.write_text("not a folder")
    status, out, err = gate_cli("--reports", str(path))
    assert status == 2 and out == "" and "Traceback" not in err
    assert f"parity gate: error: --reports {path}: is a file, not a folder" in err
    assert not gate_cli.starts.exists()  # said before any engine started


def test_a_step_summary_in_a_missing_folder_is_bad_input(tmp_path, gate_cli, monkeypatch):
    summary = tmp_path / "missing" / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    status, out, err = gate_cli("--reports", str(tmp_path / "reports"))
    assert status == 2 and out == "" and "Traceback" not in err
    assert f"$GITHUB_STEP_SUMMARY={summary}: its folder {summary.parent} does not exist" in err
    assert not gate_cli.starts.exists()


def test_a_second_gate_on_a_reports_folder_in_use_is_refused(tmp_path, gate_cli):
    from conformance.report.report_files import claimed

    folder = tmp_path / "reports"
    with claimed(folder):  # a gate that is running and will write its reports here
        status, out, err = gate_cli("--reports", str(folder))
        assert status == 2 and out == ""
        assert (f"parity gate: error: --reports {folder}: another gate (pid {os.getpid()}) is writing "
                "its reports there; give each gate its own folder") in err
        assert not gate_cli.starts.exists()
    status, out, err = gate_cli("--reports", str(folder))  # free again: written whole
    assert status == 1 and out.startswith("== vllm-parity gate: FAIL"), err
    assert written(folder) == sorted(REPORTS)
    assert not [p for p in folder.iterdir() if p.name.endswith(".part")]


# ---------------------------------------------------------------------------------------------
# 6. corrupt real weights are an engine error of the real oracle, not a refused configuration
# ---------------------------------------------------------------------------------------------

@pytest.mark.oracle
def test_corrupt_real_weights_are_an_engine_error_not_a_refusal(warm_sessions, tmp_path):
    """A model folder without weights.json holds real weights; here its model.safetensors is
    random bytes (a TEST corrupt checkpoint, 1 MiB) beside the tiny Qwen3's config."""
    import random

    folder = tmp_path / "models" / "corrupt-qwen3"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((REPO / "scenarios" / "models" / "tiny-qwen3" / "config.json").read_text())
    (folder / "model.safetensors").write_bytes(random.Random(21).randbytes(1 << 20))
    raw = json.loads((REPO / "scenarios" / "engine_ngram.json").read_text())
    raw["name"], raw["engine_args"]["model"] = "engine_corrupt_weights", "models/corrupt-qwen3"
    path = tmp_path / "engine_corrupt_weights.json"
    path.write_text(json.dumps(raw))
    scenario = load_scenario(path)
    failure = warm_sessions(load_pins().oracle).trace(scenario).failure
    assert failure.kind == "engine_error", failure
    assert "SafetensorError" in failure.message and "internal" in failure.message


# ---------------------------------------------------------------------------------------------
# 9. the smaller ones
# ---------------------------------------------------------------------------------------------

def test_an_environment_build_waiting_for_another_says_so(tmp_path, monkeypatch):
    import fcntl
    import threading

    from conformance.formats import settings
    from conformance.process import envs

    monkeypatch.setenv("VLLM_PARITY_CACHE", str(tmp_path))
    pins = load_pins()
    final = envs.env_dir(pins.oracle, settings.device_mode(), pins)
    final.parent.mkdir(parents=True)
    said, waiting = [], threading.Event()

    def log(message):
        said.append(message)
        if "waiting for another build" in message:
            waiting.set()

    with open(final.parent / f"{final.name}.lock", "w") as lock:  # another build holds the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = {}
        thread = threading.Thread(target=lambda: result.update(python=envs.ensure_env(pins.oracle, log, pins)),
                                  daemon=True)
        thread.start()
        assert waiting.wait(60), said
        (final / "READY").parent.mkdir(parents=True)
        (final / "READY").touch()  # ... and finishes
    thread.join(60)
    assert result["python"] == envs.env_python(final)
    assert said[0] == (f"[envs] vllm {pins.oracle} ({settings.device_mode()}): waiting for another build of it "
                       f"to finish (lock {final.parent / (final.name + '.lock')}) ...")
    assert "done in" in said[-1] and not any("building" in line for line in said)


def test_more_shards_than_units_is_refused_at_once(tmp_path, capsys, gate_cli):
    (status, out, err), _ = bounded(lambda: gate_cli("--shard", "1/1000000", "--results", str(tmp_path / "s")), 60)
    assert status == 2 and out == ""
    assert "--shard 1/1000000: this gate has 2 units of work, so at most 2 shards" in err, err
    assert not gate_cli.starts.exists()


@pytest.mark.oracle
def test_a_wrong_sha256_in_weights_json_is_a_clear_error_of_the_real_oracle(warm_sessions, tmp_path):
    folder = tmp_path / "models" / "tiny-qwen3"
    folder.mkdir(parents=True)
    source = REPO / "scenarios" / "models" / "tiny-qwen3"
    (folder / "config.json").write_text((source / "config.json").read_text())
    weights = json.loads((source / "weights.json").read_text())
    weights["sha256"] = "0" * 64
    (folder / "weights.json").write_text(json.dumps(weights))
    raw = json.loads((REPO / "scenarios" / "engine_ngram.json").read_text())
    raw["name"] = "engine_wrong_weights_sha"
    path = tmp_path / "engine_wrong_weights_sha.json"
    path.write_text(json.dumps(raw))
    scenario = load_scenario(path)
    failure = warm_sessions(load_pins().oracle).trace(scenario).failure
    message = failure.message
    assert failure.kind == "engine_error" and "engine reported bad_request" in message, message
    assert "engine_args.model" in message and "weights.json" in message
    assert "model.safetensors sha256 mismatch: expected 0000000000000000" in message
    assert "internal" not in message and "Traceback" not in message


def test_an_engine_that_failed_at_once_is_not_said_to_be_still_running(tmp_path):
    """Two engines side by side share one progress: the one that failed is not repeated."""
    import threading

    from conformance.process.progress import EngineProgress, Progress
    from conformance.process.session import EngineSession

    said, ended, beat = [], [], threading.Event()

    def log(message):
        said.append(message)
        if ended and "still running" in message:
            beat.set()

    crashing = EngineSpec("crashing", (sys.executable, "-c", "import sys; sys.exit(3)"))  # before its hello
    with Progress(10.0, log, heartbeat=0.05) as progress:
        other = EngineProgress(progress, "gate", "other", [(GATE.stem, ["config"], 1.0)], 1.0)
        other.starting()  # still starting while the other engine fails
        session = EngineSession(crashing, progress=EngineProgress(progress, "gate", "crashing",
                                                                  [(GATE.stem, ["config"], 1.0)], 1.0))
        assert session.trace(load_scenario(GATE), ["config"]).failure.kind == "crash"
        ended.append(len(said))
        assert beat.wait(60), said
        other.end()
    assert any(line.startswith("[gate] crashing: starting the engine [") for line in said[:ended[0]])
    repeated = [line for line in said[ended[0]:] if "still running" in line]
    assert repeated and all(line.startswith("[gate] other: starting the engine: still running")
                            for line in repeated), repeated
