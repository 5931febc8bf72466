"""`parity fuzz` (conformance/fuzz/search.py, fuzz/campaign.py, fuzz/command.py, fuzz/strategies.py).

The search, its shrinking and its determinism are tested first against a TEST DOUBLE pair of
engines (pure Python, milliseconds per example) whose candidate has a planted admission bug;
then for real: the gate oracle's warm worker against built-in TEST DEVICE mutants that show in
the stand-in layers, with a short example budget. Each finding must shrink to at most 3
requests, be confirmed on its written scenario file, and replay to the same divergence.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from conformance.cli import build_parser, main
from conformance.formats.pins import REPO_ROOT, load_pins
from conformance.formats.scenario import load_scenario, parse_scenario
from conformance.formats.trace import make_trace
from conformance.formats.workload import validate_workload
from conformance.fuzz import campaign as fuzz_cli
from conformance.fuzz.search import (ENGINE_LAYERS, SCENARIO_DIR, STAND_IN_LAYERS, Finding, Pair, Search,
                                     signature)
from conformance.fuzz.strategies import engine_scenarios, scenarios
from conformance.judging.requirement_rows import where_of
from conformance.judging.verdict import CANDIDATE, Verdict, judge
from conformance.report.render_text import render_verdict
from tests.fuzz.double_pair import DoublePair
from tests.helpers import trace_of

QUIET = lambda message: None  # noqa: E731


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(scenarios())
def test_generated_scenarios_satisfy_the_schema(raw):
    scenario = parse_scenario(raw, SCENARIO_DIR / "fuzz.json")  # raises ScenarioError if not
    assert scenario.layers[:3] == list(STAND_IN_LAYERS)
    for req in scenario.workload["requests"]:
        assert req["prompt_len"] + req["max_tokens"] <= raw["engine_args"]["max_model_len"]


def test_generated_scenarios_share_prefixes_continue_turns_and_abort_only_where_allowed():
    """Shared prefixes, continued turns, aborts and priorities (under the priority policy) are
    drawn now and then, every one valid (the whole prompt and max_tokens within max_model_len, a
    continued request never aborted), and never for a candidate that does not declare the feature."""
    from conformance.formats.features import FEATURES
    from conformance.formats.workload import prompt_lengths

    seen = {"prefix": 0, "continues": 0, "abort_step": 0, "priority": 0}

    @settings(max_examples=300, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(scenarios())
    def every(raw):
        scenario = parse_scenario(raw, SCENARIO_DIR / "fuzz.json")
        mml = raw["engine_args"]["max_model_len"]
        lengths = prompt_lengths(scenario.workload, mml)
        continued = {r["continues"] for r in scenario.workload["requests"] if "continues" in r}
        for req in scenario.workload["requests"]:
            assert lengths[req["id"]] + req["max_tokens"] <= mml
            assert not (req["id"] in continued and "abort_step" in req)
            assert "priority" not in req or raw["engine_args"].get("scheduling_policy") == "priority"
            for key in seen:
                seen[key] += key in req

    every()
    assert all(n > 0 for n in seen.values()), seen

    allowed = tuple(f for f in FEATURES if f not in ("shared_prefixes", "aborts", "request_priorities"))

    @settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(scenarios(allowed=allowed))
    def none(raw):
        assert not raw["workload"].get("prefixes")
        assert not any(k in r for r in raw["workload"]["requests"]
                       for k in ("prefix", "continues", "abort_step", "priority"))

    none()


def test_generated_scenarios_stop_load_remote_kv_and_mix_attention_only_where_allowed():
    """vLLM's other stops (eos, min_tokens, repetition detection), a KV connector with requests
    whose prompts the remote store holds, and a model mixing sliding-window and full attention
    are drawn now and then, every scenario valid (the connector and the hybrid model without a
    drafter), and never for a candidate that does not declare the feature."""
    from conformance.formats.features import FEATURES, needed
    from conformance.fuzz.strategies import HYBRID

    seen = dict.fromkeys(("eos", "min_tokens", "repetition_detection", "kv_connector", "sliding_window"), 0)
    seen["external"] = seen["connector_async"] = 0

    @settings(max_examples=300, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(scenarios())
    def every(raw):
        scenario = parse_scenario(raw, SCENARIO_DIR / "fuzz.json")
        args = raw["engine_args"]
        if "kv_transfer_config" in args:
            assert "speculative_config" not in args
            seen["connector_async"] += args["async_scheduling"] is not False
        if args["model"] == HYBRID:
            assert "speculative_config" not in args and "kv_transfer_config" not in args
        for name in needed(scenario.engine_args, scenario.workload, None):
            seen[name] = seen.get(name, 0) + 1
        seen["external"] += any("external" in r for r in scenario.workload["requests"])

    every()
    assert all(seen[key] > 0 for key in ("eos", "min_tokens", "repetition_detection", "kv_connector",
                                          "sliding_window", "external", "connector_async")), seen

    new = ("eos", "min_tokens", "repetition_detection", "kv_connector", "sliding_window")
    allowed = tuple(f for f in FEATURES if f not in new)

    @settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(scenarios(allowed=allowed))
    def none(raw):
        assert "kv_transfer_config" not in raw["engine_args"] and raw["engine_args"]["model"] != HYBRID
        assert not any(k in r for r in raw["workload"]["requests"]
                       for k in ("eos_token_id", "min_tokens", "repetition_detection", "external"))

    none()


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(engine_scenarios())
def test_generated_engine_scenarios_run_the_whole_engine_on_the_tiny_models(raw):
    scenario = parse_scenario(raw, SCENARIO_DIR / "fuzz.json")
    assert scenario.layers == ["config", *ENGINE_LAYERS]
    spec = raw["engine_args"].get("speculative_config") or {}
    for model in (raw["engine_args"]["model"], spec.get("model")):
        assert model is None or (SCENARIO_DIR / model / "weights.json").is_file()  # tiny weights
    assert len(raw["workload"]["requests"]) <= 3


def test_same_seed_same_examples():
    runs = []
    for seed in (5, 5, 6):
        pair = DoublePair(bug=False)
        Search(pair, seed, QUIET, examples=30).run()
        runs.append(pair.seen)
    assert len(runs[0]) == 30
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_a_planted_bug_is_found_shrunk_written_and_confirmed(tmp_path):
    pair = DoublePair()
    search = Search(pair, 1, QUIET, examples=300)
    [finding] = search.run()
    assert finding.signature == "diverged steps.new"
    raw = finding.raw
    # the minimal scenario: two requests at step 0 and one sequence, every optional argument left out
    assert raw["engine_args"]["max_num_seqs"] == 1
    assert [r["arrival_step"] for r in raw["workload"]["requests"]] == [0, 0]
    assert not {"long_prefill_token_threshold", "num_gpu_blocks_override", "scheduling_policy",
                "max_num_scheduled_tokens", "speculative_config"} & set(raw["engine_args"])
    fuzz_cli.confirm(pair, finding, tmp_path, 1, "double", "0.27.1", QUIET)
    assert finding.confirmed
    assert finding.path == tmp_path / "fuzz_steps_new.json"
    written = load_scenario(finding.path)  # a scenario file of the project's schema
    assert written.name == "fuzz_steps_new" and len(written.workload["requests"]) == 2
    validate_workload(written.workload, "x", written.engine_args)
    text = fuzz_cli.report(finding, "0.27.1", 1, "double", "0.27.1")
    assert "layer steps: first divergence at step 0, field new" in text
    assert f"parity fuzz --replay {finding.path}" in text


def test_the_library_advice_is_a_command_that_writes_that_scenario_s_golden():
    """The report's last line says how to add the finding to the library: a command that
    parses and names that scenario only (`make goldens -k NAME` did not: make swallows -k,
    regenerates every golden, then fails)."""
    raw = json.loads((SCENARIO_DIR / "steady_decode.json").read_text(encoding="utf-8"))
    finding = Finding("diverged steps.new", raw, 1, 1, path=Path("out/fuzz/fuzz_steps_new.json"), confirmed=True)
    text = fuzz_cli.report(finding, "0.27.1", 1, "double", "0.27.1")
    [line] = [line for line in text.splitlines() if "library:" in line]
    argv = shlex.split(line.split(", then ", 1)[1])
    assert argv[:2] == ["make", "goldens"], line
    # what make runs for it: parity goldens, on that scenario only
    ran = subprocess.run(["make", "-n", "-o", "envs", *argv[1:]], cwd=REPO_ROOT, capture_output=True,
                         text=True, encoding="utf-8").stdout
    command = next(x for x in ran.splitlines() if x.startswith(".venv/bin/parity goldens"))
    args = build_parser().parse_args(shlex.split(command.split(";")[0])[1:])
    assert args.command == "goldens" and args.scenario == [Path("scenarios/fuzz_steps_new.json")], line


class SlowPair:
    """TEST DOUBLE of conformance.fuzz.search.Pair on a clock of its own: each run takes 10 s, or is
    cut by the time limit it is given (OutOfTime, as the real Pair does). Every example with
    at least three requests fails alike (the candidate's config says one more max_num_seqs),
    so polishing keeps edit after edit until three requests remain."""

    layers = ["config", "steps"]
    RUN = 10.0

    def __init__(self):
        self.now, self.limits = 0.0, []

    def clock(self) -> float:
        return self.now

    def judge(self, scenario, timeout=None):
        self.limits.append(timeout)
        if timeout is not None and timeout < self.RUN:
            from conformance.fuzz.search import OutOfTime

            self.now += timeout
            raise OutOfTime("cut")
        self.now += self.RUN
        seqs = scenario.engine_args["max_num_seqs"]
        bug = len(scenario.workload["requests"]) >= 3
        hello = {"engine": "double", "version": "0", "protocol": 1}
        golden = make_trace("oracle", hello, scenario, {"config": [{"refused": None, "max_num_seqs": seqs}]})
        trace = make_trace("double", hello, scenario, {"config": [{"refused": None, "max_num_seqs": seqs + bug}]})
        return judge(trace, golden, CANDIDATE), golden


def test_polishing_keeps_its_time_limit_by_the_clock():
    """Every edit polishing tries keeps failing, and each run takes 10 s: polishing stops at
    POLISH_LIMIT (120 s), checked before each run and bounding the last one, not after 60 runs
    (600 s). Hypothesis' own shrinking is given no time here, so only polishing shrinks."""
    from conformance.fuzz.search import POLISH_LIMIT

    pair = SlowPair()
    said: list[str] = []
    search = Search(pair, 3, said.append, examples=200, clock=pair.clock, shrink_limit=0.0)
    [finding] = search.run()
    assert any(line.startswith("[fuzz] polishing stopped at its limit of ") for line in said), said
    assert finding.signature == "diverged config.max_num_seqs"
    found_at = finding.examples * SlowPair.RUN  # every run before polishing was an example
    polish = pair.now - found_at
    assert polish <= POLISH_LIMIT, f"polishing took {polish:.0f} s of the clock, limit {POLISH_LIMIT:.0f} s"
    assert polish >= POLISH_LIMIT - SlowPair.RUN  # it used its time: edits kept failing
    assert len(finding.raw["workload"]["requests"]) >= 3 and finding.shrunk


def test_signature_leaves_out_request_ids_and_positions():
    from conformance.judging.compare import FieldDiff, LayerComparison

    c = LayerComparison("steps", False, 3, [FieldDiff("requests.r12.tokens[4]", 1, 2)])
    v = Verdict("x", "s", "diverged", CANDIDATE, [c])
    assert where_of(v) == "steps.requests.r12.tokens[4]"
    assert signature(v) == "diverged steps.requests.*.tokens[*]"
    assert signature(Verdict("x", "s", "crash", CANDIDATE)) == "crash"
    assert signature(Verdict("x", "s", "pass", CANDIDATE)) is None
    assert fuzz_cli.scenario_name("diverged steps.requests.*.tokens[*]", Path("/nonexistent")) == \
        "fuzz_steps_requests_tokens"


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("1h", 3600), ("45", 45), ("168h", 604800)])
def test_budget(text, seconds):
    from conformance.gate.options import budget_seconds

    assert budget_seconds(text) == seconds


