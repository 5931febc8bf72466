"""The HTML report as a reader sees it: rendered by headless Chromium, checked for script
errors and for the elements a reviewer looks for.

Built from the committed goldens (no engine runs): on engine_dflash_gate the oracle and another
CPU engine pin, as a candidate, schedule under different token budgets (4036 and 4096). `make
report-check` also renders the report of a real run against the no-draft-reservation mutant
(VLLM_PARITY_REPORT names it). Skipped, with the reason, where chromium is not installed.
"""

import datetime as dt
import os
from pathlib import Path

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.judging.requirement_rows import apply_gate
from conformance.judging.verdict import CANDIDATE, ORACLE, judge
from conformance.report.report_files import write_reports
from conformance.report.view import gate_view
from tests.helpers import REPO
from tests.report.chromium import CHROMIUM, Elements, check_first_screen, render

PINS = load_pins()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (`make report-check` installs it)")


def check_page(page: Path, budgets: tuple[int, int]) -> Elements:
    dom, errors = render(page)
    assert errors == [], errors
    assert dom.having("body")[0][0].get("data-ready") == "1"  # the page's script ran to its end
    matrix = dom.having("table", "matrix")
    assert matrix and any(a.get("href", "").startswith("#s-") for a, _ in dom.having("a"))
    ids = {a.get("id") for _, a, _ in dom.found if a.get("id")}
    assert all(a["href"][1:] in ids for a, _ in dom.having("a") if a.get("href", "").startswith("#"))
    assert dom.having("svg", "plot-steps") and dom.having("svg", "plot-diff") and dom.having("svg", "plot-zoom")
    labels = [text for _, text in dom.having("text", "budget-label")]
    for budget in budgets:
        assert any(f"token budget {budget}" in label for label in labels), labels
    assert len(dom.having("polyline", "budget")) >= 2 and dom.having("polyline", "difference")
    assert dom.having("table", "per-request") and dom.having("tr", "differs")
    assert dom.having("table", "capacity")
    assert all(a.get("data-fits") == "1" for a, _ in dom.having("div", "scroll"))  # the zoom's table scrolls in its box
    values = [(float(a["y"]), text) for a, text in dom.having("text", "budget-value")]
    assert all(abs(y1 - y2) >= 12 for i, (y1, _) in enumerate(values) for y2, _ in values[i + 1:i + 2]), values
    return dom


def test_the_report_renders_with_budgets_difference_zoom_and_tables(tmp_path):
    name = "engine_dflash_gate"
    oracle = GOLDENS.load(name, PINS.oracle)
    other = next(r for r in PINS.releases if r != PINS.oracle and PINS.cpu_engine_build(r))
    candidate = GOLDENS.load(name, other)
    candidate.engine["label"] = f"vllm-{other}"
    verdicts = [judge(oracle, oracle, ORACLE), judge(candidate, oracle, CANDIDATE)]
    result = apply_gate(verdicts, {name: ("SPEC-DFLASH",)}, [], dt.date(2026, 11, 30))
    traces = {(v.engine, name): (t, oracle) for v, t in zip(verdicts, (oracle, candidate))}
    page = write_reports(tmp_path, gate_view(result, PINS.oracle, traces=traces))[2]
    dom = check_page(page, tuple(t.layers["engine_steps"][0]["token_budget"] for t in (oracle, candidate)))
    assert any("first divergence: step 0" in text for _, text in dom.having("text", "divergence"))
    assert any("4096 and 4036 are 3 px apart" in text for _, text in dom.having("text", "budget-note"))


def test_the_first_screen_of_a_40_scenario_gate_shows_what_failed(tmp_path):
    """Every library scenario's golden of another pin (one with a CPU engine, so it has every
    scenario's golden) judged as a candidate against the oracle's (the default gate: the
    production scale runs only when asked): the rows that did not pass come first, on the first
    screen of a 1366x768 window."""
    other = next(r for r in PINS.releases if r != PINS.oracle and PINS.cpu_engine_build(r))
    scenarios = [load_scenario(p) for p in (REPO / "scenarios").glob("*.json")]
    names = sorted(s.name for s in scenarios if s.scale != "production")
    verdicts, traces = [], {}
    for name in names:
        oracle = GOLDENS.load(name, PINS.oracle)
        candidate = GOLDENS.load(name, other)
        candidate.engine["label"] = f"vllm-{other}"
        for trace, role in ((candidate, CANDIDATE), (oracle, ORACLE)):
            verdicts.append(judge(trace, oracle, role))
            traces[verdicts[-1].key] = (trace, oracle)
    assert len(names) >= 40
    result = apply_gate(verdicts, {}, [], dt.date(2026, 11, 30))
    view = gate_view(result, PINS.oracle, traces=traces)
    failing = {c.verdict.scenario for c in view.failing()}
    assert failing and len(view.folded()) < len(names)  # the grid folds
    page = write_reports(tmp_path, view)[2]
    dom, errors = render(page)
    assert errors == []
    assert failing <= set(check_first_screen(dom))


@pytest.mark.skipif(not os.environ.get("VLLM_PARITY_REPORT"),
                    reason="VLLM_PARITY_REPORT is not set (`make report-check` sets it)")
def test_the_report_of_a_run_against_the_no_draft_reservation_mutant():
    dom = check_page(Path(os.environ["VLLM_PARITY_REPORT"]), (4036, 4096))
    check_first_screen(dom)
    assert any("no-draft-reservation" in text for _, text in dom.having("code"))
    assert any(text == "4147" for _, text in dom.having("td"))  # the drafter's pass over capacity
