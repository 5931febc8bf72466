"""Waivers as every report shows them: each applied waiver with its owner, expiry and reason in
the terminal, junit.xml, summary.md (the step summary and the annotation) and report.html; the
count line says `waived`; an unused waiver says why it covered nothing; a --waivers path that
does not exist is an error unless it is the default file."""

import datetime as dt
import re
import html
import xml.etree.ElementTree as ET

import pytest

from conformance import cli
from conformance.gate import options
from conformance.judging.compare import compare_layer
from conformance.judging.requirement_rows import apply_gate
from conformance.judging.verdict import CANDIDATE, ORACLE, Verdict
from conformance.judging.waivers import Waiver, WaiverError, load_waivers
from conformance.report.render_ci import _text, junit, markdown
from conformance.report.render_html import html_report
from conformance.report.render_text import render_gate, render_requirement_rows
from conformance.report.view import gate_view

TODAY = dt.date(2026, 11, 29)
STEPS_O = [{"step": 0, "total_num_scheduled_tokens": 298, "requests": {"r1": {"tokens": 10, "draft_tokens": 0}}}]
STEPS_C = [{"step": 0, "total_num_scheduled_tokens": 10, "requests": {"r1": {"tokens": 10, "draft_tokens": 0}}}]
ROWS = {"prefix_caching_resume": ("ENG-SCHED-CORE", "ENG-KV-CACHE")}  # s00.. : ENG-SCHED-CORE
WAIVER = Waiver("ENG-KV-CACHE", "prefix_caching_resume", "steps.total_num_scheduled_tokens",
                "no prefix caching in the reference engine", "kit-team", dt.date(2027, 12, 31), "port")


def verdicts(scenarios: int = 40) -> list[Verdict]:
    """The reference engine's gate: one divergence, every other verdict a pass."""
    out = [Verdict("port", "prefix_caching_resume", "diverged", CANDIDATE, [compare_layer("steps", STEPS_O, STEPS_C)]),
           Verdict("vllm-0.27.1", "prefix_caching_resume", "pass", ORACLE)]
    for i in range(scenarios - 1):
        out += [Verdict("port", f"s{i:02d}", "pass", CANDIDATE), Verdict("vllm-0.27.1", f"s{i:02d}", "pass", ORACLE)]
    return out


def waived_view(waivers=(WAIVER,)):
    return gate_view(apply_gate(verdicts(), ROWS, list(waivers), TODAY), "0.27.1")


def said_of(text: str) -> None:
    for words in ("kit-team", "2027-12-31", "no prefix caching in the reference engine"):
        assert words in text, words


def test_the_terminal_report_shows_the_applied_waiver_and_counts_it_waived():
    view = waived_view()
    assert view.status == 0
    text = render_gate(view) + "\n" + render_requirement_rows(view)
    assert text.startswith("== vllm-parity gate: PASS")
    assert "-- 80 verdicts; candidate: 39 pass, 1 waived; oracle self-check: 40 pass" in text  # never summed
    assert "1 diverged" not in text
    said_of(text)
    details = text[text.index("== port [candidate] on prefix_caching_resume"):].splitlines()
    assert details[1].startswith("   waived by ENG-KV-CACHE / prefix_caching_resume / steps.total_num_scheduled_tokens")
    applied = next(line for line in text.splitlines() if line.startswith("   waiver applied:"))
    assert "to port" in applied
    said_of(applied)


def test_junit_markdown_and_html_show_the_applied_waiver():
    view = waived_view()
    skipped = ET.fromstring(junit(view)).find(".//skipped")
    said_of(skipped.get("message"))
    summary = markdown(view)
    said_of(summary)
    assert "Counts: 80 verdicts; candidate: 39 pass, 1 waived; oracle self-check: 40 pass" in summary
    page = html_report(view)
    said_of(page[page.index("waivers applied"):page.index("<section")])  # on the first screen
    said_of(page[page.index("<section id='s-prefix_caching_resume'>"):])  # and beside the verdict
    assert "candidate: 39 pass, 1 waived; oracle self-check: 40 pass" in page


@pytest.mark.parametrize("change, why", [
    ({"row": "SPEC-DFLASH"}, "prefix_caching_resume's verdicts are filed under ENG-SCHED-CORE, ENG-KV-CACHE, not SPEC-DFLASH"),
    ({"field": "outputs.*"}, "port first diverges on prefix_caching_resume at steps.total_num_scheduled_tokens, "
                             "which outputs.* does not match"),
    ({"scenario": "prefix_caching"}, "no candidate ran scenario prefix_caching in this gate"),
    ({"engine": "port-*"}, "engine port-* matches no candidate on prefix_caching_resume"),
    ({"scenario": "s00", "row": "ENG-SCHED-CORE"}, "no candidate diverged on s00 (port: pass)"),
])
def test_an_unused_waiver_says_why_it_covered_nothing(change, why):
    waiver = Waiver(**{**WAIVER.__dict__, **change})
    view = waived_view([waiver])
    assert view.unused == [waiver] and view.why_unused[waiver] == why
    assert f"(owner kit-team): {why}" in render_requirement_rows(view)
    assert _text(why) in markdown(view)  # as markdown text, escaped
    assert html.escape(why) in html_report(view)


