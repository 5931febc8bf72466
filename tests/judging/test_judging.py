"""judge_trace (conformance/judging/judging.py): the one way from a trace to its verdict."""

import copy

from conformance.formats.pins import load_pins
from conformance.judging.goldens import GOLDENS
from conformance.judging.judging import judge_trace
from conformance.judging.verdict import CANDIDATE, MISSING_GOLDEN, PASS


def _trace(name: str = "steady_decode") -> dict:
    """An engine's run that reproduces the oracle's golden."""
    trace = copy.deepcopy(GOLDENS.load(name, load_pins().oracle))
    trace["engine"] = dict(trace["engine"], label="port")
    return trace


def test_no_golden_is_a_missing_golden_verdict_not_a_type_error():
    """golden=None is documented as "no golden at all": a run that finished is then judged
    missing_golden (it indexed golden["scenario"] and raised TypeError)."""
    verdict = judge_trace(_trace(), None, CANDIDATE)
    assert verdict.kind == MISSING_GOLDEN and verdict.engine == "port" and verdict.scenario == "steady_decode"
    assert "no golden" in verdict.message
    assert judge_trace(_trace(), GOLDENS.load("steady_decode", load_pins().oracle), CANDIDATE).kind == PASS


def test_no_golden_leaves_a_failed_run_its_failure():
    trace = _trace()
    trace["failure"] = {"kind": "crash", "message": "the engine exited with status 1"}
    verdict = judge_trace(trace, None, CANDIDATE)
    assert verdict.kind == "crash" and verdict.message == "the engine exited with status 1"
