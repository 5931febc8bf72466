"""One comparator per layer (conformance/judging/comparators.py): registered by layer name and
form, reached through one dispatcher, calls going one way."""

import copy
import sys

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.protocol import LAYERS
from conformance.judging import comparators
from conformance.judging.comparators import RECORDS, Basis, compare, register
from conformance.judging.goldens import GOLDENS
from conformance.judging.judging import judge_trace
from conformance.judging.verdict import CANDIDATE, DIVERGED

ORACLE = load_pins().oracle


def _diverged_engine_trace() -> tuple[dict, dict]:
    """The oracle's engine-layer golden and a copy that differs in engine_steps and engine_outputs."""
    golden = GOLDENS.load("engine_dflash_gate", ORACLE)
    trace = copy.deepcopy(golden)
    trace.layers["engine_steps"][2]["requests"]["r0"]["tokens"] += 1
    trace.layers["engine_outputs"][0]["output_token_ids"][1] += 1
    return golden, trace


def test_every_layer_has_its_comparator():
    assert {layer for layer, form in comparators.COMPARATORS if form == RECORDS} == set(LAYERS)


def test_a_new_form_registers_without_touching_the_dispatcher(monkeypatch):
    monkeypatch.setattr(comparators, "COMPARATORS", dict(comparators.COMPARATORS))
    seen = []

    @register("steps", "digest/test")
    def digests(expected, actual, basis):
        seen.append((expected, actual, basis.atol))
        return compare("steps", [], [])  # any comparison: what matters is that this one was called

    basis = Basis(0.5)
    assert compare("steps", {"form": "digest/test"}, {"d": 1}, basis, form="digest/test").equal
    assert seen == [({"form": "digest/test"}, {"d": 1}, 0.5)]
    with pytest.raises(ValueError, match="already has a comparator"):
        register("steps", "digest/test")(digests)
    with pytest.raises(LookupError, match="no comparator for layer 'outputs' in form 'digest/test'"):
        compare("outputs", [], [], form="digest/test")


def test_the_judge_sends_each_layer_to_its_own_comparator(monkeypatch):
    golden, trace = _diverged_engine_trace()
    sent = []

    def spy(layer, comparator):
        def call(expected, actual, basis):
            sent.append(layer)
            return comparator(expected, actual, basis)
        return call

    monkeypatch.setattr(comparators, "COMPARATORS", {key: spy(key[0], c) for key, c in comparators.COMPARATORS.items()})
    verdict = judge_trace(trace, golden, CANDIDATE)
    assert verdict.kind == DIVERGED
    assert sent == [layer for layer in LAYERS if layer in golden.layers]
    assert [c.layer for c in verdict.comparisons] == sent


def test_calls_go_one_way_from_the_judge_to_the_comparators():
    """Judging a trace, no function of compare.py or numerics.py calls into the other, nor back
    into the dispatcher: the judge calls the dispatcher, the dispatcher a layer's comparator."""
    golden, trace = _diverged_engine_trace()
    calls = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_back and frame.f_code.co_filename.endswith(".py"):
            callee = frame.f_globals.get("__name__", "")
            caller = frame.f_back.f_globals.get("__name__", "")
            if callee != caller and {caller, callee} <= JUDGING:
                calls.add((caller.rsplit(".", 1)[1], callee.rsplit(".", 1)[1]))

    sys.setprofile(profile)
    try:
        verdict = judge_trace(trace, golden, CANDIDATE)
    finally:
        sys.setprofile(None)
    assert verdict.kind == DIVERGED
    assert ("verdict", "comparators") in calls and ("comparators", "numerics") in calls
    backwards = {("compare", "numerics"), ("numerics", "compare"), ("compare", "comparators"),
                 ("numerics", "comparators")}
    assert not calls & backwards, sorted(calls)


JUDGING = {f"conformance.judging.{name}" for name in ("verdict", "comparators", "compare", "numerics")}


def test_a_refused_configuration_s_engine_outputs_are_compared_exactly():
    refused = [{"refused": {"kind": "ValueError", "message": "too small"}}]
    c = compare("engine_outputs", refused, [{"id": "r0", "output_token_ids": [1], "logprobs": []}], Basis(1.0))
    assert not c.equal and c.cause == "mismatch" and c.index == 0
    assert compare("engine_outputs", refused, copy.deepcopy(refused), Basis(1.0)).equal
