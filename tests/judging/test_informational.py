"""Only the fields the record schema declares informational are left out of a comparison, and
only where the schema declares them. A name's shape decides nothing: a request whose id ends in
`_text` is a request, and a scenario or a candidate naming one so is refused outright."""

import copy
import json
from dataclasses import replace

import pytest

from conformance.formats import digest
from conformance.formats.record_schema import RecordError, check_record, without_informational
from conformance.formats.scenario import ScenarioError, load_scenario
from conformance.formats.trace import Trace
from conformance.judging.compare import compare_layer
from conformance.judging.goldens import GOLDENS
from conformance.judging.judging import judge_trace
from conformance.formats.pins import load_pins
from conformance.judging.verdict import PASS
from tests.helpers import REPO

ORACLE = load_pins().oracle


def _golden(name: str) -> dict:
    return GOLDENS.load(name, ORACLE)


def _candidate(golden: Trace) -> Trace:
    return replace(copy.deepcopy(golden), provenance={}, engine={"name": "port", "label": "port"})


def test_a_ghost_text_request_in_every_step_does_not_pass():
    golden = _golden("steady_decode")
    trace = _candidate(golden)
    for record in trace.layers["steps"]:
        some = next(iter(record["requests"].values()))
        record["requests"]["ghost_text"] = dict(some, tokens=4096)
    verdict = judge_trace(trace, golden, "candidate")
    assert verdict.kind == "protocol" and "ghost_text" in verdict.message, verdict.message
    same = judge_trace(_candidate(golden), golden, "candidate")
    assert same.kind == PASS  # the control: the unmutated trace passes


def test_a_request_with_the_suffix_is_compared_like_any_other():
    # below the record check (a golden-side or digest-side comparison): never skipped by its name
    steps = _golden("steady_decode").layers["steps"]
    ghost = copy.deepcopy(steps)
    some = next(iter(ghost[3]["requests"].values()))
    ghost[3]["requests"]["ghost_text"] = dict(some, tokens=4096)
    c = compare_layer("steps", steps, ghost)
    assert not c.equal and c.index == 3 and c.first.path.startswith("requests.ghost_text")
    assert digest.digest("steps", ghost[3]) != digest.digest("steps", steps[3])


def test_a_request_id_with_the_suffix_is_refused_in_records():
    record = copy.deepcopy(_golden("steady_decode").layers["steps"][2])
    record["requests"]["r0_text"] = record["requests"].pop(next(iter(record["requests"])))
    with pytest.raises(RecordError, match="_text"):
        check_record("steps", record)
    for field in ("running", "finished"):
        listed = dict(record, requests={}, **{field: ["ghost_text"]})
        with pytest.raises(RecordError, match="_text"):
            check_record("steps", listed)
    output = dict(_golden("steady_decode").layers["outputs"][0], id="ghost_text")
    with pytest.raises(RecordError, match="_text"):
        check_record("outputs", output)


def test_a_scenario_request_id_with_the_suffix_is_refused(tmp_path):
    scenario = json.loads((REPO / "scenarios" / "steady_decode.json").read_text(encoding="utf-8"))
    scenario["workload"]["requests"][0]["id"] = "r0_text"
    (tmp_path / "models").symlink_to(REPO / "scenarios" / "models")  # its model folder, as beside it
    path = tmp_path / "steady_decode.json"
    path.write_text(json.dumps(scenario), encoding="utf-8")
    with pytest.raises(ScenarioError, match="r0_text"):
        load_scenario(path)


def test_wording_is_skipped_only_where_the_schema_declares_it():
    row = {"row": "pard/K=8", "refused": True, "refusal_kind": "ValueError", "refusal_text": "vLLM words"}
    assert "refusal_text" not in without_informational("methods", row)
    # a *_text key where no table declares one is kept: nothing is skipped by its name
    nested = {"requests": {"a_text": {"tokens": 1}}, "note_text": "x"}
    assert without_informational("steps", nested) == nested
    oracle = [{"step": 0, "requests": {"r0": {"tokens": 5}}}]
    renamed = [{"step": 0, "requests": {"r0": {"tokens": 5}, "r1_text": {"tokens": 999}}}]
    assert not compare_layer("steps", oracle, renamed).equal
