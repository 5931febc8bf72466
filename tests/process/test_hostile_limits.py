"""What a hostile engine or a hostile input cannot do to the harness: input files are regular
files under their size limits, output folders are checked and locked before any engine starts, a
results folder's manifest edited by hand is refused naming the field, what a killed writer left
is cleared, what an engine sends is bounded, text is UTF-8 whatever the locale, and engines never
outlive the harness. The engines are the TEST DOUBLEs of tests/doubles/."""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (GATE, REPO, alive, double_command, gate_driver, gate_engine, hostile_double, read_pids,
                           still_running)

LIMITS_STEADY = REPO / "scenarios" / "steady_decode.json"


def limits_parity(*argv: str, timeout: float = 120, env: dict | None = None,
                  memory: int | None = None) -> subprocess.CompletedProcess:
    """`parity ARGV` in a process of its own, bounded: a harness that hangs (a FIFO) or eats
    memory (/dev/zero, capped at `memory` bytes of address space) fails the test, never the
    machine. Its status, stdout and stderr."""
    def cap():  # the child only, before it runs the harness
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    try:
        return subprocess.run([sys.executable, "-m", "conformance.cli", *argv], cwd=REPO,
                                     capture_output=True, text=True, timeout=timeout, preexec_fn=cap,
                                     env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"parity {' '.join(argv)}: still running after {timeout} s (the harness hung)")


def limits_shard_folder(tmp_path: Path, name: str = "results") -> Path:
    """A real results folder: shard 1/1 of a gate of two TEST DOUBLE engines on one scenario."""
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.gate import run as gate_run
    from conformance.gate.context import RunContext
    from conformance.judging.verdict import CANDIDATE, ORACLE

    oracle, candidate = double_command("--steps", "3"), double_command()
    engines = [gate_engine("TEST-DOUBLE-oracle=" + oracle, ORACLE),
               gate_engine("double-candidate=" + candidate, CANDIDATE)]
    folder = tmp_path / name
    context = RunContext(load_pins(), log=lambda m: None, out=lambda m: None, shard=(1, 1), results=folder,
                         layers=["config"])
    assert gate_run.gate(context, [load_scenario(GATE)], engines) == 0
    return folder


# -- input paths: regular files only, each kind under its size limit, one reader for all --------

def test_limits_the_reader_refuses_what_is_not_a_regular_file_and_what_is_too_large(tmp_path):
    from conformance.formats.files import LIMITS, InputFileError, read_bytes, read_text

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="expected a regular scenario file, got a FIFO"):
        read_bytes(fifo, "scenario")  # returns at once: nobody writes the FIFO
    with pytest.raises(InputFileError, match="got a character device"):
        read_bytes(Path("/dev/zero"), "trace")
    with pytest.raises(InputFileError, match="got a folder"):
        read_bytes(tmp_path, "manifest")
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(LIMITS["waivers"] + 1)  # sparse: no disk
    with pytest.raises(InputFileError, match=f"is {LIMITS['waivers'] + 1} bytes, above the limit"):
        read_bytes(big, "waivers")
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(InputFileError, match="expected UTF-8 text in the scenario file, got byte 0xe9"):
        read_text(latin, "scenario")
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "absent", "scenario")
    link = tmp_path / "link.json"
    link.symlink_to(GATE)  # a link to a regular file is read
    assert read_bytes(link, "scenario") == GATE.read_bytes()


def _limits_special(tmp_path: Path, how: str, name: str) -> Path:
    path = tmp_path / name
    if how == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize("how", ["fifo", "zero"])
