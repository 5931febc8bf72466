"""Each report opens on what to fix (issue 43): the verdict line with what was judged, then each
failing cell's first divergence (scenario, layer, step, field, both values, the likely cause,
the requests at that step), then the grid. Checked on what a reader sees first: the first 40
lines of the terminal report (stdout, which holds the report alone), the first 40 lines of
summary.md, and report.html's first screen in a 1366x768 window (where chromium is installed).

Two gates: a layered port (config, steps, outputs) with one planted bug, whose engines are TEST
DOUBLES replaying the real oracle's goldens (tests/doubles/hostile_engine.py), over the whole
library; and the default gate with the no-draft-reservation mutant (a TEST DEVICE of the real
oracle), whose first divergence is the seed's budget (the scheduler's token budget without the
drafting slots reserved)."""

from __future__ import annotations

import pytest

from conformance.formats.pins import load_pins
from conformance.judging.goldens import GOLDENS
from tests.helpers import gate_engine, hostile_double
from tests.report.chromium import CHROMIUM, check_first_screen, render

PINS = load_pins()
FIRST = 40  # lines a reader sees before scrolling
# the planted bug: at step 5 of kv_pressure_no_spec, request r1 is given 2 tokens, not the oracle's 1
BUG = {"scenario": "kv_pressure_no_spec", "layer": "steps", "seq": 5, "path": ["requests", "r1", "tokens"], "value": 2}


