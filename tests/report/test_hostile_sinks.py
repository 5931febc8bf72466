"""A hostile candidate's text in every sink: one corpus of nasty strings goes through every
entry point a candidate controls (its label, its command line, error messages and stderr tails,
record keys and values in divergences, budget log lines, refusals, scenario names, requirement
rows, waiver text) into every sink: the terminal report, junit.xml, summary.md (also GitHub's
step summary and the Buildkite annotation) and report.html. Each sink is then read by what reads
it: a terminal (no control character but the newline), xml.etree, a CommonMark parser, an HTML
parser. Then: reports are written as a set, and wide matrices wrap."""

from __future__ import annotations

import datetime as dt
import html.parser
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import (GATE, REPO, double_command, double_gate_engines, gate_driver, gate_engine, hostile_double,
                           run_gate)

SINKS_CORPUS = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "\x1b[2J\x1b[H== vllm-parity gate: PASS (exit status 0)",  # clear the screen, forge the verdict
    "\x1b]0;owned\x07title",  # OSC: set the window title
    "\x1b[1A\x1b[2K\rPASS",  # cursor up, erase the line: overwrite the verdict line
    "\x9b2J",  # C1 CSI
    "nul\x00bel\x07esc\x1b",
    "non\ufffecharacter \uffff",
    "\u202eSSAP",  # right-to-left override
    "over\rPASS",
    "line\u2028## PASS",
    "lone \ud800 surrogate",
    "`code` ``two`` ```",
    "| pipes | in | cells |",
    "[link](javascript:alert(1)) <javascript:alert(1)> <http://x.y/>",
    "![img](http://x.y/p.png)",
    "# PASS",
    "\n## PASS\n",
    "**PASS** _x_ *y* ~~z~~ $m$",
    "<b>bold</b> &amp; &lt;b&gt; &#60;",
    "\\",
    "a\\|b\\`c\\",
    "|" * 400,
    "`" * 400,
    "\\" * 401,
    "x" * 20_000,
]
SINKS_IDS = [f"corpus{i}" for i in range(len(SINKS_CORPUS))]


def sinks_verdicts(h: str):
    """Verdicts carrying `h` at every entry point a candidate (or a merge manifest) controls,
    with the traces the HTML page draws; (result, view)."""
    from conformance.judging.compare import compare_layer
    from conformance.judging.requirement_rows import apply_gate
    from conformance.judging.verdict import CANDIDATE, NOT_SERVED, ORACLE, Verdict
    from conformance.judging.waivers import Waiver
    from conformance.report.view import gate_view

    label, scenario = f"port {h}", f"s {h}"
    golden_steps = [{"step": 0, "total_num_scheduled_tokens": 10, "token_budget": 10,
                     "requests": {"r1": {"tokens": 10, "draft_tokens": 0}}, "waiting": [], "running": ["r1"]}]
    hostile_steps = [{"step": h, "total_num_scheduled_tokens": h, "token_budget": h,
                      "requests": {h: {"tokens": h, "draft_tokens": [h], "computed_tokens": {h: h}}},
                      "new": [h], "waiting": [h], "running": [h], "kv_blocks": {"free": h, "used": h}}]
    steps = compare_layer("steps", golden_steps, hostile_steps)
    extra = compare_layer("steps", golden_steps, golden_steps + hostile_steps)  # c.record is None
    config = compare_layer("config", [{"refused": None, "max_num_scheduled_tokens": 4036}],
                           [{"refused": {"type": h, "message": f"{h}\n{h}"}, h: h}])
    golden = {"layers": {"steps": golden_steps}}
    verdicts = [
        Verdict(label, scenario, "diverged", CANDIDATE, [config, steps], expected_lines=["set to 4036"],
                actual_lines=[h, f"{h}\n{h}"], not_judged={"engine_steps": NOT_SERVED}, judged=["config", "steps"]),
        Verdict(label, f"t {h}", "diverged", CANDIDATE, [extra]),
        Verdict(label, f"u {h}", "crash", CANDIDATE, message=f"exited (status 3); last stderr lines:\n{h}\n{h}"),
        Verdict("vllm-0.27.1", scenario, "pass", ORACLE, [compare_layer("steps", golden_steps, golden_steps)]),
        # records that are not objects: a string, a list
        Verdict(label, f"v {h}", "diverged", CANDIDATE, [compare_layer("steps", golden_steps, [h]),
                                                         compare_layer("outputs", [{"id": "r1"}], [[h]])]),
    ]
    traces = {verdicts[0].key: ({"layers": {"steps": hostile_steps}}, golden),
              verdicts[1].key: ({"layers": {"steps": golden_steps + hostile_steps}}, golden),
              verdicts[3].key: ({"layers": {"steps": golden_steps}}, golden),
              verdicts[4].key: ({"layers": {"steps": [h, [h], None]}}, golden)}
    today = dt.date(2026, 12, 1)
    waivers = [Waiver(h, h, h, h, h, dt.date(2027, 1, 1)),  # unused
               Waiver(h, scenario, h, h, h, dt.date(2026, 1, 1))]  # expired
    rows = {scenario: (f"ROW {h}",), f"t {h}": (h,), f"u {h}": ("ENG-SCHED-CORE",), f"v {h}": (h,)}
    result = apply_gate(verdicts, rows, waivers, today)
    return gate_view(result, "0.27.1", {label: f"./port --flag {h}"}, traces)