@pytest.mark.parametrize("what", ["scenario", "waivers", "manifest", "trace", "golden", "results trace", "replay"])
def test_limits_a_fifo_or_dev_zero_as_any_input_is_refused_at_once(tmp_path, what, how):
    """Before: a FIFO hung the harness, /dev/zero ran it out of memory (here: a MemoryError
    traceback under the address-space cap)."""
    words = "a FIFO" if how == "fifo" else "a character device"
    if what == "scenario":
        argv = ["run", "--engine", double_command(), "--scenario", str(_limits_special(tmp_path, how, "s.json")),
                "--out", str(tmp_path / "t.json")]
    elif what == "waivers":
        argv = ["gate", "--scenario", str(GATE), "--layers", "config",
                "--waivers", str(_limits_special(tmp_path, how, "w.toml"))]
    elif what == "replay":
        argv = ["fuzz", "--candidate", double_command(), "--replay", str(_limits_special(tmp_path, how, "f.json")),
                "--out", str(tmp_path / "findings")]  # not the default folder another test may hold
    elif what in ("trace", "golden"):
        good = tmp_path / "good.json"
        made = limits_parity("run", "--engine", double_command(), "--scenario", str(GATE), "--out", str(good),
                             "--layers", "config")
        assert made.returncode == 0, made.stderr
        special = str(_limits_special(tmp_path, how, f"{what}.json"))
        argv = ["compare", "--trace", special] if what == "trace" else \
            ["compare", "--trace", str(good), "--golden", special]
    else:
        folder = limits_shard_folder(tmp_path)
        if what == "manifest":
            (folder / "manifest.json").unlink()
            _limits_special(folder, how, "manifest.json")
        else:
            trace = next((folder / "traces").glob("*.json"))
            trace.unlink()
            _limits_special(trace.parent, how, trace.name)
        argv = ["merge", str(folder)]
    done = limits_parity(*argv, timeout=60, memory=2 * 1024 ** 3)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"got {words}" in done.stdout + done.stderr, (done.stdout + done.stderr)[-2000:]


# -- output paths: checked, and their folders locked, before any engine starts ------------------

@pytest.fixture
def limits_gate(tmp_path, monkeypatch, capsys):
    """`parity gate` in this process, its engines two TEST DOUBLEs that note each start in
    `limits_gate.starts`; (status, stdout, stderr)."""
    from conformance import cli
    from conformance.gate import plan as gate_plan

    starts = tmp_path / "starts"
    oracle, candidate = (double_command("--steps", "3", "--startfile", str(starts)),
                         double_command("--startfile", str(starts)))
    monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: [
        gate_engine(oracle, "oracle"),
        gate_engine("TEST-DOUBLE-candidate=" + candidate, "candidate")])

    def gate(*argv: str, candidate: str | None = None) -> tuple[int, str, str]:
        """`candidate`: another command line for the candidate (a hostile double, say)."""
        if candidate is not None:
            monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: [
                gate_engine(oracle, "oracle"),
                gate_engine("TEST-DOUBLE-candidate=" + candidate, "candidate")])
        capsys.readouterr()
        status = cli.main(["gate", "--scenario", str(GATE), "--layers", "config", "--waivers", "/dev/null",
                           *argv])
        out = capsys.readouterr()
        return status, out.out, out.err

    gate.starts = starts
    return gate


def test_limits_results_pointing_at_a_file_is_refused_before_any_engine_starts(tmp_path, limits_gate):
    """Before: a traceback after every engine had run."""
    path = tmp_path / "results"
    path.write_text("a file\n", encoding="utf-8")
    for argv in (["--results", str(path)], ["--shard", "1/1", "--results", str(path)],
                 ["--results", str(path / "below")]):
        status, out, err = limits_gate(*argv)
        assert status == 2 and "Traceback" not in err, err
        assert "parity gate: error: --results" in err and (
            "is a file, not a folder" in err or "cannot write there" in err), err
        assert not limits_gate.starts.exists()  # said before any engine started


def test_limits_two_shards_sharing_a_results_folder_are_refused(tmp_path, limits_gate):
    from conformance.formats.files import claim_folder

    folder = tmp_path / "results"
    with claim_folder(folder, "--results", "results"):  # a shard that is running and writes there
        status, out, err = limits_gate("--shard", "1/1", "--results", str(folder))
        assert status == 2
        assert (f"parity gate: error: --results {folder}: another gate (pid {os.getpid()}) is "
                "writing its results there; give each gate its own folder") in err
        assert not limits_gate.starts.exists()
    status, out, err = limits_gate("--shard", "1/1", "--results", str(folder))  # free again
    assert status == 0 and (folder / "manifest.json").exists(), err