def exit_status(argv: list[str]) -> int:
    """`parity ARGV`'s exit status, argparse's own refusals (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("argv, error", [
    (["--budget", "soon"], "argument --budget: expected a duration more than 0 and at most 168h, like 90s, "
                           "10m or 1h, got 'soon'"),
    (["--budget", ""], "argument --budget: expected a duration more than 0 and at most 168h, like 90s, 10m "
                       "or 1h, got ''"),
    (["--budget", "0"], "argument --budget: expected a duration more than 0"),
    (["--budget", "169h"], "argument --budget: expected a duration more than 0 and at most 168h"),
    (["--budget", "9" * 400], "argument --budget: expected a duration"),
    (["--against", "0.27.1+mutant:ignore-max-num-seqs"], "--against"),
    (["--layers", "steps,engine_steps"], "not both at once"),
    (["--layers", "methods"], "--layers: the fuzzer runs some of the stand-in layers"),
    (["--budget", "1m", "--examples", "3"], "give one of them"),
    (["--findings", "0"], "argument --findings: expected a whole number from 1 to 100 (findings), got '0'"),
    (["--examples", "-1"], "argument --examples: expected a whole number from 1 to 10000000 (examples to run), "
                           "got '-1'"),
    (["--examples", "many"], "argument --examples: expected a whole number"),
])
def test_bad_input_is_refused_before_any_engine_starts(argv, error, capsys, tmp_path):
    # its own --out: the default folder may be held by a fuzz search another test worker runs
    assert exit_status(["fuzz", "--candidate", "/nonexistent/engine", "--out", str(tmp_path), *argv]) == 2
    assert error in capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["0", "-1", "65", "two", ""])
def test_gate_jobs_are_bounded(jobs, capsys):
    assert exit_status(["gate", "--jobs", jobs]) == 2
    assert f"argument --jobs: expected a whole number from 1 to 64 (engines side by side), got {jobs!r}" \
        in capsys.readouterr().err


@pytest.mark.parametrize("where", ["file", "file/below", "/proc/parity-fuzz"])
def test_an_out_folder_that_cannot_be_written_is_refused_before_the_search(where, tmp_path, capsys):
    """Checked before any engine starts: the candidate named here does not even exist (it would
    be refused next), and the search never begins."""
    (tmp_path / "file").write_text("not a folder\n", encoding="utf-8")
    out = where if where.startswith("/") else str(tmp_path / where)
    assert main(["fuzz", "--candidate", "/nonexistent/engine", "--examples", "3", "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"parity fuzz: error: --out {out}: expected a folder findings can be written to; " in err
    assert "/nonexistent/engine" not in err and "Traceback" not in err


def test_a_finding_that_cannot_be_written_is_printed_whole(tmp_path):
    """--out became unwritable during the search: the finding is printed on standard output,
    the scenario file it would have been, and the run is not a confirmed finding."""
    pair = DoublePair()
    [finding] = Search(pair, 1, QUIET, examples=300).run()
    (tmp_path / "out").write_text("a file where the folder was\n", encoding="utf-8")
    said, printed = [], []
    assert fuzz_cli.deliver(pair, [finding], tmp_path / "out", 1, "double", "0.27.1", "0.27.1",
                            said.append, printed.append) == 1
    assert not finding.confirmed and finding.path is None
    [text] = printed
    # a whole scenario file, its model paths relative to where it would have been written
    scenario = parse_scenario(json.loads(text), tmp_path / "out" / "fuzz_steps_new.json")
    assert scenario.name == "fuzz_steps_new" and len(scenario.workload["requests"]) == 2
    assert any(f"{tmp_path / 'out' / 'fuzz_steps_new.json'} could not be written" in line and
               "it follows on standard output" in line for line in said), said


class InterruptedPair(DoublePair):
    """TEST DOUBLE: DoublePair, with Ctrl-C arriving at its `at`-th run after the first
    failing example (while hypothesis shrinks)."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.after, self.failing = at, None, []

    def judge(self, scenario, timeout=None):
        if self.after is not None:
            self.after += 1
            if self.after == self.at:
                raise KeyboardInterrupt
        verdict, golden = super().judge(scenario)
        if signature(verdict):
            self.after = self.after or 0
            self.failing.append(size_of(scenario.workload))
        return verdict, golden


