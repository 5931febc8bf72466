"""The release gate: rows, waivers (expired fails, unused reported), exit status, reports."""

import datetime as dt
import xml.etree.ElementTree as ET

import pytest

from conformance.judging.compare import compare_layer
from conformance.judging.requirement_rows import apply_gate
from conformance.judging.verdict import Verdict
from conformance.judging.waivers import WaiverError, load_waivers
from conformance.report.report_files import write_reports
from conformance.report.view import gate_view

TODAY = dt.date(2026, 11, 29)
STEPS_O = [{"step": i, "total_num_scheduled_tokens": 4036 if i < 3 else 100,
            "requests": {"r1": {"tokens": 1036, "draft_tokens": 0}}} for i in range(10)]
STEPS_C = [dict(s, total_num_scheduled_tokens=4096 if i < 3 else 100) for i, s in enumerate(STEPS_O)]
STEPS_C[0] = dict(STEPS_C[0], requests={"r1": {"tokens": 1096, "draft_tokens": 0}})


def diverged(engine="port", scenario="prefill_budget_binds", role="candidate"):
    return Verdict(engine, scenario, "diverged", role, [compare_layer("steps", STEPS_O, STEPS_C)])


def waiver_file(tmp_path, expires="2027-01-31", field="steps.requests.*.tokens", extra=""):
    path = tmp_path / "waivers.toml"
    path.write_text(f'''
[[waiver]]
row = "ENG-SCHED-CORE"
scenario = "prefill_budget_binds"
field = "{field}"
reason = "port lacks the drafting reservation"
owner = "port-team"
expires = {expires}
{extra}''')
    return path


ROWS = {"prefill_budget_binds": ("ENG-SCHED-CORE", "SPEC-DFLASH"), "method_matrix": ("SPEC-DFLASH",)}


def test_unwaived_divergence_fails_and_a_waiver_passes(tmp_path):
    assert apply_gate([diverged()], ROWS, [], TODAY).status == 1
    result = apply_gate([diverged()], ROWS, load_waivers(waiver_file(tmp_path)), TODAY)
    assert result.status == 0 and len(result.waived) == 1 and not result.unused


def test_expired_waiver_fails_the_gate(tmp_path):
    result = apply_gate([diverged()], ROWS, load_waivers(waiver_file(tmp_path, "2026-11-01")), TODAY)
    assert result.status == 1 and result.expired and not result.waived


def test_unused_waiver_is_reported(tmp_path):
    result = apply_gate([], ROWS, load_waivers(waiver_file(tmp_path, field="config.*")), TODAY)
    assert result.status == 0 and len(result.unused) == 1


def test_waiver_for_another_field_does_not_apply(tmp_path):
    result = apply_gate([diverged()], ROWS, load_waivers(waiver_file(tmp_path, field="outputs.*")), TODAY)
    assert result.status == 1 and result.unused


def test_failures_and_stand_ins(tmp_path):
    crash = Verdict("port", "prefill_budget_binds", "crash", "candidate", message="exited")
    assert apply_gate([crash], ROWS, [], TODAY).status == 2
    assert apply_gate([diverged(role="stand-in")], ROWS, [], TODAY).status == 0


def test_methods_divergence_is_filed_under_its_method_row():
    oracle = [{"row": "pard/K=8", "drafting_slots_per_request": 8}]
    cand = [{"row": "pard/K=8", "drafting_slots_per_request": 0}]
    v = Verdict("port", "method_matrix", "diverged", "candidate", [compare_layer("methods", oracle, cand)])
    assert apply_gate([v], ROWS, [], TODAY).rows_of(v) == ("SPEC-DRAFT-MODEL", "SPEC-DFLASH")


@pytest.mark.parametrize("engine, waived", [("", ["port"]), ('engine = "*"', ["port"]),
                                            ('engine = "vllm-0.27.1"', [])])