def test_limits_one_folder_may_hold_a_gates_reports_and_its_results(tmp_path, limits_gate):
    folder = tmp_path / "out"
    status, out, err = limits_gate("--results", str(folder), "--reports", str(folder))
    assert status in (0, 1, 2) and "another gate" not in err, err
    assert (folder / "manifest.json").exists() and (folder / "junit.xml").exists()


def test_limits_run_out_is_checked_before_the_engine_starts(tmp_path, capsys):
    from conformance import cli

    starts = tmp_path / "starts"
    a_file = tmp_path / "file"
    a_file.write_text("x\n", encoding="utf-8")
    for out, words in ((tmp_path, "is a folder; give the path of a file"),
                       (a_file / "t.json", "is a file, not a folder")):
        status = cli.main(["run", "--engine", double_command("--startfile", str(starts)), "--scenario",
                           str(GATE), "--out", str(out), "--layers", "config"])
        err = capsys.readouterr().err
        assert status == 2 and f"parity run: error: --out {out}" in err and words in err, err
        assert not starts.exists()


def test_limits_fuzz_out_is_checked_and_locked_before_any_engine_starts(tmp_path, capsys):
    from conformance import cli
    from conformance.formats.files import claim_folder

    starts = tmp_path / "starts"
    a_file = tmp_path / "file"
    a_file.write_text("x\n", encoding="utf-8")
    argv = ["fuzz", "--candidate", double_command("--startfile", str(starts)), "--examples", "1"]
    assert cli.main([*argv, "--out", str(a_file)]) == 2
    assert f"parity fuzz: error: --out {a_file}: expected a folder findings can be written to" in \
        capsys.readouterr().err
    folder = tmp_path / "findings"
    with claim_folder(folder, "--out", "findings"):  # another search writing its findings there
        assert cli.main([*argv, "--out", str(folder)]) == 2
    assert (f"--out {folder}: another fuzz search (pid {os.getpid()}) is writing its findings "
            "there") in capsys.readouterr().err
    assert not starts.exists()


# -- a results folder's manifest edited by hand: the field named, never a traceback -------------

@pytest.fixture(scope="module")
def limits_results(tmp_path_factory):
    return limits_shard_folder(tmp_path_factory.mktemp("limits-results"))


@pytest.mark.parametrize("field, value, words", [
    (("count",), 0, "field 'count': expected an integer of at least 1, got 0"),
    (("index",), 2, "field 'index': expected a shard number from 1 to count (1), got 2"),
    (("scenarios",), None, "field 'scenarios': expected a list, got null"),
    (("scenarios", 0), {}, "field 'scenarios[0].name' is missing"),
    (("scenarios", 0, "layers"), ["config", 3], "field 'scenarios[0].layers[1]': expected one of config"),
    (("engines", 0, "engine"), [], "field 'engines[0].engine': expected a string, got []"),
    (("engines", 0, "command"), 0, "field 'engines[0].command': expected a string, got 0"),
    (("engines", 0, "role"), "judge", "field 'engines[0].role': expected one of oracle, candidate, stand-in"),
    (("units", 0, "key"), "x", "field 'units[0].key': expected 'TEST-DOUBLE-oracle / dflash_27b_gate / config'"),
    (("units", 0, "group"), "everything", "field 'units[0].group': expected one of config, steps"),
    (("units", 0, "trace"), "../../etc/passwd", "field 'units[0].trace': expected a path inside the folder"),
    (("layers",), "config", "field 'layers': expected a list, got \"config\""),
    (("tool",), "1.0", "field 'tool': expected an object, got \"1.0\""),
])
def test_limits_a_manifest_edited_by_hand_is_refused_naming_the_field(tmp_path, limits_results, capsys,
                                                                       field, value, words):
    """Before: KeyError, TypeError or AssertionError tracebacks, and `count: 0` accepted."""
    from conformance import cli

    folder = tmp_path / "edited"
    shutil.copytree(limits_results, folder)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    target = manifest
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert cli.main(["merge", str(folder), "--waivers", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert f"parity merge: error: {folder / 'manifest.json'}: {words}" in err, err


# -- what a writer killed with kill -9 left in a results or findings folder ---------------------

def limits_dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_limits_a_killed_writers_temporary_files_are_removed_by_the_next_run(tmp_path):
    from conformance.formats.files import claim_folder

    folder = limits_shard_folder(tmp_path)
    dead = limits_dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = [folder / f".manifest.json.{dead}.tmp", folder / "traces" / f".0001-x.json.{dead}.tmp"]
        running = folder / f".verdicts.json.{sleeper.pid}.tmp"  # a writer that still runs
        for path in left + [running]:
            path.write_text("{half a file", encoding="utf-8")
        limits_shard_folder(tmp_path)  # the same shard again, in the same folder
        assert [p for p in left if p.exists()] == [] and running.exists()
        assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
            "manifest.json", "traces", "verdicts.json"]
        findings = tmp_path / "findings"
        findings.mkdir()
        scenario = findings / f".fuzz_steps.json.{dead}.tmp"
        scenario.write_text("{half", encoding="utf-8")
        with claim_folder(findings, "--out", "findings"):  # what `parity fuzz --out` does first
            assert not scenario.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_limits_a_shard_killed_while_writing_leaves_no_manifest_over_other_traces(tmp_path, monkeypatch):
    """The manifest is removed first and written last: a half-written folder is not a shard's."""
    from conformance import cli
    from conformance.gate import results

    folder = limits_shard_folder(tmp_path)
    calls = []

    def killed(trace):  # the writer dies while writing the first trace
        calls.append(trace)
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "dumps", killed)
    with pytest.raises(KeyboardInterrupt):
        limits_shard_folder(tmp_path)
    monkeypatch.undo()
    assert calls and not (folder / "manifest.json").exists()
    assert cli.main(["merge", str(folder), "--waivers", "/dev/null"]) == 2


