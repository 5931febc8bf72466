"""A run that failed midway: the records it sent are still compared with the golden, so a port
that diverged at step 3 and crashed at step 40 is reported at step 3, with its stderr tail."""

from conformance.judging.requirement_rows import apply_gate
from conformance.judging.verdict import DIVERGED, exit_status, judge
from conformance.judging.waivers import Waiver
from conformance.report.render_text import render_verdict

import datetime as dt


def steps(n: int, bad_at: int | None = None) -> list[dict]:
    return [{"step": i, "total_num_scheduled_tokens": 64 + (1 if i == bad_at else 0)} for i in range(n)]


def trace(records: list[dict], failure: dict | None, sha: str = "s" * 64) -> dict:
    t = {"engine": {"label": "port"}, "scenario": {"name": "sc", "sha256": sha},
         "provenance": {}, "layers": {"config": [{"max_num_scheduled_tokens": 4036}], "steps": records}}
    if failure:
        t["failure"] = failure
    return t


GOLDEN = trace(steps(40), None)
CRASH = {"kind": "crash", "message": "port exited (status 3) during step 40; last stderr lines:\n"
                                     "Traceback (most recent call last):\nAssertionError"}


def test_a_divergence_before_the_crash_is_the_verdict_at_its_step():
    verdict = judge(trace(steps(39, bad_at=3), CRASH), GOLDEN, "candidate")
    assert verdict.kind == DIVERGED and verdict.failure == "crash"
    c = next(c for c in verdict.comparisons if c.layer == "steps")
    assert (c.index, c.first.path, c.first.expected, c.first.actual) == (3, "total_num_scheduled_tokens", 64, 65)
    text = render_verdict(verdict, "0.27.1")
    assert "then the engine failed (crash)" in text and "Traceback (most recent call last)" in text
    assert exit_status([verdict]) == 2  # it did not finish: never a plain divergence
    from conformance.judging.requirement_rows import apply_gate
    from conformance.report.render_text import render_gate
    from conformance.report.view import gate_view

    lines = render_gate(gate_view(apply_gate([verdict], {}, []), "0.27.1")).splitlines()
    matrix_row = next(line for line in lines if line.startswith(verdict.scenario + " "))  # the grid's row
    assert matrix_row.split()[1] == "diverged+crash" and matrix_row.split()[2].startswith("steps.total_num")


def test_a_crash_after_agreeing_says_how_far_it_agreed():
    verdict = judge(trace(steps(39), CRASH), GOLDEN, "candidate")
    assert verdict.kind == "crash" and not verdict.comparisons
    assert "every record it sent agreed with the golden (config: 1 records, steps: 39 records)" in verdict.message
    assert "AssertionError" in verdict.message


def test_no_golden_or_another_scenario_version_leaves_the_failure_alone():
    assert judge(trace(steps(5, bad_at=1), CRASH), None, "candidate").kind == "crash"
    other = trace(steps(40), None, sha="t" * 64)
    assert judge(trace(steps(5, bad_at=1), CRASH), other, "candidate").kind == "crash"


def test_a_nondeterministic_oracle_is_not_rejudged_as_a_divergence():
    failure = {"kind": "nondeterministic", "message": "two runs differ"}
    assert judge(trace(steps(40, bad_at=2), failure), GOLDEN, "oracle").kind == "nondeterministic"


def test_a_divergence_that_then_crashed_is_never_waived():
    verdict = judge(trace(steps(39, bad_at=3), CRASH), GOLDEN, "candidate")
    waiver = Waiver("ENG-SCHED-CORE", "sc", "steps.*", "known", "team", dt.date(2099, 1, 1))
    result = apply_gate([verdict], {"sc": ("ENG-SCHED-CORE",)}, [waiver])
    assert not result.waived and result.unused == [waiver] and result.status == 2