def sinks_terminal_safe(text: str) -> None:
    """What a terminal shows as the candidate wrote it: nothing but printable characters and
    newlines, and the gate's own verdict line once, first."""
    bad = sorted({c for line in text.split("\n") for c in line if not c.isprintable()})
    assert not bad, f"raw control or format characters reach the terminal: {bad!r}"
    verdict_lines = [line for line in text.split("\n") if line.startswith("== vllm-parity gate")]
    assert len(verdict_lines) == 1 and text.startswith(verdict_lines[0]), verdict_lines


@pytest.mark.parametrize("h", SINKS_CORPUS, ids=SINKS_IDS)
def test_sinks_the_terminal_report_shows_control_characters_escaped(h):
    from conformance.report.render_text import render_gate, render_requirement_rows
    from conformance.report.view import visible

    view = sinks_verdicts(h)
    text = render_gate(view) + "\n" + render_requirement_rows(view)
    sinks_terminal_safe(text)
    assert visible(h)[:60] in text  # the candidate's text is there, shown, not obeyed


@pytest.mark.parametrize("h", SINKS_CORPUS, ids=SINKS_IDS)
def test_sinks_junit_parses_and_holds_no_control_character(h):
    from conformance.report.render_ci import junit
    from conformance.report.view import visible

    text = junit(sinks_verdicts(h))
    root = ET.fromstring(text.encode("utf-8"))  # raises on NUL, ESC, U+FFFE, a lone surrogate
    said = [root.text or ""] + [s for e in root.iter() for s in [e.text or "", e.tail or "", *e.attrib.values()]]
    bad = sorted({c for s in said for line in s.split("\n") for c in line if not c.isprintable()})
    assert not bad, bad
    assert any(visible(h)[:60] in s for s in said)


SINKS_MD_HEADINGS = ("What to fix: first divergences", "The grid", "Drift across pins and per-pin tables")