def test_limits_a_golden_writer_removes_the_temporary_files_of_killed_writers_of_that_golden(tmp_path):
    """goldens/ holds no lock: only files whose writer no longer runs are removed, and only
    those of the golden being written (the goldens-check names any other)."""
    from conformance.judging.goldens import write_text_atomic

    folder = tmp_path / "goldens" / "steady_decode"
    folder.mkdir(parents=True)
    golden = folder / "vllm-0.27.1.json"
    dead = limits_dead_pid()
    left = folder / f".vllm-0.27.1.json.{dead}.k3x_9a.tmp"
    mine = folder / f".vllm-0.27.1.json.{os.getppid()}.k3x_9a.tmp"  # a writer that still runs
    other = folder / f".vllm-0.28.0.json.{dead}.k3x_9a.tmp"
    for path in (left, mine, other):
        path.write_text("{half", encoding="utf-8")
    assert write_text_atomic(golden, "{}\n")
    assert not left.exists() and mine.exists() and other.exists()
    assert golden.read_text(encoding="utf-8") == "{}\n"
    assert sorted(p.name for p in folder.iterdir()) == sorted([golden.name, mine.name, other.name])


# -- what an engine sends: a run's records, the hello's texts, an error's message, bounded ------

def limits_hostile(tmp_path: Path, plan: dict) -> tuple[str, ...]:
    """The hostile TEST DOUBLE's argv with `plan`, the next of the plans in tmp_path."""
    return tuple(shlex.split(hostile_double(tmp_path, str(len(list(tmp_path.glob("plan-*")))), plan)))


def limits_run(argv, scenario=GATE, layers=("config",), timeout: float = 30):
    """One run of `scenario` on the engine `argv`; the EngineFailure it ends in."""
    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    with EngineProcess(EngineSpec("hostile", tuple(argv))) as proc:
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(scenario), list(layers), timeout=timeout)
    return failure.value


def test_limits_a_run_sending_more_records_than_the_limit_is_a_protocol_error(monkeypatch):
    """Before: an endless stream of records ran until the run's timeout, every record kept."""
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_RECORDS", "1000")
    failure = limits_run(shlex.split(double_command("--fault", "flood")), timeout=20)
    assert failure.kind == "protocol", failure
    assert "more than 1000 records in one run, the limit" in str(failure)
    assert len(failure.partial["config"]) == 1001  # what arrived is kept, and no more