class FailingWhileShrinkingPair(DoublePair):
    """TEST DOUBLE: DoublePair whose oracle fails (no verdict) on every other run once an
    example has failed, while hypothesis shrinks, and on every example of two requests before."""

    def __init__(self):
        super().__init__()
        self.runs, self.found = 0, False

    def judge(self, scenario, timeout=None):
        self.runs += 1
        reqs = len(scenario.workload["requests"])
        if (self.found and self.runs % 2) or (not self.found and reqs == 2):
            why = "crashed while shrinking" if self.found else "crashed on two requests"
            return None, trace_of({"failure": {"kind": "internal", "message": f"x: engine reported {why}"}})
        verdict, golden = super().judge(scenario)
        self.found = self.found or signature(verdict) is not None
        return verdict, golden


def test_only_the_examples_the_search_ran_are_counted_skipped():
    """The final line per cause counts the examples the oracle could not run; the runs it could
    not make while shrinking are shrink runs, not skipped examples (before: a 'skipped 0' line
    per cause met only while shrinking)."""
    said: list[str] = []  # seed 2 meets examples of two requests before the first finding
    search = Search(FailingWhileShrinkingPair(), 2, said.append, examples=300)
    [finding] = search.run()
    assert finding.signature == "diverged steps.new" and search.stats.shrink_runs > 0
    skipped = [line for line in said if line.startswith("[fuzz] skipped")]
    assert skipped == [f"[fuzz] skipped {search.stats.skipped}: the oracle failed: internal: crashed on two requests"]
    assert search.stats.skipped > 0 and not any("crashed while shrinking" in line for line in said)


