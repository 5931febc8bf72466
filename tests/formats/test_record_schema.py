"""Record schemas (conformance/formats/record_schema.py): PROTOCOL.md's record tables and the code's
declaration say the same, every committed golden is what they declare, and a record is judged
field by field: what is missing, mistyped, out of range or not finite is named; a field no
table names is ignored."""

import copy
import json
import math
import re

import pytest

from conformance.formats import protocol
from conformance.formats.pins import load_pins
from conformance.formats.record_schema import LAYERS, RECORDS, RecordError, check_layers, check_record
from conformance.formats.trace import checked
from conformance.judging.goldens import GOLDENS
from conformance.judging.judging import judge_trace
from conformance.judging.verdict import PASS
from tests.helpers import REPO

PROTOCOL_MD = REPO / "engines" / "PROTOCOL.md"
MARKER = re.compile(r"^<!-- record: (?P<name>[a-z_ ]+) -->\n\| field \| type \| meaning \|\n\|---\|---\|---\|\n"
                    r"(?P<rows>(?:\|.*\|\n)+)", re.M)
ROW = re.compile(r"^\| (?P<fields>[^|]+?) \| (?P<type>[^|]+?) \| .* \|$")
ORACLE = load_pins().oracle


def doc_tables(text: str | None = None) -> dict[str, dict[str, str]]:
    """Each marked table of PROTOCOL.md (or of `text`): field name -> the type its row gives."""
    tables: dict[str, dict[str, str]] = {}
    for match in MARKER.finditer(PROTOCOL_MD.read_text(encoding="utf-8") if text is None else text):
        assert match["name"] not in tables, f"two tables for {match['name']}"
        fields: dict[str, str] = {}
        for line in match["rows"].splitlines():
            row = ROW.match(line)
            assert row, f"{match['name']}: a row that is not `| fields | type | meaning |`: {line}"
            for name in row["fields"].split(", "):
                assert re.fullmatch(r"`[a-z_]+`", name), f"{match['name']}: {name!r} is not a `field`"
                fields[name.strip("`")] = row["type"]
        tables[match["name"]] = fields
    return tables


def test_protocol_md_has_one_table_per_declared_record_and_no_other():
    assert sorted(doc_tables()) == sorted(r.name for r in RECORDS)


@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_each_table_of_protocol_md_says_what_the_code_declares(record):
    """Field names and their types, row by row (a record with a base lists only what it adds)."""
    declared = {name: spec.describe() for name, spec in record.own.items()}
    assert doc_tables()[record.name] == declared


def test_the_layers_declared_are_the_protocols():
    assert tuple(LAYERS) == protocol.LAYERS


@pytest.mark.parametrize("old, new", [
    ("| `waiting` | list of str |", "| `waiting` | list of int |"),  # a type the code does not say
    ("| `computed_tokens` | int >= 0 |", "| `computed_token` | int >= 0 |"),  # a field renamed
    ("| `target_forward_tokens` | list of int >= 0 | rows of each target forward this step |\n", ""),  # dropped
])
def test_the_doc_check_finds_a_table_that_falls_behind(old, new):
    from conformance.formats.record_schema import ENGINE_STEP, REQUEST, STEP, STEP_BASE, STEPS_REQUEST

    text = PROTOCOL_MD.read_text(encoding="utf-8")
    assert text.count(old) == 1
    tables = doc_tables(text.replace(old, new))
    assert any(tables[r.name] != {n: f.describe() for n, f in r.own.items()} for r in (STEP_BASE, STEP, REQUEST, STEPS_REQUEST, ENGINE_STEP))


def every_golden():
    return sorted(REPO.glob("goldens/*/vllm-*.json"))