def sinks_markdown_safe(text: str) -> list:
    """summary.md as a CommonMark (GFM tables, strikethrough) reader sees it: the gate's one
    heading, no HTML, link, image or emphasis from the candidate, no raw control character;
    its tokens."""
    from markdown_it import MarkdownIt

    bad = sorted({c for line in text.split("\n") for c in line if not c.isprintable()})
    assert not bad, bad
    tokens = MarkdownIt("commonmark").enable(["table", "strikethrough"]).parse(text)
    headings = [(t.tag, sinks_md_shown(tokens[i + 1])) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings[0][0] == "h2" and headings[0][1].startswith("vllm-parity gate: "), headings
    assert set(headings[1:]) <= {("h3", h) for h in SINKS_MD_HEADINGS}, headings  # the gate's own, no other
    kinds = [c.type for t in tokens for c in [t, *(t.children or [])]]
    for kind in ("html_inline", "html_block", "link_open", "image", "s_open", "em_open"):
        assert kind not in kinds, kind
    assert kinds.count("strong_open") == text.count("- **expired waiver** ")  # the gate's own bold
    fenced = re.sub(r"(?ms)^(`{3,})text\n.*?^\1$", "", text)  # a fenced block is text: no math, no markup
    outside_code = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", fenced)
    assert "$" not in outside_code.replace("\\$", "")  # GitHub's math
    return tokens


def sinks_md_shown(token) -> str:
    return "".join(c.content for c in token.children if c.type in ("text", "code_inline"))


def sinks_markdown_read(text: str, view) -> None:
    """sinks_markdown_safe, and every table row whole: each name shown as the candidate wrote
    it (escaped, not obeyed), in its own cell."""
    from conformance.report.view import visible

    tokens = sinks_markdown_safe(text)
    headings = [sinks_md_shown(tokens[i + 1]) for i, t in enumerate(tokens) if t.type == "heading_open"]
    # the gate's own headings only: its title, then what to fix (when something failed) and the grid
    assert headings[0] == f"vllm-parity gate: {view.explained}" and headings[-1] == "The grid", headings
    assert headings[1:-1] in ([], ["What to fix: first divergences"]), headings
    inline = [t for t in tokens if t.type == "inline"]
    # tables: the grid's rows are the scenarios, the failures' rows the cells that did not pass
    rows = [[sinks_md_shown(t) for t in inline if t.map and t.map[0] == line]
            for line in sorted({t.map[0] for t in inline if t.map})]
    cells_of = {r[0]: r for r in rows if len(r) > 1}
    for s in view.scenarios:
        assert visible(s)[:300] in cells_of, (s, list(cells_of))
        assert len(cells_of[visible(s)[:300]]) in (1 + len(view.engines), 6, 9)
    engines = {visible(e)[:300] for e in view.engines}
    failing = [r for r in rows if len(r) == 6 and r[0] != "row"]
    assert failing and all(r[2] in engines for r in failing), failing


@pytest.mark.parametrize("h", SINKS_CORPUS, ids=SINKS_IDS)
def test_sinks_summary_md_read_by_a_commonmark_parser_has_only_the_gates_heading(h):
    from conformance.report.render_ci import markdown

    view = sinks_verdicts(h)
    sinks_markdown_read(markdown(view), view)


class SinksElements(html.parser.HTMLParser):
    """Every start tag of a page with its attributes, and its text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


SINKS_HTML_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "table", "tr", "th",
                   "td", "code", "br", "a", "section", "svg", "line", "text", "polyline", "circle",
                   "clippath", "rect", "g", "details", "summary", "pre", "caption", "i", "script", "ul", "li", "div"}


def sinks_html_read(page: str) -> SinksElements:
    """report.html as a browser parses it: the page's own script only, its own tags only, no
    event handler, no link off the page, the candidate's text visible and not obeyed."""
    assert page.lower().count("<script") == 1, "a raw <script from candidate data"
    dom = SinksElements()
    dom.feed(page)
    dom.close()
    assert {tag for tag, _ in dom.tags} <= SINKS_HTML_TAGS, {tag for tag, _ in dom.tags} - SINKS_HTML_TAGS
    assert not [(tag, a) for tag, attrs in dom.tags for a in attrs if a.startswith("on")]
    assert all(attrs["href"].startswith("#") for tag, attrs in dom.tags if "href" in attrs)
    assert all(re.fullmatch(r"[a-z_ -]*", attrs.get("class") or "") for _, attrs in dom.tags)
    bad = sorted({c for s in dom.text for line in s.split("\n") for c in line if not c.isprintable()})
    assert not bad, bad
    return dom


@pytest.mark.parametrize("h", SINKS_CORPUS, ids=SINKS_IDS)
def test_sinks_report_html_escapes_every_interpolation(h):
    from conformance.report.render_html import html_report
    from conformance.report.view import visible

    dom = sinks_html_read(html_report(sinks_verdicts(h)))
    text = "".join(dom.text)
    assert visible(h)[:60] in text
    # the requirement row (a merge manifest's), a step value and a per-request caption
    assert f"ROW {visible(h)}"[:60] in text and f"every request at step {visible(h)}"[:60] in text


# Reports are written as a set: a run claims its folder and removes the reports an earlier run
# left there (and the parts a killed run left) before anything else, so no report of the
# folder can say PASS while another of the same folder says FAIL.

SINKS_REPORTS = ("junit.xml", "summary.md", "report.html", "annotation.md")


def sinks_earlier_run(folder: Path) -> Path:
    """A folder holding an earlier run's reports, all PASS, and the part a kill -9 left."""
    folder.mkdir(parents=True)
    for name in SINKS_REPORTS:
        (folder / name).write_text("vllm-parity gate: PASS\n", encoding="utf-8")
    part = folder / ".junit.xml.4242.part"
    part.write_text("<testsuites name='vllm-parity'", encoding="utf-8")
    return part


def sinks_left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != ".parity-reports.lock")