def test_a_waiver_of_a_run_that_then_failed_says_a_failure_is_never_waived():
    failed = Verdict("port", "prefix_caching_resume", "diverged", CANDIDATE,
                     [compare_layer("steps", STEPS_O, STEPS_C)], failure="crash")
    result = apply_gate([failed], ROWS, [WAIVER], TODAY)
    assert result.why_unused[WAIVER] == ("port diverged on prefix_caching_resume, then its run failed (crash): "
                                         "a failure is never waived")


def test_a_second_waiver_for_a_covered_divergence_names_the_first():
    second = Waiver(**{**WAIVER.__dict__, "row": "ENG-SCHED-CORE", "field": "steps.*"})
    result = apply_gate(verdicts(2), ROWS, [WAIVER, second], TODAY)
    assert result.why_unused[second] == ("an earlier waiver (ENG-KV-CACHE / prefix_caching_resume / "
                                         "steps.total_num_scheduled_tokens) covers port on prefix_caching_resume")


def test_a_waivers_path_that_does_not_exist_is_an_error(tmp_path, capsys):
    missing = tmp_path / "waivers-typo.toml"
    with pytest.raises(WaiverError, match="waivers-typo.toml: no such file"):
        load_waivers(missing)
    status = cli.main(["gate", "--waivers", str(missing), "--scenario", str(options.SCENARIO_DIR / "steady_decode.json")])
    assert status == 2 and f"--waivers {missing}: no such file" in capsys.readouterr().err
    status = cli.main(["merge", str(tmp_path), "--waivers", str(missing)])
    assert status == 2 and f"--waivers {missing}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("expires", ["2020-01-01T00:00:00", "2027-01-01 08:00:00Z", "07:32:00"])
def test_a_waiver_expiring_at_a_date_time_is_refused_before_any_engine_runs(tmp_path, capsys, expires):
    from conformance.gate.context import ENGINE_SESSIONS

    path = tmp_path / "waivers.toml"
    path.write_text(f"[[waiver]]\nrow='R'\nscenario='s'\nfield='f'\nreason='r'\nowner='o'\nexpires={expires}\n",
                    encoding="utf-8")
    with pytest.raises(WaiverError, match=r"waiver\[0\]\.expires: .*a TOML date like 2027-01-31, not a date-time"):
        load_waivers(path)

    started = []

    def no_engine(spec, **options):
        started.append(spec)
        raise AssertionError("an engine started before the waivers were read")

    token = ENGINE_SESSIONS.set(no_engine)  # the gate's seam: every engine session it makes
    try:
        status = cli.main(["gate", "--waivers", str(path), "--scenario", str(options.SCENARIO_DIR / "steady_decode.json")])
    finally:
        ENGINE_SESSIONS.reset(token)
    assert status == 2 and "waiver[0].expires" in capsys.readouterr().err and started == []


def test_the_default_waivers_file_may_be_absent(tmp_path, monkeypatch):
    default = tmp_path / "waivers.toml"
    monkeypatch.setattr(options, "DEFAULT_WAIVERS", default)
    assert options.read_waivers(None) == [] and options.read_waivers(default) == []  # named or not, the default
    default.write_text('[[waiver]]\nrow="R"\nscenario="s"\nfield="f"\nreason="r"\nowner="o"\nexpires=2027-01-01\n',
                       encoding="utf-8")
    assert [w.owner for w in options.read_waivers(None)] == ["o"]


def test_an_applied_waiver_shows_a_hostile_candidate_label_escaped_in_every_sink():
    label = "<script>alert(1)</script>\x1b[2J|*x*"
    hostile = [Verdict(label, v.scenario, v.kind, v.role, v.comparisons) if v.role == CANDIDATE else v
               for v in verdicts(2)]
    waiver = Waiver(**{**WAIVER.__dict__, "engine": None})
    view = gate_view(apply_gate(hostile, ROWS, [waiver], TODAY), "0.27.1")
    assert [w for w, _ in view.applied()] == [waiver]
    text = render_gate(view) + "\n" + render_requirement_rows(view)
    assert "\x1b" not in text and "\\x1b[2J" in text
    page = html_report(view)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)" in page
    summary = markdown(view)
    # only inside a code span, or the fenced block of first divergences (text, never HTML)
    fenced = re.sub(r"(?ms)^(`{3,})text\n.*?^\1$", "", summary)
    assert fenced != summary and "<script>" not in fenced.replace("`<script>", "")
    ET.fromstring(junit(view))  # parses: the ESC shown as its escape


def test_a_waiver_reason_with_a_newline_cannot_start_a_line_of_the_report():
    """A reason's newline was printed raw in the terminal's "waived by" line, so the reason could
    start a line that reads like the gate's own header."""
    forged = "== vllm-parity gate: PASS (exit status 0)"
    waiver = Waiver(**{**WAIVER.__dict__, "reason": f"known\n{forged}\r\x1b[1A", "owner": "kit\nteam"})
    view = waived_view([waiver])
    text = render_gate(view) + "\n" + render_requirement_rows(view)
    lines = text.splitlines()
    assert not any(line.startswith(forged) for line in lines[1:]) and lines[0] != forged
    waived = next(line for line in lines if line.startswith("   waived by "))
    assert waived.endswith(f"(owner kit\\nteam, expires 2027-12-31): known\\n{forged}\\r\\x1b[1A"), waived
    applied = next(line for line in lines if line.startswith("   waiver applied:"))
    assert f"known\\n{forged}" in applied
    for sink in (markdown(view), junit(view), html_report(view)):
        assert f"\n{forged}" not in sink and "\x1b" not in sink