def test_closing_a_pair_ends_a_run_still_in_flight(tmp_path):
    """What an interrupt leaves: both engines busy in a run (TEST DOUBLEs that hang in it).
    Closing the pair ends them, and so the run, at once; before, the close waited in the pool
    behind the run until the run's own time limit (here 10 minutes)."""
    import sys
    import threading

    from conformance.process.launch import EngineSpec

    double = (sys.executable, str(REPO_ROOT / "tests" / "doubles" / "double_engine.py"), "--fault", "hang")
    pair = Pair(EngineSpec("oracle", double), EngineSpec("candidate", double), ["config"], run_timeout=600.0)
    pair.start()
    pids = [session._proc._proc.pid for session in pair._sessions.values()]
    ran: list = []
    run = threading.Thread(target=lambda: ran.append(pair.run(load_scenario(SCENARIO_DIR / "dflash_27b_gate.json"))),
                           daemon=True)
    run.start()
    run.join(2.0)  # the run has started: both doubles hang in it
    assert run.is_alive()
    closing = threading.Thread(target=pair.close, daemon=True)
    closing.start()
    closing.join(120.0)  # bounded: not a timing assertion
    assert not closing.is_alive(), "the close waited behind the run"
    run.join(30.0)
    assert not run.is_alive() and all(trace.failure is not None for trace in ran[0])
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def size_of(workload: dict) -> tuple[int, int]:
    """Requests, then their prompt and output tokens: what 'smallest' means first."""
    reqs = workload["requests"]
    return len(reqs), sum(r["prompt_len"] + r["max_tokens"] for r in reqs)


