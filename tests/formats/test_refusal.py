"""Refusals are compared by their meaning (conformance/formats/refusal.py): the exception vLLM's code
raised and vLLM's own words, pydantic's wrapper and its repr of vLLM's arguments removed."""

import copy
import json

from conformance.formats.pins import load_pins
from conformance.formats.refusal import meaning
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import DIVERGED, PASS, judge
from conformance.report.render_text import render_verdict
from tests.helpers import REPO

PINS = load_pins()
WORDS = "long_prefill_token_threshold (1025) cannot be greater than the max_model_len (1024)."
# vLLM 0.27.1's refusal of budget_threshold_over_max_len as its caller sees it (str(exc))
RAW = ("1 validation error for SchedulerConfig\n  Value error, " + WORDS +
       " [type=value_error, input_value=ArgsKwargs((), {'runner_t..., 'stream_interval': 1}), "
       "input_type=ArgsKwargs]\n    For further information visit https://errors.pydantic.dev/2.14/v/value_error")


def test_the_meaning_is_vllms_exception_and_words():
    assert meaning({"type": "ValidationError", "message": RAW}) == {"type": "ValueError", "message": WORDS}
    assert meaning({"type": "ValueError", "message": WORDS}) == {"type": "ValueError", "message": WORDS}
    other = RAW.replace("Value error, ", "Assertion failed, ").replace("2.14", "2.99")
    assert meaning({"type": "ValidationError", "message": other}) == {"type": "AssertionError", "message": WORDS}


def test_pydantics_own_errors_stay_validation_errors_without_the_repr():
    raw = ("2 validation errors for SchedulerConfig\nmax_num_seqs\n  Input should be a valid integer "
           "[type=int_parsing, input_value='four', input_type=str]\n    For further information visit "
           "https://errors.pydantic.dev/2.14/v/int_parsing\nmax_model_len\n  Value error, too long\nreally "
           "[type=value_error, input_value=9, input_type=int]")
    assert meaning({"type": "ValidationError", "message": raw}) == {
        "type": "ValidationError",
        "message": "max_num_seqs: Input should be a valid integer\nmax_model_len: Value error, too long\nreally"}
    # text that is not pydantic's rendering is kept as sent
    assert meaning({"type": "ValidationError", "message": "no header"})["message"] == "no header"


def golden_and_candidate(refused: dict):
    golden = GOLDENS.load("budget_threshold_over_max_len", PINS.oracle)
    golden.layers["config"][0]["refused"] = {"type": "ValueError", "message": WORDS}
    candidate = copy.deepcopy(golden)
    candidate.engine["label"] = "port"
    candidate.layers["config"][0]["refused"] = refused
    return golden, candidate


def test_a_refusal_that_differs_only_in_pydantics_wrapper_passes():
    golden, candidate = golden_and_candidate({"type": "ValidationError", "message": RAW})
    assert judge(candidate, golden, "candidate").kind == PASS
    # and the other way round: a golden of vLLM's raw text against a port's meaning
    assert judge(golden, candidate, "candidate").kind == PASS


def test_a_refusal_of_another_type_fails_and_the_report_shows_both_whole():
    golden, candidate = golden_and_candidate({"type": "TypeError", "message": WORDS})
    verdict = judge(candidate, golden, "candidate")
    assert verdict.kind == DIVERGED
    assert verdict.comparisons[0].first.path == "refused.type"
    text = render_verdict(verdict, PINS.oracle)
    assert f"oracle   : ValueError: {WORDS}" in text and f"candidate: TypeError: {WORDS}" in text


def test_a_refusal_in_other_words_fails():
    golden, candidate = golden_and_candidate({"type": "ValueError", "message": "threshold too large"})
    verdict = judge(candidate, golden, "candidate")
    assert verdict.kind == DIVERGED and verdict.comparisons[0].first.path == "refused.message"


def test_the_oracles_goldens_store_refusals_by_their_meaning():
    refusals = [r["refused"] for p in sorted((REPO / "goldens").glob("*/vllm-*.json"))
                for records in json.loads(p.read_text())["layers"].values() for r in records
                if isinstance(r.get("refused"), dict)]
    assert refusals and all(meaning(r) == r for r in refusals)
    assert all("input_value=" not in r["message"] and "pydantic" not in r["message"] for r in refusals)