def test_sinks_a_merge_that_fails_leaves_no_report_of_the_earlier_run(tmp_path, monkeypatch, capsys):
    from conformance import cli

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    folder = tmp_path / "reports"
    sinks_earlier_run(folder)
    status = cli.main(["merge", str(tmp_path / "not-a-shard"), "--waivers", "/dev/null", "--reports", str(folder)])
    assert status == 2 and "not a shard's results folder" in capsys.readouterr().err
    assert sinks_left(folder) == []  # nothing that still says PASS, no part


def test_sinks_a_crash_while_reporting_leaves_no_mixed_set(tmp_path, monkeypatch):
    """A renderer that fails after others rendered: no report is written rather than junit.xml
    and summary.md of this run beside report.html and annotation.md of the earlier one."""
    from conformance.report import report_files

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    folder = tmp_path / "reports"
    sinks_earlier_run(folder)

    def crash(view):
        raise RuntimeError("a renderer failed")

    monkeypatch.setattr(report_files, "html_report", crash)
    with pytest.raises(RuntimeError, match="a renderer failed"):
        run_gate(double_gate_engines("--steps", "1"), folder)
    assert sinks_left(folder) == []
    monkeypatch.undo()
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    status, _ = run_gate(double_gate_engines("--steps", "1"), folder)  # the next run: the whole set
    assert status == 1 and sinks_left(folder) == sorted(SINKS_REPORTS)
    assert all("FAIL" in (folder / name).read_text(encoding="utf-8") for name in SINKS_REPORTS[1:])
    assert ET.parse(folder / "junit.xml").getroot().find(".//failure") is not None


# Ten candidates: the grid wraps into grids of at most GRID_WIDTH columns, each column named by
# a short code (C1..C10) with a legend, and the "judged on" block is said once for all of them.

def sinks_ten_candidates():
    from conformance.judging.compare import compare_layer
    from conformance.judging.requirement_rows import apply_gate
    from conformance.judging.verdict import CANDIDATE, NOT_ASKED, ORACLE, Verdict
    from conformance.report.view import gate_view

    scenarios = ["steady_decode", "kv_pressure", "prefill_budget_binds"]
    labels = [f"port-engine-build-{i} 1.0.{i}" for i in range(1, 11)]
    steps = compare_layer("steps", [{"step": 0, "requests": {"r1": {"computed_tokens": 3}}}],
                          [{"step": 0, "requests": {"r1": {"computed_tokens": 4}}}])
    verdicts = []
    for label in labels:
        for i, s in enumerate(scenarios):
            kind = "pass" if i == 0 else "diverged"
            verdicts.append(Verdict(label, s, kind, CANDIDATE, [steps] if kind == "diverged" else [],
                                    judged=["config", "steps", "outputs"],
                                    not_judged={"engine_steps": NOT_ASKED, "engine_outputs": NOT_ASKED}))
    verdicts += [Verdict("vllm-0.27.1", s, "pass", ORACLE) for s in scenarios]
    result = apply_gate(verdicts, {s: ("ENG-SCHED-CORE",) for s in scenarios}, [])
    return gate_view(result, "0.27.1", {label: f"./build/port --variant {label.split()[0]}" for label in labels})