def test_ctrl_c_while_shrinking_keeps_the_smallest_failing_example(tmp_path):
    pair = InterruptedPair(at=20)
    search = Search(pair, 4, QUIET, examples=300)  # seed 4: its first failing example shrinks a long way
    with pytest.raises(KeyboardInterrupt):
        search.run()
    [finding] = search.findings
    assert not finding.shrunk and not finding.confirmed
    said: list[str] = []
    fuzz_cli.keep_unfinished(search.findings, tmp_path, 1, "double", "0.27.1", said.append)
    path = tmp_path / "fuzz_steps_new_unconfirmed.json"
    assert said == [f"[fuzz] interrupted: the smallest failing example of 'diverged steps.new' found so far "
                    f"(not fully shrunk, not confirmed, "
                    f"{fuzz_cli.count_of(len(finding.raw['workload']['requests']), 'request')}) is in {path}"]
    written = load_scenario(path)
    assert "Stopped by an interrupt: not fully shrunk, not confirmed." in written.description
    # the smallest failing example seen, smaller than the first: shrinking had made progress
    assert size_of(written.workload) == min(pair.failing) < pair.failing[0]
    verdict, _ = DoublePair().judge(written)
    assert signature(verdict) == "diverged steps.new"


# `parity fuzz` in a process of its own, its engines TEST DOUBLEs: DoublePair in place of the
# oracle's and the candidate's workers (the planted admission bug), each run taking 50 ms once
# one has diverged: the shrinking still runs when the interrupt comes.
FUZZ_DRIVER = """
import sys, time
sys.path[:0] = [sys.argv[1]]
from conformance import cli
from conformance.fuzz import campaign as fuzz_cli
from conformance.process.launch import EngineSpec
from tests.fuzz.double_pair import DoublePair

class SlowDoublePair(DoublePair):
    def __init__(self, oracle, candidate, layers):
        super().__init__()
        self.diverged = False
    def start(self):
        pass
    def close(self):
        pass
    def judge(self, scenario, timeout=None):
        time.sleep(0.05 if self.diverged else 0)
        verdict, golden = super().judge(scenario)
        self.diverged = self.diverged or verdict.kind == "diverged"
        return verdict, golden

class DoubleLauncher:
    def __init__(self, pins, log, find_mutant=None):
        pass
    def spec(self, ref):
        return EngineSpec(ref.label, ("TEST-DOUBLE",))
    def close(self):
        pass

fuzz_cli.Launcher = DoubleLauncher
fuzz_cli.Pair = SlowDoublePair
sys.exit(cli.main(sys.argv[2:]))
"""