def test_a_waiver_never_covers_the_oracle(tmp_path, engine, waived):
    # the oracle diverging from its golden at the field a port's waiver names still fails
    oracle = diverged("vllm-0.27.1", role="oracle")
    result = apply_gate([oracle, diverged()], ROWS, load_waivers(waiver_file(tmp_path, extra=engine)), TODAY)
    assert result.status == 1 and [e for e, _ in result.waived] == waived


def test_a_waiver_with_an_engine_covers_only_the_engines_it_names(tmp_path):
    waivers = load_waivers(waiver_file(tmp_path, extra='engine = "port-*"'))
    a, b, other = diverged("port-a"), diverged("port-b"), diverged("other-port")
    result = apply_gate([a, b, other], ROWS, waivers, TODAY)
    assert set(result.waived) == {a.key, b.key} and result.status == 1
    assert apply_gate([a, b], ROWS, waivers, TODAY).status == 0
    assert apply_gate([other], ROWS, waivers, TODAY).unused == waivers


def test_a_waiver_names_any_row_its_verdict_is_filed_under(tmp_path):
    path = waiver_file(tmp_path)
    path.write_text(path.read_text(encoding="utf-8").replace('row = "ENG-SCHED-CORE"', 'row = "SPEC-DFLASH"'), encoding="utf-8")
    assert apply_gate([diverged()], ROWS, load_waivers(path), TODAY).status == 0
    path.write_text(path.read_text(encoding="utf-8").replace('row = "SPEC-DFLASH"', 'row = "SPEC-EAGLE"'), encoding="utf-8")
    assert apply_gate([diverged()], ROWS, load_waivers(path), TODAY).status == 1


@pytest.mark.parametrize("body, words", [
    ("[[waiver]]\nrow='A'\nscenario='s'\nfield='f'\nreason='r'\nowner='o'\nexpires=2027-01-01\nengine=3\n", "waiver[0].engine: optional, but when given a non-empty str"),
    ("[[waiver]]\nrow='A'\nscenario='s'\nfield='f'\nreason='r'\nowner='o'\nexpires=2027-01-01\nengine=' '\n", "waiver[0].engine"),
    ("[[waiver]]\nrow = 'X'\n", "waiver[0].scenario"),
    ("[[waiver]]\nrow='A'\nscenario='s'\nfield='f'\nreason='r'\nowner='o'\nexpires='2027-01-01'\n", "waiver[0].expires"),
    ("[[waiver]]\nrow='A'\nscenario='s'\nfield='f'\nreason='r'\nowner='o'\nexpires=2027-01-01\nextra=1\n", "waiver[0].extra"),
    ("not toml [", "not valid TOML"),
])
def test_malformed_waivers_name_the_field(tmp_path, body, words):
    path = tmp_path / "w.toml"
    path.write_text(body)
    with pytest.raises(WaiverError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_waivers(path)


def test_three_reports_from_one_run(tmp_path):
    golden = {"layers": {"steps": STEPS_O}}
    cand_trace = {"layers": {"steps": STEPS_C}}
    ok = Verdict("vllm-0.27.1", "prefill_budget_binds", "pass", "oracle",
                 [compare_layer("steps", STEPS_O, STEPS_O)])
    bad = diverged()
    result = apply_gate([ok, bad], ROWS, [], TODAY)
    traces = {("vllm-0.27.1", "prefill_budget_binds"): ({"layers": {"steps": STEPS_O}}, golden),
              ("port", "prefill_budget_binds"): (cand_trace, golden)}
    junit, md, html = write_reports(tmp_path / "r", gate_view(result, "0.27.1", traces=traces))
    suites = ET.parse(junit).getroot()
    assert suites.find("testsuite").get("failures") == "1"
    assert "requests.r1.tokens" in suites.find(".//failure").get("message")
    text = md.read_text()
    assert "FAIL" in text and "| ENG-SCHED-CORE | prefill_budget_binds | `port` |" in text
    page = html.read_text()
    assert "<svg" in page and "<polyline" in page and "first divergence: step 0 (port)" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # self-contained