def test_sinks_ten_candidates_wrap_into_grids_with_a_legend_and_one_judged_on_block():
    from conformance.report.render_text import GRID_WIDTH, render_gate

    view = sinks_ten_candidates()
    lines = render_gate(view).splitlines()
    summary = next(i for i, line in enumerate(lines) if line.startswith(f"-- {len(view.verdicts)} verdicts"))
    wide = [line for line in lines[1:summary] if not line.startswith("   ") and len(line) > GRID_WIDTH]
    assert not wide, f"{len(wide)} grid lines wider than {GRID_WIDTH} columns, up to {max(map(len, wide))}"
    legend = {line.split(" = ")[0].strip(): line.split(" = ", 1)[1] for line in lines[1:summary] if " = " in line}
    codes = {}  # code -> engine label
    for e in view.engines:
        code = next((c for c, said in legend.items() if said.startswith(f"{e} ({view.roles[e]})")), None)
        assert code, f"no legend line names {e}"
        codes[code] = e
    assert len(codes) == len(view.engines) == 11
    assert all(f"command {view.commands[e]}" in legend[c] for c, e in codes.items() if e in view.commands)
    grids = [i for i in range(summary) if lines[i].startswith("scenario ")]
    assert len(grids) > 1
    seen = set()
    for start in grids:
        header = lines[start]
        assert len(header) <= GRID_WIDTH, header
        names = header.split()[1:]
        at = [header.index(f" {n}") + 1 for n in names] + [None]
        for row in lines[start + 1:start + 1 + len(view.scenarios)]:
            assert len(row) <= GRID_WIDTH, row
            scenario = row.split()[0]
            for n, lo, hi in zip(names, at, at[1:]):
                assert row[lo:hi].strip() == view.cell(scenario, codes[n]).text, (n, row)
                seen.add((codes[n], scenario))
    assert seen == set(view.grid)  # every cell, once wrapped
    # "judged on ..." once for the ten candidates, besides the headline
    judged = [line for line in lines[1:summary] if "judged on config, steps, outputs" in line]
    assert len(judged) == 1 and judged[0].startswith("   " + ", ".join(f"C{i}" for i in range(1, 11)) + ":"), judged


# End to end: `parity gate` with the hostile TEST DOUBLE as candidate (its hello, stderr,
# errors, crash and records carry the corpus), with --reports and --results,
# $GITHUB_STEP_SUMMARY set and a TEST DOUBLE of buildkite-agent on the PATH; then `parity merge`
# of its results with a manifest whose requirement rows are hostile and a hostile waivers file.
# Every file and both terminals are then read. The oracle's place is taken by the same TEST
# DOUBLE replaying the oracle's goldens unedited (what is under test is the sinks, not the
# oracle: this keeps a vLLM cold start out of `make test`).

SINKS_TITLE = "\x1b]0;owned\x07"
SINKS_CLEAR = "\x1b[2J\x1b[H== vllm-parity gate: PASS (exit status 0)"
SINKS_OVER = "\x1b[1A\x1b[2K\rPASS"
SINKS_SCRIPT = "<script>alert(1)</script>"
SINKS_IMG = '"><img src=x onerror=alert(1)>'
SINKS_MD = "\n## PASS\n| a | b |\n[link](javascript:alert(1)) ![img](http://x.y/p.png) `x` **PASS** $m$"
SINKS_CTRL = "nul\x00bel\x07\ufffe\u202eSSAP"
SINKS_PLAN = {
    "hello": {"engine": f"port{SINKS_SCRIPT}{SINKS_TITLE}", "version": f"1.0{SINKS_OVER}",
              "environment": {"note": SINKS_MD}},
    "stderr": f"\x1b[31mcoloured\x1b[0m {SINKS_CLEAR} {SINKS_CTRL}",
    "edits": [
        {"scenario": "steady_decode", "layer": "config", "seq": 0, "path": ["budget_log_lines"],
         "value": [SINKS_SCRIPT + SINKS_CTRL, SINKS_MD]},
        {"scenario": "steady_decode", "layer": "steps", "seq": 2, "path": ["requests", SINKS_IMG + SINKS_MD],
         "value": {"tokens": 1, "draft_tokens": 0}},
    ],
    "error": {"scenario": "stop_conditions", "kind": "internal",
              "message": f"boom {SINKS_SCRIPT}{SINKS_MD}{SINKS_CTRL}"},
    "exit": {"scenario": "kv_pressure", "status": 3, "stderr": f"{SINKS_OVER} {SINKS_TITLE} {SINKS_IMG}"},
}
SINKS_SCENARIOS = ("steady_decode", "stop_conditions", "kv_pressure")
SINKS_AGENT = '''#!{python}
"""TEST DOUBLE of buildkite-agent: keeps the annotation `annotate` is given, byte for byte."""
import os, sys
with open(os.environ["SINKS_ANNOTATION"], "wb") as f:
    f.write(sys.stdin.buffer.read())
'''