def test_ctrl_c_while_shrinking_writes_what_was_found_and_exits_130(tmp_path):
    import signal
    import subprocess
    import sys
    import threading

    from tests.helpers import REPO

    out = tmp_path / "out"
    # seed 2: its first failing example (5 requests) takes hundreds of 50 ms runs to shrink, so the
    # interrupt comes while shrinking; seed 1's is nearly minimal already and can finish first
    argv = [sys.executable, "-c", FUZZ_DRIVER, str(REPO), "fuzz", "--candidate", "TEST-DOUBLE",
            "--seed", "2", "--examples", "300", "--out", str(out)]
    fuzz = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    shrinking = threading.Event()

    def read() -> None:
        for line in fuzz.stderr:
            lines.append(line)
            if line.startswith("[fuzz] finding after ") and line.rstrip().endswith("; shrinking"):
                shrinking.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert shrinking.wait(120), "".join(lines)  # bounded: not a timing assertion
        fuzz.send_signal(signal.SIGINT)
        fuzz.wait(timeout=60)  # stderr is the reader's alone
        stdout = fuzz.stdout.read()
    finally:
        if fuzz.poll() is None:
            fuzz.kill()
    reader.join(10)
    err = "".join(lines)
    assert fuzz.returncode == 130, err
    assert "Traceback" not in err, err
    path = out / "fuzz_steps_new_unconfirmed.json"
    assert "[fuzz] interrupted: the smallest failing example of 'diverged steps.new' found so far " \
           f"(not fully shrunk, not confirmed, " in err and f") is in {path}\n" in err, err
    assert "parity fuzz: interrupted (Ctrl-C)" in err, err
    assert sorted(p.name for p in out.iterdir() if p.name != ".parity-findings.lock") == [path.name]
    written = load_scenario(path)
    assert "Stopped by an interrupt: not fully shrunk, not confirmed." in written.description
    verdict, _ = DoublePair().judge(written)
    assert signature(verdict) == "diverged steps.new"
    assert stdout == ""  # no report: nothing was confirmed


REFUSAL = {"type": "ValueError", "message": "max_num_batched_tokens (1) is smaller than max_model_len (16)."}


@pytest.mark.parametrize("candidate, words", [
    # refused as the oracle did, then no record for steps and outputs (PROTOCOL.md's rule aside)
    ({"config": [{"refused": REFUSAL, "budget_log_lines": []}], "steps": [], "outputs": []},
     ["candidate: sent no record here", "the oracle has 1 more record, from #0 on"]),
    # a refusal that is not {type, message}
    ({"config": [{"refused": REFUSAL, "budget_log_lines": []}], "steps": [{"refused": "too small"}],
      "outputs": [{"refused": REFUSAL}]},
     ['candidate: refused = too small (not a {type, message} refusal)']),
    # accepted where the oracle refused: said so
    ({"config": [{"refused": None, "max_num_seqs": 1, "budget_log_lines": []}], "steps": [{"step": 0}],
      "outputs": [{"refused": REFUSAL}]},
     ["candidate: accepted the configuration"]),
])
def test_the_fuzz_report_says_what_each_sides_records_say(candidate, words):
    """The report of a finding names a refusal only where the candidate's record holds one,
    and acceptance only where its record says so; never "accepted" for a side that refused."""
    raw = json.loads((SCENARIO_DIR / "steady_decode.json").read_text(encoding="utf-8"))
    scenario = parse_scenario(raw, SCENARIO_DIR / "steady_decode.json")
    hello = {"engine": "double", "version": "0", "protocol": 2}
    oracle = make_trace("oracle", hello, scenario, {"config": [{"refused": REFUSAL, "budget_log_lines": []}],
                                                    "steps": [{"refused": REFUSAL}], "outputs": [{"refused": REFUSAL}]})
    verdict = judge(make_trace("double", hello, scenario, candidate), oracle, CANDIDATE)
    finding = Finding(signature(verdict), raw, 1, 1, path=Path("out/fuzz/x.json"), verdict=verdict, confirmed=True)
    text = fuzz_cli.report(finding, "0.27.1", 1, "double", "0.27.1")
    for line in words:
        assert line in text, text
    refused = candidate["config"][0]["refused"] is not None
    assert ("accepted the configuration" in text) == (not refused), text
    assert "#-1" not in text


