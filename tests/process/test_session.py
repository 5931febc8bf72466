"""EngineSession (process/session.py): every outcome of a unit is a trace, and one rule decides
when the engine is started again. The engines are the TEST DOUBLE (tests/doubles/double_engine.py)."""

import ast
import json
import time

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.process.launch import EngineSpec
from conformance.process.session import EngineSession, OutOfTime
from tests.helpers import GATE, REPO

RECORD = {**GOLDENS.load("dflash_27b_gate", load_pins().oracle).layers["config"][0], "budget_log_lines": ["line"]}
SCENARIO = load_scenario(GATE)


@pytest.fixture
def double(double_engine, tmp_path):
    """A session over the TEST DOUBLE with `options`; its starts counted in a file."""
    record, starts = tmp_path / "record.json", tmp_path / "starts"
    record.write_text(json.dumps(RECORD))

    def make(*options: str, **session) -> EngineSession:
        argv = double_engine("--record", str(record), "--startfile", str(starts), *options)
        return EngineSession(EngineSpec("double", argv), **session)

    make.startfile = starts
    make.starts = lambda: len(starts.read_text().split()) if starts.exists() else 0
    return make


def kinds(traces: list[dict]) -> list:
    return [t.failure and t.failure.kind for t in traces]


@pytest.mark.parametrize("fault, kind", [("crash", "crash"), ("garbage", "protocol"), ("hang", "timeout")])
def test_an_engine_the_client_ended_is_started_again_for_the_next_unit(double, fault, kind):
    with double("--fault", fault, "--after-runs", "1", run_timeout=2.0) as session:
        traces = [session.trace(SCENARIO, ["config"]) for _ in range(3)]
    assert kinds(traces) == [None, kind, None]  # the restarted engine serves the third unit
    assert session.cold_starts == double.starts() == 2
    if fault == "crash":
        assert traces[1].layers == {"config": [RECORD]}  # the records that arrived are kept


@pytest.mark.parametrize("fault, repeat, kind", [("error", 1, "engine_error"), ("nondeterministic", 2, "nondeterministic")])
def test_an_engine_that_answered_stays_warm(double, fault, repeat, kind):
    """An error the engine reported, or two runs that differ, end the unit, not the engine
    (PROTOCOL.md: it keeps serving)."""
    with double("--fault", fault, "--after-runs", str(repeat)) as session:
        traces = [session.trace(SCENARIO, ["config"], repeat) for _ in range(3)]
    assert kinds(traces) == [None, kind, kind] and session.cold_starts == double.starts() == 1


def test_an_unsupported_layer_is_a_trace_and_leaves_the_engine_warm(double):
    with double() as session:
        refused = session.trace(SCENARIO, ["config", "steps"])
        served = session.trace(SCENARIO, ["config"])
    assert refused.failure.kind == "unsupported" and "only ['config']" in refused.failure.message
    assert served.failure is None and session.cold_starts == 1


def test_two_runs_that_differ_are_nondeterministic_naming_where(double):
    with double("--fault", "nondeterministic") as session:
        trace = session.trace(SCENARIO, ["config"], repeat=2)
    failure = trace.failure
    assert failure.kind == "nondeterministic", failure
    assert failure.message == (f"scenario {SCENARIO.name}: two runs of the same engine differ in layer config "
                                  "at record 0, field max_num_seqs: 1 then 2")
    assert trace.layers["config"][0]["max_num_seqs"] == 1  # the first run's records are kept


def test_a_session_asking_only_what_is_declared_lists_the_rest(double):
    with double("--steps", "2", "--serve", "config", declared_only=True) as session:
        part = session.trace(SCENARIO, ["config", "steps"])
        none = session.trace(SCENARIO, ["steps"])
    assert list(part.not_served) == ["steps"] and list(part.layers) == ["config"]
    assert list(part.capabilities) == ["config"] and part.failure is None
    assert list(none.not_served) == ["steps"] and none.layers == {}  # nothing asked of the engine


def test_an_engine_that_cannot_start_is_a_trace_and_is_tried_again(tmp_path):
    with EngineSession(EngineSpec("nothing", (str(tmp_path / "no-such-engine"),))) as session:
        traces = [session.trace(SCENARIO, ["config"]) for _ in range(2)]
    assert kinds(traces) == ["crash", "crash"] and "cannot start" in traces[0].failure.message
    assert traces[0].engine["name"] is None and session.cold_starts == 2


def test_a_deadline_that_cuts_a_run_is_out_of_time_not_a_verdict(double):
    with double("--fault", "hang") as session:
        session.start()
        with pytest.raises(OutOfTime):
            session.trace(SCENARIO, ["config"], until=time.monotonic() + 1.0)
        session.start()
    assert session.cold_starts == double.starts() == 2  # the hung engine was ended, then started again


def test_the_session_names_the_engines_own_pid(double):
    with double() as session:
        assert session.start().pid == int(double.startfile.read_text())  # not its keeper's


def test_one_implementation_of_a_unit_to_its_trace():
    """Only the session starts engine processes and makes traces of their runs (conformance/,
    parity/, benchmarks/): every other part asks it."""
    found = []
    for root in ("conformance", "parity", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.relative_to(REPO).as_posix() in ("conformance/process/session.py", "conformance/formats/trace.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                name = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
                if name in ("EngineProcess", "make_trace"):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {name}")
    assert found == [], "a unit run to its trace outside process/session.py:\n" + "\n".join(found)


def test_a_scenario_needing_an_undeclared_feature_is_not_sent_to_a_candidate(tmp_path):
    """declared_only (a candidate under the gate): a scenario needing a feature the hello does not
    declare is a trace naming it, never a run (the TEST DOUBLE fails any run it is sent); `needs`
    (a gate manifest's) overrides the scenario's own."""
    import sys

    double = REPO / "tests" / "doubles" / "declared_engine.py"
    spec = EngineSpec("declared", (sys.executable, str(double), "--features", ""))
    assert SCENARIO.features  # the gate scenario needs speculative decoding at least
    with EngineSession(spec, declared_only=True) as session:
        skipped = session.trace(SCENARIO, ["config"])
        sent = session.trace(SCENARIO, ["config"], needs=())
    assert list(skipped.unsupported_features) == list(SCENARIO.features) and skipped.layers == {}
    assert skipped.failure is None and list(skipped.capabilities)
    assert sent.failure.kind == "engine_error" and sent.unsupported_features is None
    with EngineSession(spec) as session:  # an oracle's session sends everything
        assert session.trace(SCENARIO, ["config"]).failure.kind == "engine_error"