def test_limits_an_engine_that_broke_the_protocol_in_a_run_is_ended_without_shutdown(monkeypatch):
    """Before: the harness sent `shutdown` to an engine still flooding its run and waited out the
    10 s grace for an exit that could not come (an engine reads `shutdown` after its run)."""
    from conformance.process import client

    written: list[bytes] = []
    write = client._write_within
    monkeypatch.setattr(client, "_write_within", lambda proc, data, seconds: written.append(data) or
                        write(proc, data, seconds))
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_RECORDS", "10")
    failure = limits_run(shlex.split(double_command("--fault", "flood")), timeout=20)
    assert failure.kind == "protocol" and "more than 10 records" in str(failure), failure
    assert [json.loads(line)["type"] for line in written] == ["run"]  # and no shutdown


def test_limits_a_run_sending_more_bytes_than_the_limit_is_a_protocol_error_before_parsing(monkeypatch):
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_BYTES", "100000")
    failure = limits_run(shlex.split(double_command("--pad", "200000")))
    assert failure.kind == "protocol", failure
    assert "its records exceed 100000 bytes in one run, the limit" in str(failure)
    assert failure.partial == {"config": []}  # the line over the limit was never parsed


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1e6", "²"])
def test_limits_a_bad_run_limit_setting_is_bad_input(tmp_path, monkeypatch, capsys, value):
    from conformance import cli

    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_BYTES", value)
    starts = tmp_path / "starts"
    status = cli.main(["run", "--engine", double_command("--startfile", str(starts)), "--scenario",
                       str(GATE), "--out", str(tmp_path / "t.json"), "--layers", "config"])
    assert status == 2 and "VLLM_PARITY_MAX_RUN_BYTES" in capsys.readouterr().err
    assert not starts.exists()


@pytest.mark.parametrize("hello, words", [
    ({"engine": "E" * 1_000_000}, "expected hello.engine of at most 200 characters, got 1000000"),
    ({"version": "v" * 201}, "expected hello.version of at most 200 characters, got 201"),
    ({"capabilities": ["config"] * 33}, "expected hello.capabilities of at most 32 layer names, got 33"),
    ({"capabilities": ["config", "L" * 65]}, "expected layer names of at most 64 characters"),
    ({"environment": {"python": "3.11", "notes": "n" * 20_000}}, "expected hello.environment of at most 16384 bytes"),
])
def test_limits_a_hello_with_an_oversized_text_is_a_protocol_error(tmp_path, hello, words):
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    proc = EngineProcess(EngineSpec("hostile", limits_hostile(tmp_path, {"hello": hello})))
    with pytest.raises(EngineFailure) as failure:
        proc.start()
    assert failure.value.kind == "protocol" and words in str(failure.value), failure.value
    assert len(str(failure.value)) < 5000


def test_limits_a_megabyte_engine_name_leaves_small_reports(tmp_path, limits_gate):
    """Before: a 1 MB engine name made a 110 MB junit.xml."""
    name = "E" * 1_000_000
    candidate = shlex.join(limits_hostile(tmp_path, {"hello": {"engine": name}}))
    status, out, err = limits_gate("--reports", str(tmp_path / "reports"), candidate=candidate)
    assert status == 2, err
    for report in (tmp_path / "reports").iterdir():
        assert report.stat().st_size < 200_000, report
        assert name[:1000] not in report.read_text(encoding="utf-8", errors="replace")
    assert "hello.engine of at most 200 characters" in (tmp_path / "reports" / "junit.xml").read_text(encoding="utf-8")


def test_limits_an_engine_errors_message_is_cut(tmp_path):
    failure = limits_run(limits_hostile(tmp_path, {"error": {"message": "M" * 1_000_000}}))
    assert failure.kind == "engine_error" and "characters cut ...]" in str(failure)
    assert len(str(failure)) < 20_000


# -- an engine error's stderr tail: the failing run's lines only ---------------------------------

@pytest.mark.parametrize("fault, kind", [("error", "engine_error"), ("crash", "crash"), ("hang", "timeout")])
def test_limits_a_failures_stderr_tail_holds_only_the_failing_runs_lines(fault, kind):
    """Before: the tail showed the lines earlier runs of the same warm engine left (earlier
    examples of a fuzz search, earlier scenarios of a gate)."""
    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    argv = shlex.split(double_command("--stderr-each-run", "--fault", fault, "--after-runs", "2"))
    with EngineProcess(EngineSpec("double", tuple(argv))) as proc:
        for _ in range(2):
            proc.run(load_scenario(GATE), ["config"])
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(LIMITS_STEADY), ["config"], timeout=3)
    message = str(failure.value)
    assert failure.value.kind == kind, message
    assert "double: run 3 of steady_decode" in message
    assert "run 1 of" not in message and "run 2 of" not in message, message


