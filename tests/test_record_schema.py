"""Record schemas (conformance/record_schema.py): PROTOCOL.md's record tables and the code's
declaration say the same, every committed golden is what they declare, and a record is judged
field by field: what is missing, mistyped, out of range or not finite is named; a field no
table names is ignored."""

import copy
import json
import math
import re

import pytest

from conformance import protocol
from conformance.gate.golden_store import GOLDENS
from conformance.gate.verdict import PASS
from conformance.gate.judging import judge_trace
from conformance.pins import load_pins
from conformance.record_schema import LAYERS, RecordError, check_layers, check_record
from conformance.trace import checked
from conftest import REPO

ORACLE = load_pins().oracle


def test_the_layers_declared_are_the_protocols():
    assert tuple(LAYERS) == protocol.LAYERS


def every_golden():
    return sorted(REPO.glob("goldens/*/vllm-*.json"))


@pytest.mark.parametrize("path", every_golden(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_committed_golden_is_what_the_tables_declare_every_field_named(path):
    golden = GOLDENS.load(path.parent.name, path.stem.removeprefix("vllm-"))  # strict, provenance too
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert golden["layers"] == raw["layers"]  # nothing left out: every field is named


def gate_golden(scenario="steady_decode") -> dict:
    return GOLDENS.load(scenario, ORACLE)


STEP = gate_golden()["layers"]["steps"][3]


@pytest.mark.parametrize("edit, path, words", [
    (lambda r: r.update(step=True), "step", "expected int >= 0, got true (a bool)"),
    (lambda r: r.update(step=3.0), "step", "expected int >= 0, got 3.0 (a number)"),
    (lambda r: r.update(step=2 ** 64), "step", "expected int >= 0, got 18446744073709551616 (an int)"),
    (lambda r: r["requests"]["r0"].update(tokens=-1), "requests.r0.tokens", "got -1 (an int)"),
    (lambda r: r.pop("running"), "running", "expected list of str, got nothing (the field is missing)"),
    (lambda r: r.update(finished=["r0", 1]), "finished[1]", "expected str, got 1 (an int)"),
    (lambda r: r.update(kv_blocks=None), "kv_blocks", "expected an object (kv blocks), got null"),
    (lambda r: r["requests"].update({"\x1b]0;owned\x07": 1}), 'requests."\\u001b]0;owned\\u0007"',
     "expected an object (request entry), got 1"),
])
def test_a_record_error_names_the_field_and_the_value(edit, path, words):
    record = copy.deepcopy(STEP)
    edit(record)
    with pytest.raises(RecordError) as err:
        check_record("steps", record)
    assert err.value.path == path and words in str(err.value), str(err.value)


def test_non_finite_and_out_of_range_numbers_are_errors():
    outputs = gate_golden("engine_ngram")["layers"]["engine_outputs"][0]
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
    steps = copy.deepcopy(STEP)
    assert "input_budget" not in steps and check_record("steps", steps) == steps  # optional, absent
    engine = gate_golden("engine_ngram")["layers"]["engine_steps"][0]
    assert "free" not in engine["kv_blocks"] and check_record("engine_steps", engine) == engine
    with pytest.raises(RecordError, match="field target_forward_tokens"):
        check_record("engine_steps", steps)  # engine_steps has fields of its own
    refusal = {"type": "ValueError", "message": "no"}
    assert check_record("steps", {"refused": refusal}) == {"refused": refusal}
    assert check_record("config", {"refused": refusal, "budget_log_lines": []})
    with pytest.raises(RecordError, match="field refused.message: expected str"):
        check_record("outputs", {"refused": {"type": "ValueError"}})
    probe = next(r for r in gate_golden("method_matrix")["layers"]["methods"] if "probe" in r)
    assert check_record("methods", probe) == probe
    with pytest.raises(RecordError, match='field probe: expected "below" or "at" or "above"'):
        check_record("methods", dict(probe, probe="under"))


def test_unknown_fields_are_ignored_and_never_compared():
    """PROTOCOL.md: fields no table names are ignored. They are left out before any comparison,
    so a port's own debugging fields never make a divergence (and a golden may hold none)."""
    golden = gate_golden()
    trace = copy.deepcopy(golden)
    trace["engine"] = dict(trace["engine"], label="port")
    for layer in trace["layers"].values():
        for record in layer:
            record["zzz_debug"] = {"anything": [1, "x"]}
    trace["layers"]["steps"][3]["requests"]["r0"]["zzz"] = 1
    assert checked(trace)["layers"] == golden["layers"]
    assert judge_trace(trace, golden, "candidate").kind == PASS
    _, problem = check_layers(trace["layers"], strict=True)
    assert "field zzz_debug: expected no such field" in str(problem)


def test_the_first_bad_record_ends_the_records_compared():
    trace = copy.deepcopy(gate_golden())
    trace["layers"]["steps"][7]["token_budget"] = "4036"
    layers, problem = check_layers(trace["layers"])
    assert (problem.layer, problem.seq, problem.error.path) == ("steps", 7, "token_budget")
    assert list(layers) == ["config", "steps"] and len(layers["steps"]) == 7  # outputs come after steps
    judged = checked(trace)
    assert judged["failure"]["kind"] == "protocol" and "record #7 (step 7)" in judged["failure"]["message"]