@pytest.fixture
def doubles_gate(tmp_path, monkeypatch, capsys):
    """`parity gate` in this process, the oracle and the candidate TEST DOUBLES (their plans)."""
    from conformance import cli
    from conformance.gate import plan as gate_plan

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(oracle_plan: dict, plan: dict, *argv: str):
        engines = [gate_engine("TEST-DOUBLE-oracle=" + hostile_double(tmp_path, "oracle", oracle_plan), "oracle"),
                   gate_engine("port=" + hostile_double(tmp_path, "port", plan), "candidate")]
        monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: engines)
        capsys.readouterr()
        status = cli.main(["gate", "--waivers", "/dev/null", "--jobs", "2", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def first_lines(text: str) -> str:
    return "\n".join(text.splitlines()[:FIRST])


def test_a_layered_port_with_one_planted_bug_is_named_on_every_first_screen(doubles_gate, tmp_path):
    reports = tmp_path / "reports"
    serve = ["config", "steps", "outputs"]
    status, out, err = doubles_gate({"serve": serve}, {"serve": serve, "edits": [BUG]},
                                    "--layers", ",".join(serve), "--reports", str(reports))
    assert status == 1, out + err
    assert out.startswith("== vllm-parity gate: FAIL (exit status 1)") and "[gate]" not in out  # the report alone
    head = first_lines(out)
    # the block: scenario, engine, layer, step, field and both values, then the request that differs
    assert "[1] kv_pressure_no_spec, port (candidate): diverged" in head, head
    assert "steps, step 5, field requests.r1.tokens: oracle 1, candidate 2" in head, head
    assert "likely cause: a scheduling decision: the tokens a request was given at this step" in head, head
    block = head[head.index("[1] kv_pressure_no_spec"):]
    assert "! r1" in block, block  # its state at that step, oracle beside candidate
    assert head.index("[1] kv_pressure_no_spec") < head.index("-- the grid")  # before the grid
    summary = first_lines((reports / "summary.md").read_text(encoding="utf-8"))
    assert ("| kv_pressure_no_spec | `port` | diverged | steps | step 5 | `requests.r1.tokens` | 1 | 2 |"
            in summary), summary
    assert "steps, step 5, field requests.r1.tokens: oracle 1, candidate 2" in summary  # and its requests
    check_page(reports / "report.html", "kv_pressure_no_spec", "steps.requests.r1.tokens (step 5): oracle 1, candidate 2")


def check_page(page, scenario: str, said: str) -> None:
    """The page's first screen (1366x768) lists the failing cell with its first divergence."""
    text = page.read_text(encoding="utf-8")
    assert said in text, said
    if CHROMIUM is None:  # `make report-check` installs chromium; without it the page is read as text
        return
    dom, errors = render(page)
    assert errors == []
    assert scenario in check_first_screen(dom)
    rows = [("".join(t)) for tag, a, t in dom.found if tag == "tr" and a.get("data-failing")]
    assert rows


@pytest.mark.oracle
def test_the_no_draft_reservation_mutant_on_the_default_gate_is_named_on_every_first_screen(
        tmp_path, capsys, monkeypatch, warm_gate):
    """The default gate (every library scenario, every layer) with the real oracle and its
    no-draft-reservation mutant: the first 40 lines of stdout and of summary.md name the
    scenario, the record, the field and both budgets."""
    from conformance import cli

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    reports = tmp_path / "reports"
    status = cli.main(["gate", "--candidate", f"{PINS.oracle}+mutant:no-draft-reservation", "--waivers", "/dev/null",
                       "--reports", str(reports)])
    out, err = capsys.readouterr()
    assert status in (1, 2), out  # it diverges, and crashes where it overruns
    assert out.startswith("== vllm-parity gate: ") and "[gate]" not in out
    golden = GOLDENS.load("async_draft_model", PINS.oracle).layers["config"][0]["max_num_scheduled_tokens"]
    head = first_lines(out)
    label = f"vllm-{PINS.oracle}+mutant:no-draft-reservation"
    assert f"[1] async_draft_model, {label} (candidate): diverged" in head, head
    assert (f"config, record 0, field max_num_scheduled_tokens: oracle {golden}, candidate 512") in head, head
    assert "likely cause: the scheduler's token budget resolved differently" in head
    assert "dflash_27b_gate" in head  # the seed's scenario, alike: named in the block
    summary = first_lines((reports / "summary.md").read_text(encoding="utf-8"))
    assert "| async_draft_model and " in summary, summary
    assert f"| config | record 0 | `max_num_scheduled_tokens` | {golden} | 512 |" in summary, summary
    check_page(reports / "report.html", "async_draft_model",
               f"config.max_num_scheduled_tokens (record 0): oracle {golden}, candidate 512")


def foreign_features() -> list[str]:
    """What a foreign engine (nano-vllm, say) declares: no drafter, prefix caching it cannot turn
    off, no stop_token_ids, and none of vLLM's log lines."""
    from conformance.formats.features import FEATURES, SPEC

    lacks = {"parallel_drafting", "prefix_caching_off", "stop_token_ids", "vllm_log_lines"}
    return [name for name in FEATURES if not name.startswith(SPEC) and name not in lacks]


def test_a_foreign_engine_is_headlined_by_its_scheduling_rule_not_by_vllms_log_lines(doubles_gate, tmp_path):
    """A TEST DOUBLE of a foreign engine: it prints none of vLLM's log lines (`budget_log_lines`
    empty everywhere), has no lookahead slots (`num_lookahead_tokens` null) and differs from vLLM
    in one scheduling rule (planted at one step of one scenario it runs). Its hello says what it
    lacks, so it is judged on its behaviour: every sink headlines that rule, and nothing else fails."""
    golden = GOLDENS.load("prefix_multi_turn", PINS.oracle).layers["steps"]
    seq, rid = next((i, r) for i, step in enumerate(golden) for r, entry in (step.get("requests") or {}).items()
                    if i >= 2 and entry.get("tokens"))
    tokens = golden[seq]["requests"][rid]["tokens"]
    serve = ["config", "steps", "outputs"]
    plan = {"serve": serve, "hello": {"engine": "foreign", "features": foreign_features()}, "edits": [
        {"layer": "config", "seq": 0, "path": ["budget_log_lines"], "value": []},
        {"layer": "config", "seq": 0, "path": ["async_log_lines"], "value": []},
        {"layer": "config", "seq": 0, "path": ["num_lookahead_tokens"], "value": None},
        {"scenario": "prefix_multi_turn", "layer": "steps", "seq": seq, "path": ["requests", rid, "tokens"],
         "value": tokens + 1}]}
    reports = tmp_path / "reports"
    status, out, err = doubles_gate({"serve": serve}, plan, "--layers", ",".join(serve), "--reports", str(reports),
                                    "--require-features", "none")
    assert status == 1, out + err
    first = out.splitlines()[0]
    assert "port judged on" in first and "(without vLLM's log lines: its hello does not declare vllm_log_lines)" in first
    where = f"steps, step {golden[seq]['step']}, field requests.{rid}.tokens: oracle {tokens}, candidate {tokens + 1}"
    head = first_lines(out)
    assert "-- what to fix: 1 gating cell did not pass" in head, head  # the rule alone: no log line, no lookahead
    assert "[1] prefix_multi_turn, port (candidate): diverged" in head and where in head, head
    grid = next(line for line in out.splitlines() if line.startswith("prefix_multi_turn"))
    assert f"diverged steps.requests.{rid}.tokens" in grid, grid
    summary = first_lines((reports / "summary.md").read_text(encoding="utf-8"))
    assert f"| prefix_multi_turn | `port` | diverged | steps | step {golden[seq]['step']} | `requests.{rid}.tokens` |" in summary
    assert "budget\\_log\\_lines" not in summary and "budget_log_lines" not in summary
    check_page(reports / "report.html", "prefix_multi_turn",
               f"steps.requests.{rid}.tokens (step {golden[seq]['step']}): oracle {tokens}, candidate {tokens + 1}")
    import xml.etree.ElementTree as ET

    failures = [f.get("message") for f in ET.parse(reports / "junit.xml").getroot().iter("failure")]
    # one failing case per requirement row the scenario is filed under, each naming the rule
    assert failures and set(failures) == {f"steps.requests.{rid}.tokens at step {golden[seq]['step']}: oracle {tokens}, "
                                          f"candidate {tokens + 1}"}, failures


def test_log_lines_and_a_null_lookahead_are_bookkeeping_behind_a_scheduling_difference():
    """Where an engine is judged on vLLM's log lines and its config differs only there (or in
    num_lookahead_tokens without a drafter), the cell's headline is its steps' first divergence,
    and the reports say the config differs only in bookkeeping; a budget value stays the headline."""
    from conformance.judging.compare import compare_layer
    from conformance.judging.verdict import DIVERGED, Verdict
    from conformance.report.view import headline_of

    config = {"max_num_scheduled_tokens": 4036, "speculative_method": None, "num_lookahead_tokens": 0,
              "budget_log_lines": ["a"]}
    steps = compare_layer("steps", [{"step": 4, "requests": {"r1": {"tokens": 3}}}],
                          [{"step": 4, "requests": {"r1": {"tokens": 4}}}])
    quiet = compare_layer("config", [config], [dict(config, budget_log_lines=["b"], num_lookahead_tokens=2)])
    headline, bookkeeping = headline_of(Verdict("port", "s", DIVERGED, "candidate", [quiet, steps]))
    assert headline is steps and set(bookkeeping) == {"budget_log_lines", "num_lookahead_tokens"}
    budget = compare_layer("config", [config], [dict(config, max_num_scheduled_tokens=4096, budget_log_lines=["b"])])
    headline, bookkeeping = headline_of(Verdict("port", "s", DIVERGED, "candidate", [budget, steps]))
    assert headline is budget and bookkeeping == ()  # the seed's 4036 vs 4096 stays the headline
    drafter = dict(config, speculative_method="dflash", num_lookahead_tokens=15)
    lookahead = compare_layer("config", [drafter], [dict(drafter, num_lookahead_tokens=0)])
    assert headline_of(Verdict("port", "s", DIVERGED, "candidate", [lookahead, steps]))[0] is lookahead
    # null lookahead slots are 0 of them: equal where the oracle has 0, a difference elsewhere
    assert compare_layer("config", [config], [dict(config, num_lookahead_tokens=None)]).equal
    assert not compare_layer("config", [drafter], [dict(drafter, num_lookahead_tokens=None)]).equal