@pytest.mark.parametrize("path", every_golden(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_committed_golden_is_what_the_tables_declare_every_field_named(path):
    golden = GOLDENS.load(path.parent.name, path.stem.removeprefix("vllm-"))  # strict, provenance too
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert golden.layers == raw["layers"]  # nothing left out: every field is named


def gate_golden(scenario="steady_decode") -> dict:
    return GOLDENS.load(scenario, ORACLE)


STEP = gate_golden().layers["steps"][3]


@pytest.mark.parametrize("edit, path, words", [
    (lambda r: r.update(step=True), "step", "expected int >= 0, got true (a bool)"),
    (lambda r: r.update(step=3.0), "step", "expected int >= 0, got 3.0 (a number)"),
    (lambda r: r.update(step=2 ** 64), "step", "expected int >= 0, got 18446744073709551616 (an int)"),
    (lambda r: r["requests"]["r0"].update(tokens=-1), "requests.r0.tokens", "got -1 (an int)"),
    (lambda r: r.pop("running"), "running", "expected list of str, got nothing (the field is missing)"),
    (lambda r: r.update(finished=["r0", 1]), "finished[1]", "expected str, got 1 (an int)"),
    (lambda r: r.update(kv_blocks=None), "kv_blocks", "expected an object (kv blocks), got null"),
    (lambda r: r["requests"].update({"\x1b]0;owned\x07": 1}), 'requests."\\u001b]0;owned\\u0007"',
     "expected an object (steps request entry), got 1"),
    (lambda r: r["requests"]["r0"].update(block_ids=[[3, -1]]), "requests.r0.block_ids[0][1]",
     "expected int >= 0, got -1 (an int)"),
    (lambda r: r["requests"]["r0"].update(block_ids=[3]), "requests.r0.block_ids[0]",
     "expected list of int >= 0, got 3 (an int)"),
    (lambda r: r["requests"]["r0"].update(draft_token_ids=[-2]), "requests.r0.draft_token_ids[0]",
     "expected int >= -1, got -2 (an int)"),
    (lambda r: r["requests"]["r0"].pop("next_draft_token_ids"), "requests.r0.next_draft_token_ids",
     "expected list of int >= 0, got nothing (the field is missing)"),
    (lambda r: r["kv_blocks"].pop("cached"), "kv_blocks.cached", "got nothing (the field is missing)"),
    (lambda r: r.update(aborted="r0"), "aborted", 'expected list of str, got "r0" (a string)'),
])
def test_a_record_error_names_the_field_and_the_value(edit, path, words):
    record = copy.deepcopy(STEP)
    edit(record)
    with pytest.raises(RecordError) as err:
        check_record("steps", record)
    assert err.value.path == path and words in str(err.value), str(err.value)


def test_non_finite_and_out_of_range_numbers_are_errors():
    outputs = gate_golden("engine_ngram").layers["engine_outputs"][0]
    for value, words in ((math.nan, "NaN (a non-finite number)"), (math.inf, "Infinity"), (0.5, "0.5 (a number)")):
        record = copy.deepcopy(outputs)
        record["logprobs"][0][0][1] = value
        with pytest.raises(RecordError, match=re.escape(words)):
            check_record("engine_outputs", record)


def test_a_long_value_is_cut_and_stays_ascii():
    record = dict(STEP, waiting="é\x1b[2J" * 1000)
    with pytest.raises(RecordError) as err:
        check_record("steps", record)
    shown = str(err.value)
    assert shown.isascii() and "\x1b" not in shown and len(shown) < 200 and "(5000 characters)" in shown


def test_optional_fields_and_variants():
    # optional, absent (0.27.1's steps hold neither; 0.28.0 on charge drafting per step)
    steps = {k: copy.deepcopy(v) for k, v in STEP.items() if k not in ("input_budget", "drafting_slots_per_request")}
    assert check_record("steps", steps) == steps
    engine = gate_golden("engine_ngram").layers["engine_steps"][0]
    assert "free" not in engine["kv_blocks"] and check_record("engine_steps", engine) == engine
    with pytest.raises(RecordError, match="field target_forward_tokens"):
        check_record("engine_steps", steps)  # engine_steps has fields of its own
    refusal = {"type": "ValueError", "message": "no"}
    assert check_record("steps", {"refused": refusal}) == {"refused": refusal}
    assert check_record("config", {"refused": refusal, "budget_log_lines": [], "async_log_lines": []})
    with pytest.raises(RecordError, match="field refused.message: expected str"):
        check_record("outputs", {"refused": {"type": "ValueError"}})
    aborted = {"id": "w", "output_token_ids": [], "finish_reason": "abort", "stop_reason": None}
    assert check_record("outputs", aborted) == aborted
    with pytest.raises(RecordError, match='field finish_reason: expected "length" or "stop", got "abort"'):
        check_record("engine_outputs", dict(aborted, logprobs=[]))  # the engine layers run no aborts
    with pytest.raises(RecordError, match='field stop_reason: expected int >= 0 or "repetition_detected" or null, got nothing'):
        check_record("outputs", {k: v for k, v in aborted.items() if k != "stop_reason"})
    repeated = dict(aborted, finish_reason="repetition", stop_reason="repetition_detected")
    assert check_record("outputs", repeated) == repeated
    with pytest.raises(RecordError, match='field stop_reason: expected int >= 0 or "repetition_detected" or null, got "repeated"'):
        check_record("outputs", dict(repeated, stop_reason="repeated"))
    probe = next(r for r in gate_golden("method_matrix").layers["methods"] if "probe" in r)
    assert check_record("methods", probe) == probe
    with pytest.raises(RecordError, match='field probe: expected "below" or "at" or "above"'):
        check_record("methods", dict(probe, probe="under"))


def test_unknown_fields_are_ignored_and_never_compared():
    """PROTOCOL.md: fields no table names are ignored. They are left out before any comparison,
    so a port's own debugging fields never make a divergence (and a golden may hold none)."""
    golden = gate_golden()
    trace = copy.deepcopy(golden).with_label("port")
    for layer in trace.layers.values():
        for record in layer:
            record["zzz_debug"] = {"anything": [1, "x"]}
    trace.layers["steps"][3]["requests"]["r0"]["zzz"] = 1
    assert checked(trace).layers == golden.layers
    assert judge_trace(trace, golden, "candidate").kind == PASS
    _, problem = check_layers(trace.layers, strict=True)
    assert "field zzz_debug: expected no such field" in str(problem)


def test_the_first_bad_record_ends_the_records_compared():
    trace = copy.deepcopy(gate_golden())
    trace.layers["steps"][7]["token_budget"] = "4036"
    layers, problem = check_layers(trace.layers)
    assert (problem.layer, problem.seq, problem.error.path) == ("steps", 7, "token_budget")
    assert list(layers) == ["config", "steps"] and len(layers["steps"]) == 7  # outputs come after steps
    judged = checked(trace)
    assert judged.failure.kind == "protocol" and "record #7 (step 7)" in judged.failure.message