# Built-in TEST DEVICE mutants whose bug shows in the stand-in layers, each with a seed that
# finds it within the example budget here (same seed, same examples): seed 1 finds
# ignore-max-num-seqs and shrinks it to 2 requests (the seeds moved when the spaces began to
# draw LoRA adapters). The
# last two need the space's KV connector (a failed load's blocks) and hybrid model (two KV cache
# groups), drawn now and then after every other draw.
@pytest.mark.oracle
@pytest.mark.parametrize("mutant, seed", [("ignore-max-num-seqs", 1), ("draft-plus-one", 2),
                                          ("ignore-invalid-kv-blocks", 2), ("sliding-window-as-full", 1)])
def test_finds_and_shrinks_a_mutant(mutant, seed, warm_sessions, tmp_path):
    oracle = load_pins().oracle
    pair = Pair.warm(warm_sessions(oracle), warm_sessions(f"{oracle}+mutant:{mutant}"), list(STAND_IN_LAYERS))
    try:
        search = Search(pair, seed, QUIET, examples=400, shrink_limit=90.0)
        [finding] = search.run()
        fuzz_cli.confirm(pair, finding, tmp_path, 1, mutant, oracle, QUIET)
        assert finding.confirmed, finding.signature
        assert len(finding.raw["workload"]["requests"]) <= 3
        lines: list[str] = []
        assert fuzz_cli.replay(pair, finding.path, oracle, out=lines.append) == 1
        assert lines == [render_verdict(finding.verdict, oracle)]  # the gate's own report
        written = load_scenario(finding.path)
        replayed, oracle_trace = pair.judge(written)
        assert signature(replayed, written, oracle_trace) == finding.signature  # the cause included
    finally:
        pair.close()



@pytest.mark.oracle
# in the process that warms this mutant for tests/engines/test_engine_layer.py: one cold start, not two
@pytest.mark.xdist_group(f"{load_pins().oracle}+mutant:logit-scale-1.10")
def test_an_engine_bug_is_found_on_the_engine_layers(warm_sessions, tmp_path):
    """The whole engine on the tiny models: a mutant that only the engine layers see (every
    logit times 1.10: the same greedy tokens, other logprobs) is found, shrunk to one request,
    confirmed and replayed, judged within the engine layers' tolerance."""
    oracle = load_pins().oracle
    layers = ["engine_steps", "engine_outputs"]
    pair = Pair.warm(warm_sessions(oracle), warm_sessions(f"{oracle}+mutant:logit-scale-1.10"), layers)
    try:
        [finding] = Search(pair, 1, QUIET, examples=5, shrink_limit=60.0).run()
        assert finding.signature == "diverged engine_outputs.*.logprobs[*][token *]"
        fuzz_cli.confirm(pair, finding, tmp_path, 1, "logit-scale-1.10", oracle, QUIET)
        assert finding.confirmed and len(finding.raw["workload"]["requests"]) == 1
        written = load_scenario(finding.path)
        assert written.engine is not None and written.layers == ["config", *ENGINE_LAYERS]
        lines: list[str] = []
        assert fuzz_cli.replay(pair, finding.path, oracle, out=lines.append) == 1
        assert "logprob beyond the scenario's tolerance" in lines[0]
    finally:
        pair.close()


@pytest.mark.oracle
def test_coverage_guidance_counts_the_oracles_branches(warm_sessions, tmp_path):
    """--guide coverage: the oracle's worker runs under coverage.py and reports after each run
    the branch arcs it reached first; the search counts them and prefers examples with new ones."""
    from conformance.process.coverage_run import BranchesReached, ensure_coverage, guided_worker
    from conformance.process.envs import ensure_env
    from conformance.process.session import EngineSession

    oracle = load_pins().oracle
    python = ensure_env(oracle, log=QUIET)
    branches = BranchesReached(tmp_path / "branches.jsonl")
    guided = EngineSession(guided_worker(oracle, python, ensure_coverage(python, log=QUIET), branches.path))
    guided.start()
    pair = Pair.warm(guided, warm_sessions(oracle), list(STAND_IN_LAYERS))
    try:
        scenario = load_scenario(SCENARIO_DIR / "steady_decode.json")
        pair.judge(scenario)
        first = branches.new()
        pair.judge(scenario)
        assert first > 50 and branches.new() == 0  # the same scenario again: nothing new
        pair.judge(load_scenario(SCENARIO_DIR / "kv_pressure.json"))
        assert branches.new() > 0  # preemption: branches steady decoding never takes
        assert any(name.endswith("kv_cache_manager.py") for name, _a, _b in branches.arcs)
        search = Search(pair, 3, QUIET, examples=20, branches=branches, guide=True)
        assert search.run() == []  # the oracle against itself
        assert search.stats.examples == 20 and len(branches.arcs) >= first
    finally:
        pair.close()
        guided.close()


