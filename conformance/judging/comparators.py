"""One comparator per layer: the registry, by layer name and form, and the one dispatcher.

The judge hands each layer's two sides to `compare`, which calls the comparator registered for
the layer's name and form and hands its `LayerComparison` back; nothing else decides how a
layer is compared. Calls go one way, from here down, and never come back:
- config, steps, outputs, methods and engine_config are compared record for record, the first
  divergence found by plain equality (judging/compare.py), each with its own context fields;
- engine_steps and engine_outputs are compared knowing numerics (judging/numerics.py): why two
  real engines differ, with the scenario's tolerance and the oracle's logprobs as evidence.
  engine_steps is the exact search, then its cause (numerics.step_cause); engine_outputs of a
  refused configuration is exact, otherwise numerics'.

A layer's form is how its records are held: a list of records (`RECORDS`), or, for steps and
outputs of a production-scale scenario, the digest form (`DIGEST`, formats/digest.py), compared
by judging/digest_compare.py: the first differing digest is the first differing record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from conformance.formats.digest import LAYERS as DIGEST_LAYERS
from conformance.judging.compare import LayerComparison, compare_layer
from conformance.judging.digest_compare import compare_digest_layer
from conformance.judging.numerics import compare_engine_outputs, step_cause

RECORDS = "records"  # a layer held as the list of its records
DIGEST = "digest"  # a production-scale layer held in the digest form (formats/digest.py)


@dataclass(frozen=True)
class Basis:
    """What a comparator may know besides the two sides of its layer: the scenario's logprob
    tolerance, and the oracle's layers (the evidence behind an engine layer's cause: its
    engine_outputs' margins decide an acceptance difference)."""

    atol: float = 0.0
    oracle: Mapping[str, list] = field(default_factory=dict)


# A comparator: (the oracle's side, the candidate's side, the basis) -> the layer's comparison
Comparator = Callable[[list, list, Basis], LayerComparison]
COMPARATORS: dict[tuple[str, str], Comparator] = {}


def register(layer: str, form: str = RECORDS) -> Callable[[Comparator], Comparator]:
    """Register the comparator of `layer` in `form` (a decorator); one per layer and form."""
    def add(comparator: Comparator) -> Comparator:
        if (layer, form) in COMPARATORS:
            raise ValueError(f"layer {layer!r} in form {form!r} already has a comparator")
        COMPARATORS[(layer, form)] = comparator
        return comparator
    return add


def compare(layer: str, expected, actual, basis: Basis = Basis(), form: str = RECORDS) -> LayerComparison:
    """The one dispatcher: `layer` in `form` compared by its registered comparator."""
    comparator = COMPARATORS.get((layer, form))
    if comparator is None:
        known = ", ".join(f"{name} ({how})" for name, how in sorted(COMPARATORS))
        raise LookupError(f"no comparator for layer {layer!r} in form {form!r}; registered: {known}")
    return comparator(expected, actual, basis)


def _exact(layer: str) -> Comparator:
    def comparator(expected: list, actual: list, basis: Basis) -> LayerComparison:
        return compare_layer(layer, expected, actual)
    return comparator


for _layer in ("config", "steps", "outputs", "methods", "engine_config"):
    register(_layer)(_exact(_layer))


def _digest(layer: str) -> Comparator:
    def comparator(expected: dict, actual: dict, basis: Basis) -> LayerComparison:
        # the oracle's records replayed live for the run's window (gate/replay.py) travel with the
        # run's form; the comparison checks them against the golden's digests there
        if "oracle_window" in actual:
            expected = dict(expected, oracle_window=actual["oracle_window"])
        return compare_digest_layer(layer, expected, actual)
    return comparator


for _layer in DIGEST_LAYERS:
    register(_layer, DIGEST)(_digest(_layer))


@register("engine_steps")
def _engine_steps(expected: list, actual: list, basis: Basis) -> LayerComparison:
    c = compare_layer("engine_steps", expected, actual)
    return step_cause(c, expected, basis.oracle.get("engine_outputs") or [], basis.atol)


@register("engine_outputs")
def _engine_outputs(expected: list, actual: list, basis: Basis) -> LayerComparison:
    if expected != actual and any("refused" in r for r in expected + actual):  # a refused configuration
        c = compare_layer("engine_outputs", expected, actual)
        c.cause = "mismatch"
        return c
    return compare_engine_outputs(expected, actual, basis.atol)