def _sinks_toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's


@pytest.fixture(scope="module")
def sinks_runs(tmp_path_factory):
    """The hostile gate, then the hostile merge: for each, its exit status, stdout, stderr,
    reports folder, step summary and the annotation buildkite-agent was handed."""
    from conformance.gate.plan import digest

    tmp = tmp_path_factory.mktemp("sinks")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "buildkite-agent"
    agent.write_text(SINKS_AGENT.format(python=sys.executable), encoding="utf-8")
    agent.chmod(0o755)
    parity = str(Path(sys.executable).with_name("parity"))
    oracle, candidate = hostile_double(tmp, "oracle", {}), hostile_double(tmp, "candidate", SINKS_PLAN)
    waivers = tmp / "waivers.toml"
    waivers.write_text("".join(
        f"[[waiver]]\nrow = {_sinks_toml('ROW ' + h)}\nscenario = {_sinks_toml(h)}\nfield = {_sinks_toml(h)}\n"
        f"reason = {_sinks_toml(h)}\nowner = {_sinks_toml(h)}\nexpires = {expires}\n\n"
        for h, expires in ((SINKS_SCRIPT + SINKS_MD + SINKS_CTRL, "2099-01-01"),
                           (SINKS_IMG + SINKS_CLEAR + SINKS_TITLE, "2020-01-01"))), encoding="utf-8")

    def run(name: str, command: list[str], *argv: str) -> dict:
        summary, annotation = tmp / f"{name}-step-summary.md", tmp / f"{name}-annotation.md"
        env = dict(os.environ, GITHUB_STEP_SUMMARY=str(summary), BUILDKITE="true",
                   SINKS_ANNOTATION=str(annotation), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        done = subprocess.run([*command, *argv, "--reports", str(tmp / name)], capture_output=True,
                                     env=env, cwd=REPO, timeout=900)
        return {"status": done.returncode, "out": done.stdout.decode("utf-8"), "err": done.stderr.decode("utf-8"),
                "reports": tmp / name, "summary": summary, "annotation": annotation}

    scenarios = [a for s in SINKS_SCENARIOS for a in ("--scenario", str(REPO / "scenarios" / f"{s}.json"))]
    gate = run("gate", gate_driver(oracle, candidate), "gate", *scenarios,
               "--waivers", "/dev/null", "--results", str(tmp / "results"))
    # a merge manifest's requirement rows are the merger's to read: make them hostile
    manifest = json.loads((tmp / "results" / "manifest.json").read_text(encoding="utf-8"))
    for scenario in manifest["scenarios"]:
        scenario["rows"] = [f"ROW {SINKS_SCRIPT}{SINKS_MD}{SINKS_TITLE}"]
    manifest["scenario_set"] = digest(manifest["scenarios"])
    (tmp / "results" / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    merge = run("merge", [parity], "merge", str(tmp / "results"), "--waivers", str(waivers))
    return {"gate": gate, "merge": merge}


SINKS_RUNS = pytest.mark.parametrize("run", ["gate", "merge"])
sinks_e2e = pytest.mark.xdist_group("h28-sinks-e2e")  # one process runs the fixture's gate once


@sinks_e2e
@SINKS_RUNS
def test_sinks_e2e_the_terminal_shows_the_hostile_candidate_escaped(sinks_runs, run):
    r = sinks_runs[run]
    assert r["status"] in (1, 2) and "Traceback" not in r["err"], r["err"][-3000:]
    sinks_terminal_safe(r["out"])
    bad = sorted({c for line in r["err"].split("\n") for c in line if not c.isprintable()})
    assert not bad, f"the log passes {bad!r} to the terminal"
    assert not [line for line in r["err"].split("\n") if line.startswith("== vllm-parity gate")]
    assert "port<script>alert(1)</script>\\x1b]0;owned\\x07" in r["out"]  # the label, shown, not obeyed
    assert "nul\\x00bel\\x07\\ufffe\\u202eSSAP" in r["out"]  # from the stderr tail or a record


@sinks_e2e
@SINKS_RUNS
def test_sinks_e2e_junit_parses(sinks_runs, run):
    root = ET.parse(sinks_runs[run]["reports"] / "junit.xml").getroot()
    said = [s for e in root.iter() for s in [e.text or "", *e.attrib.values()]]
    bad = sorted({c for s in said for line in s.split("\n") for c in line if not c.isprintable()})
    assert not bad, bad
    assert any("<script>" in s for s in said)  # the candidate's text is there, as text


@sinks_e2e
@SINKS_RUNS
def test_sinks_e2e_summary_step_summary_and_annotation_are_the_same_safe_markdown(sinks_runs, run):
    r = sinks_runs[run]
    text = (r["reports"] / "summary.md").read_text(encoding="utf-8")
    assert r["summary"].read_text(encoding="utf-8") == text  # $GITHUB_STEP_SUMMARY
    assert (r["reports"] / "annotation.md").read_text(encoding="utf-8") == text
    assert r["annotation"].read_text(encoding="utf-8") == text  # what buildkite-agent annotate got
    sinks_markdown_safe(text)


@sinks_e2e
@SINKS_RUNS
def test_sinks_e2e_report_html_holds_no_raw_script_from_the_candidate(sinks_runs, run):
    page = (sinks_runs[run]["reports"] / "report.html").read_text(encoding="utf-8")
    dom = sinks_html_read(page)
    text = "".join(dom.text)
    assert SINKS_SCRIPT in text and "onerror=alert(1)" in text  # shown as text
    if run == "merge":
        assert f"ROW {SINKS_SCRIPT}" in text  # the manifest's requirement row, as text


def test_sinks_the_log_shows_a_crashing_engines_stderr_escaped(tmp_path):
    """`parity run` logs a failure's message, the engine's last stderr lines in it: the log,
    the terminal's other sink, escapes them as the report does."""
    crash = {"exit": {"status": 3, "stderr": f"{SINKS_CLEAR}{SINKS_TITLE}{SINKS_CTRL}"}}
    engine = hostile_double(tmp_path, "crash", crash)
    done = subprocess.run([str(Path(sys.executable).with_name("parity")), "run", "--engine", engine,
                                  "--scenario", str(REPO / "scenarios" / "steady_decode.json"),
                                  "--layers", "config", "--out", str(tmp_path / "trace.json")],
                                 capture_output=True, timeout=300, cwd=REPO)
    err = done.stderr.decode("utf-8")
    assert done.returncode == 2 and "parity run: crash:" in err, err
    bad = sorted({c for line in err.split("\n") for c in line if not c.isprintable()})
    assert not bad, f"the log passes {bad!r} to the terminal"
    assert "\\x1b[2J\\x1b[H== vllm-parity gate: PASS" in err


def test_sinks_a_shards_report_shows_an_engine_error_escaped(tmp_path):
    """A shard prints each unit that did not pass with its first line: the candidate's error
    message, escaped."""
    error = {"error": {"kind": "internal", "message": f"{SINKS_CLEAR}{SINKS_CTRL}"}}
    hostile = hostile_double(tmp_path, "error", error)
    oracle = double_command("--steps", "3")
    engines = [gate_engine(oracle, "oracle"),
               gate_engine("hostile=" + hostile, "candidate")]
    status, text = run_gate(engines, None, scenarios=(GATE,), shard=(1, 1), results=tmp_path / "r")
    assert status == 0 and "hostile / dflash_27b_gate / config: engine_error" in text, text
    bad = sorted({c for line in text.split("\n") for c in line if not c.isprintable()})
    assert not bad, f"the shard's report passes {bad!r} to the terminal"
    assert "\\x1b[2J\\x1b[H== vllm-parity gate: PASS" in text