def test_the_advice_for_a_finding_is_a_make_command_that_works(tmp_path):
    """The report says how to write the finding's goldens: `make goldens SCENARIOS=NAME`, which
    reaches `parity goldens` (a bare `-k NAME` is swallowed by make)."""
    import subprocess

    from tests.helpers import REPO

    raw = json.loads((SCENARIO_DIR / "steady_decode.json").read_text(encoding="utf-8"))
    finding = Finding("diverged config.max_num_seqs", raw, 3, 2, path=tmp_path / "fuzz_config_max_num_seqs.json",
                      confirmed=True)
    advice = next(line for line in fuzz_cli.report(finding, "0.27.1", 1, "cand", "0.27.1").splitlines()
                  if "library:" in line)
    command = advice.split("then ", 1)[1]
    assert command == "make goldens SCENARIOS=fuzz_config_max_num_seqs", advice
    dry = subprocess.run(["make", "-n", *command.split()[1:]], cwd=REPO, capture_output=True, text=True,
                         encoding="utf-8", stdin=subprocess.DEVNULL)
    assert "parity goldens --scenario 'scenarios/fuzz_config_max_num_seqs.json'" in dry.stdout, dry.stdout + dry.stderr


def test_the_default_layers_are_steps_and_outputs_among_those_served():
    """Without --layers: steps and outputs (config left out, so a scheduler-only candidate's
    config record does not end the search at once), narrowed to what the candidate serves."""
    from conformance.fuzz.search import FuzzError

    assert fuzz_cli.parse_layers(None) == ["steps", "outputs"]
    assert fuzz_cli.parse_layers("config,steps,outputs") == ["config", "steps", "outputs"]
    assert fuzz_cli.served_defaults(None, "port") == ["steps", "outputs"]
    assert fuzz_cli.served_defaults(["config", "steps", "outputs", "methods"], "port") == ["steps", "outputs"]
    assert fuzz_cli.served_defaults(["config", "steps"], "port") == ["steps"]
    with pytest.raises(FuzzError, match=r"port serves neither of the default layers .*--layers"):
        fuzz_cli.served_defaults(["config"], "port")


class FlakyPair(DoublePair):
    """TEST DOUBLE: the planted bug shows during the search only; on the confirming reruns the
    candidate passes (`then="pass"`) or the oracle cannot run the written file (`then="oracle"`)."""

    def __init__(self, then: str):
        super().__init__()
        self.then, self.confirming = then, False

    def judge(self, scenario, timeout=None):
        if not self.confirming:
            return super().judge(scenario, timeout)
        if self.then == "oracle":
            return None, trace_of({"failure": {"kind": "crash", "message": "the oracle's worker exited"}})
        self.bug = False
        return super().judge(scenario, timeout)


@pytest.mark.parametrize("then, said", [("pass", "it passed on the rerun (verdict pass)"),
                                        ("oracle", "the oracle could not run it (crash: the oracle's worker exited)")])
def test_a_finding_that_does_not_repeat_is_kept_under_an_unconfirmed_name_saying_why(tmp_path, then, said):
    """It was kept as fuzz_steps_new.json, its description saying the candidate diverged on it,
    and the log said "got no oracle trace" when the rerun simply passed."""
    pair = FlakyPair(then)
    [finding] = Search(pair, 1, QUIET, examples=300).run()
    pair.confirming = True
    logged, printed = [], []
    assert fuzz_cli.deliver(pair, [finding], tmp_path, 1, "double", "0.27.1", "0.27.1", logged.append,
                            printed.append) == 0
    assert not finding.confirmed
    assert finding.path == tmp_path / "fuzz_steps_new_unconfirmed.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fuzz_steps_new_unconfirmed.json"]
    written = load_scenario(finding.path)
    assert written.name == "fuzz_steps_new_unconfirmed"
    assert written.description.endswith(f"but a rerun of this file did not repeat it: {said}. Not confirmed."), \
        written.description
    assert any(f"did not repeat 'diverged steps.new': {said}" in line for line in logged), logged
    assert not any("no oracle trace" in line for line in logged), logged
    [text] = printed
    assert "NOT confirmed on a rerun" in text and "library:" not in text
