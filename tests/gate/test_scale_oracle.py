"""Integration, production scale: a divergence deep in a run judged in the digest form
(the TEST DEVICE mutant budget-minus-one-after-1000 on the mid-size generated scenario) is
reported at its first step, with both sides' records there in full: the candidate's kept as
they arrived, the oracle's replayed live from step 0 and checked against the golden's digests."""

from dataclasses import replace

import pytest

from conformance.formats.engine_ref import EngineRef
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.gate.execute import golden_sinks
from conformance.gate.replay import oracle_windows
from conformance.judging.goldens import GOLDENS
from conformance.judging.judging import judge_trace
from conformance.process.launch import prepare_engine
from conformance.process.session import EngineSession
from conformance.report.render_text import render
from tests.helpers import REPO

pytestmark = pytest.mark.oracle
PINS = load_pins()
MIDSIZE = load_scenario(REPO / "scenarios" / "prod_deep_midsize.json")


def test_a_deep_divergence_is_reported_at_its_first_step_in_full():
    golden = GOLDENS.lookup(MIDSIZE.name, PINS.oracle)
    assert golden.trace is not None, f"no golden for {MIDSIZE.name}: `parity goldens --scale production`"
    mutant = prepare_engine(EngineRef.test_device(PINS.oracle, "budget-minus-one-after-1000"), PINS, lambda m: None)
    with EngineSession(mutant, sinks=golden_sinks(PINS.oracle)) as session:  # checked as the gate does
        trace = session.trace(MIDSIZE)
    assert trace.failure is None, trace.failure
    assert "window" in trace.digests["steps"] and "steps" not in trace.layers
    replayed = oracle_windows(trace, MIDSIZE, PINS, log=lambda message: None)
    window = replayed.digests["steps"]["oracle_window"]
    assert "problem" not in window, window.get("problem")

    verdict = judge_trace(replayed, golden, "candidate")
    assert verdict.kind == "diverged"
    steps = next(c for c in verdict.comparisons if c.layer == "steps" and not c.equal)
    n = steps.index
    oracle, mine = steps.record, steps.actual_record
    # the first step from schedule() call 1000 on where the oracle's budget binds: every
    # earlier record has the golden's digest, and the candidate cannot schedule a full budget
    assert n >= 1000 and oracle["step"] == mine["step"] == n
    assert oracle["total_num_scheduled_tokens"] == oracle["token_budget"] == 1024
    assert (mine["token_budget"], mine["total_num_scheduled_tokens"]) == (1023, 1023)
    paths = [f.path for f in steps.fields]
    assert "total_num_scheduled_tokens" in paths and paths[-1] == "token_budget"  # the budget last
    assert steps.first.path != "token_budget"
    # without the oracle's records there (no replay, no checkpoint), the step is still exact
    digests = golden.trace.digests
    bare = replace(golden.trace, digests=dict(digests, steps=dict(digests["steps"], checkpoints={})))
    blind = judge_trace(trace, bare, "candidate")
    blind_steps = next(c for c in blind.comparisons if c.layer == "steps" and not c.equal)
    assert blind_steps.index == n and "live replay" in blind_steps.explanation

    text = render([verdict], PINS.oracle)
    assert f"step {n}" in text and steps.first.path.split(".")[-1] in text