# -- text is UTF-8 whatever the locale -----------------------------------------------------------

LIMITS_C_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
LIMITS_WORDS = "budget set to 4036 — Ünïcode 预算 ✓"


def test_limits_a_trace_with_non_ascii_text_is_written_compared_and_merged_under_the_c_locale(tmp_path):
    """The C locale with Python's UTF-8 mode off (PYTHONUTF8=0): the locale's encoding is ASCII.
    (Under LC_ALL=C alone, Python 3.11 turns its UTF-8 mode on by itself.) Before: `parity run`
    failed writing the trace, `parity merge` reading it."""
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.gate import run as gate_run
    from conformance.gate.context import RunContext
    from conformance.judging.verdict import CANDIDATE, ORACLE

    record = tmp_path / "record.json"
    record.write_text(json.dumps({"max_num_scheduled_tokens": 4036, "budget_log_lines": [LIMITS_WORDS]}),
                      encoding="utf-8")
    engine = double_command("--record", str(record))
    trace = tmp_path / "trace.json"
    done = limits_parity("run", "--engine", engine, "--scenario", str(GATE), "--out", str(trace),
                         "--layers", "config", env=LIMITS_C_LOCALE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert LIMITS_WORDS in trace.read_text(encoding="utf-8")
    done = limits_parity("compare", "--trace", str(trace), "--golden", str(trace), env=LIMITS_C_LOCALE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    engines = [gate_engine(engine, ORACLE),
               gate_engine("double-candidate=" + engine, CANDIDATE)]
    context = RunContext(load_pins(), log=lambda m: None, out=lambda m: None, shard=(1, 1),
                         results=tmp_path / "results", layers=["config"])
    assert gate_run.gate(context, [load_scenario(GATE)], engines) == 0
    done = limits_parity("merge", str(tmp_path / "results"), "--waivers", "/dev/null",
                         "--reports", str(tmp_path / "reports"), env=LIMITS_C_LOCALE)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr  # the golden says otherwise
    assert LIMITS_WORDS in (tmp_path / "reports" / "junit.xml").read_text(encoding="utf-8")
    assert "\\u2014 \\xdcn\\xefcode" in done.stdout  # the terminal's ASCII: escaped, not a crash


# -- engines never outlive the harness -----------------------------------------------------------

def limits_parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def limits_kill(pids: list[int]) -> None:
    import signal

    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_limits_a_setsid_child_without_the_mark_is_ended_by_pid_and_named(tmp_path):
    """Before: a child that left the process group and cleared its environment escaped, while
    the message said "the engine and its children were ended"."""
    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    pidfile = tmp_path / "pids"
    argv = shlex.split(double_command("--fault", "setsid-bare-crash", "--pidfile", str(pidfile)))
    try:
        with EngineProcess(EngineSpec("double", tuple(argv))) as proc:
            with pytest.raises(EngineFailure) as failure:
                proc.run(load_scenario(GATE), ["config"], timeout=30)
        engine, child = read_pids(pidfile, 60)
        assert still_running([engine, child], 30) == []
        assert failure.value.kind == "crash"
        assert (f"the engine and its children were ended (1 of them by pid, {child}: it had left the "
                "engine's process group)") in str(failure.value), failure.value
    finally:
        limits_kill(read_pids(pidfile, 60))


@pytest.mark.parametrize("how", ["run", "gate"])
def test_limits_kill_9_of_the_harness_leaves_no_engine_process(tmp_path, how):
    """Before: the hung engines survived, reparented to init, and so did their setsid children."""
    import signal

    pidfiles = [tmp_path / "pids-0", tmp_path / "pids-1"]
    engines = [double_command("--fault", fault, "--pidfile", str(pidfile))
               for fault, pidfile in zip(("fork-hang", "setsid-bare-hang"), pidfiles)]
    if how == "run":
        pidfiles = pidfiles[1:]
        argv = [sys.executable, "-m", "conformance.cli", "run", "--engine", engines[1], "--scenario",
                str(GATE), "--out", str(tmp_path / "t.json"), "--layers", "config"]
    else:
        argv = gate_driver(engines[0], "TEST-DOUBLE-candidate=" + engines[1], "gate",
                           "--scenario", str(GATE), "--layers", "config", "--waivers", "/dev/null", "--jobs", "2")
    harness = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        pids = [pid for pidfile in pidfiles for pid in read_pids(pidfile, 60)]  # every engine hangs in its run
        pids += [limits_parent(p) for p in pids[::2]]  # what started each engine
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        assert still_running(pids, 30) == [], "engine processes outlived the harness"
    finally:
        if harness.poll() is None:
            harness.kill()
        limits_kill(pids)


def test_limits_the_ending_message_names_what_was_killed_not_found_and_left():
    from conformance.process.reaper import Ended, ended_words

    assert ended_words(Ended()) == "the engine and its children were ended"
    assert ended_words(Ended([11, 12], [13], [14], 1), "every engine process and its children") == (
        "every engine process and its children were ended (2 of them by pid, 11, 12: they had left the "
        "engine's process group); not found, already gone: pid 13; could not end pid 14, still running; "
        "an engine's keeper was gone before it said what it ended, so a child that left its process group "
        "and cleared its environment could not be looked for")
    assert Ended([1], [2]) + Ended([3], [], [4]) == Ended([1, 3], [2], [4])


def test_limits_an_engine_whose_keeper_is_killed_dies_with_it_and_its_marked_child_is_ended(tmp_path):
    """The second line of defence: the engine's parent-death signal (SIGKILL when its keeper
    dies), and the mark in its children's environment, found by the harness."""
    import signal
    import threading

    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    pidfile = tmp_path / "pids"
    argv = shlex.split(double_command("--fault", "setsid-hang", "--pidfile", str(pidfile)))
    proc = EngineProcess(EngineSpec("double", tuple(argv)))
    proc.start()
    keeper = proc._proc.pid
    killer = threading.Thread(target=lambda: (read_pids(pidfile, 60), os.kill(keeper, signal.SIGKILL)))
    killer.start()
    try:
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(GATE), ["config"], timeout=60)
        killer.join()
        engine, child = read_pids(pidfile, 60)
        assert still_running([engine, child], 30) == []
        assert failure.value.kind == "crash", failure.value
        message = str(failure.value)
        assert f"(1 of them by pid, {child}: it had left the engine's process group)" in message, message
        assert "keeper was gone before it said what it ended" in message
    finally:
        killer.join()
        limits_kill(read_pids(pidfile, 60))


def test_limits_parity_run_writes_its_trace_whole_and_clears_what_a_killed_run_left(tmp_path, capsys):
    from conformance import cli

    out = tmp_path / "t.json"
    left = tmp_path / f".t.json.{limits_dead_pid()}.tmp"
    left.write_text("{half", encoding="utf-8")
    assert cli.main(["run", "--engine", double_command(), "--scenario", str(GATE), "--out", str(out),
                     "--layers", "config"]) == 0
    assert not left.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    assert json.loads(out.read_text(encoding="utf-8"))["layers"]["config"]


def test_limits_an_engine_killed_by_a_signal_is_reported_with_that_signal(tmp_path):
    """The keeper ends as its engine did: the harness reads the engine's own status."""
    import signal
    import threading

    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    pidfile = tmp_path / "pids"
    argv = shlex.split(double_command("--fault", "fork-hang", "--pidfile", str(pidfile)))
    proc = EngineProcess(EngineSpec("double", tuple(argv)))
    proc.start()
    killer = threading.Thread(target=lambda: os.kill(read_pids(pidfile, 60)[0], signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(GATE), ["config"], timeout=60)
        killer.join()
        assert failure.value.kind == "crash" and "exited (status -9)" in str(failure.value), failure.value
        assert still_running(read_pids(pidfile, 60), 30) == []  # its child, left in the group, ended too
    finally:
        killer.join()
        limits_kill(read_pids(pidfile, 60))
