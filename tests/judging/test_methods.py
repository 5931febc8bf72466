"""Drafting-slot table and refusal parity (the `methods` layer), against the committed goldens."""

import copy
import json
import shutil

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import judge
from conformance.report.methods_table import render_methods_table
from conformance.report.render_text import render
from tests.helpers import REPO

PINS = load_pins()
# The port ticket's eight cases at K = 8, carried by upstream vllm#51256 (first in 0.28.0).
SEED_TABLE = {"eagle3": 0, "p-eagle": 7, "dflash": 8, "dspark": 7, "mtp": 0, "ngram": 0,
              "draft-model": 1, "pard": 8}
SEED_PIN = "0.28.0"


def golden(release):
    return GOLDENS.load("method_matrix", release)


def test_the_seed_pin_reproduces_the_eight_cases_from_its_own_code():
    rows = {r["row"]: r for r in golden(SEED_PIN).layers["methods"]}
    assert {m: rows[f"{m}/K=8"]["drafting_slots_per_request"] for m in SEED_TABLE} == SEED_TABLE
    assert golden(SEED_PIN).provenance["environment"]["vllm"] == SEED_PIN


def test_no_row_is_dropped_on_any_pin():
    scenario = load_scenario(REPO / "scenarios" / "method_matrix.json")
    expected = {f"{row['name']}/K={k}" for row in scenario.method_matrix["rows"] for k in scenario.method_matrix["ks"]}
    for release in PINS.releases:
        rows = {r["row"] for r in golden(release).layers["methods"] if "probe" not in r}
        assert rows == expected, release


def test_a_different_cell_is_named_by_method_k_and_both_values():
    oracle = golden(PINS.oracle)
    cand = copy.deepcopy(oracle)
    cell = next(r for r in cand.layers["methods"] if r["row"] == "dflash/K=8")
    cell["drafting_slots_per_request"] += 1
    verdict = judge(cand, oracle, "candidate")
    assert verdict.kind == "diverged"
    text = render([verdict], PINS.oracle)
    expected = cell["drafting_slots_per_request"] - 1
    assert (f"row dflash/K=8, field drafting_slots_per_request: oracle {expected}, "
            f"candidate {expected + 1}") in text


def test_accepting_what_the_oracle_refuses_fails_by_kind_not_wording():
    oracle = golden(PINS.oracle)
    reworded = copy.deepcopy(oracle)
    probe = next(r for r in reworded.layers["methods"] if r.get("refused"))
    probe["refusal_text"] = "the port's own words"
    assert judge(reworded, oracle, "candidate").kind == "pass"  # wording is not compared
    probe.update(refused=False, refusal_kind=None, refused_by=None, refusal_text=None)
    verdict = judge(reworded, oracle, "candidate")
    assert verdict.kind == "diverged"
    assert f"row {probe['row']}, field refused: oracle true, candidate false" in render([verdict], PINS.oracle)


def test_table_marks_cells_that_change_between_pins():
    text = render_methods_table(PINS.releases)
    dflash = next(line for line in text.splitlines() if line.strip().startswith("dflash/K=8 "))
    assert "*" in dflash
    eagle = next(line for line in text.splitlines() if line.strip().startswith("eagle3/K=8 "))
    assert "*" not in eagle


@pytest.mark.oracle
def test_a_row_that_cannot_be_built_stays_with_the_engines_error(tmp_path, warm_sessions):
    shutil.copytree(REPO / "scenarios" / "models", tmp_path / "models")
    data = json.loads((REPO / "scenarios" / "method_matrix.json").read_text())
    data["name"] = "unbuildable"
    # a draft model whose vocabulary differs from the target's: vLLM refuses to build it
    draft = json.loads((tmp_path / "models" / "qwen3-0.6b-draft" / "config.json").read_text())
    draft["vocab_size"] = 1000
    (tmp_path / "models" / "bad-vocab").mkdir()
    (tmp_path / "models" / "bad-vocab" / "config.json").write_text(json.dumps(draft))
    data["method_matrix"] = {"ks": [8], "rows": [
        {"name": "bad-vocab", "speculative_config": {"method": "draft_model", "model": "models/bad-vocab"}},
        {"name": "ngram", "speculative_config": {"method": "ngram", "prompt_lookup_max": 4}}]}
    (tmp_path / "s.json").write_text(json.dumps(data))
    scenario = load_scenario(tmp_path / "s.json")
    trace = warm_sessions(PINS.oracle).trace(scenario, ["methods"])
    assert trace.failure is None, trace.failure
    records = trace.layers["methods"]
    rows = {r["row"]: r for r in records}
    assert set(rows) >= {"bad-vocab/K=8", "ngram/K=8"}
    bad = rows["bad-vocab/K=8"]
    assert bad["constructible"] is False and bad["refusal_kind"]
    assert "vocabulary size" in bad["refusal_text"]  # the engine's own words, kept
    assert rows["ngram/K=8"]["constructible"]
    json.dumps(trace.to_json())  # records are plain JSON
