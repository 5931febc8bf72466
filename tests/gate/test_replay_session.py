"""The live replays of one run share one oracle engine (gate/replay.py ReplaySession): made by
the session factory it is given (a gate's RunContext.sessions), started once, each replay's
records digested into that replay's own sink, closed at the end. The engine here is a TEST
DOUBLE session that records what it was asked; the real oracle's replays are run by
tests/gate/test_production_gate.py."""

from conformance.formats.digest import DigestSink
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.gate.replay import ReplaySession
from tests.helpers import REPO

PINS = load_pins()


class DoubleSession:
    """TEST DOUBLE of EngineSession: records each run and the steps sink it was given."""

    made: list["DoubleSession"] = []

    def __init__(self, spec, sinks):
        self.spec, self.sinks, self.runs, self.closed = spec, sinks, [], False
        DoubleSession.made.append(self)

    def trace(self, scenario, layers, stop_after_step):
        self.runs.append((scenario.name, layers, stop_after_step, self.sinks(scenario, layers)["steps"]))

        class Done:
            failure = None
        return Done()

    def close(self):
        self.closed = True


def test_every_replay_of_a_run_goes_to_one_oracle_engine_with_its_own_sink():
    DoubleSession.made.clear()
    scenario = load_scenario(REPO / "scenarios" / "prod_deep_midsize.json")
    first, second = DigestSink("steps", keep_last=5), DigestSink("steps", keep_last=5)
    with ReplaySession(PINS, lambda message: None, sessions=DoubleSession) as oracle:
        assert DoubleSession.made == []  # started by the first replay only
        assert oracle.steps(scenario, 151, first) is None
        assert oracle.steps(scenario, 1002, second) is None
    [engine] = DoubleSession.made
    assert engine.spec.release == PINS.oracle  # the pinned oracle's own worker
    assert engine.runs == [("prod_deep_midsize", ["steps"], 151, first), ("prod_deep_midsize", ["steps"], 1002, second)]
    assert engine.runs[0][3] is first and engine.runs[1][3] is second  # each replay's own sink
    assert engine.closed


def test_a_run_without_a_replay_starts_no_engine():
    DoubleSession.made.clear()
    with ReplaySession(PINS, lambda message: None, sessions=DoubleSession):
        pass
    assert DoubleSession.made == []
