"""Drift across the pins: per scenario, where each release first departs from the previous one.

Read from the committed goldens only (no engine runs), so it is cheap enough for every
`make parity` and is what a reviewer reads when the oracle pin is bumped. Releases are taken in
release order (by version), never in the order pyproject.toml lists them, so each is compared
with the release before it. `compare_pins` compares any two (the old oracle and the new one in
`parity bump`'s pull-request text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from packaging.version import Version

from conformance.formats.pins import load_pins
from conformance.formats.protocol import ENGINE_LAYERS, LAYERS
from conformance.judging.goldens import GOLDENS, GoldenStore
from conformance.judging.comparators import DIGEST, Basis, compare
from conformance.judging.verdict import logprob_atol

SAME, DEPARTS = "same", "departs"


@dataclass(frozen=True)
class LayerDrift:
    """Where one layer of a scenario first differs between two releases' goldens."""

    at: str  # "record 0", "step 4", a methods row
    field: str
    old: object
    new: object


@dataclass(frozen=True)
class Drift:
    """Two releases' goldens of one scenario, layer by layer (None: the layer is the same)."""

    scenario: str
    older: str
    newer: str
    status: str  # SAME, DEPARTS, or why there is nothing to compare (a golden missing)
    layers: tuple[tuple[str, LayerDrift | None], ...] = ()

    @property
    def departs(self) -> tuple[tuple[str, LayerDrift], ...]:
        return tuple((layer, d) for layer, d in self.layers if d is not None)


def release_order(releases) -> tuple[str, ...]:
    """The releases by version, oldest first, a pinned commit right after its base: the order
    drift is read in."""
    pins = load_pins()
    return tuple(sorted(releases, key=lambda r: (Version(pins.base(r)), r != pins.base(r), r)))


def drift_rows(scenario_names: list[str], releases: tuple[str, ...]) -> list[Drift]:
    """Each scenario, each release against the one before it in release order."""
    ordered = release_order(releases)
    return [compare_pins(name, older, newer) for name in scenario_names
            for older, newer in zip(ordered, ordered[1:])]


def compare_pins(name: str, older: str, newer: str, store: GoldenStore = GOLDENS) -> Drift:
    """One scenario's goldens of two releases, layer by layer (`store`: the goldens as the
    pins it was made with judge them: a bump's edited pins)."""
    if not (store.exists(name, older) and store.exists(name, newer)):
        return Drift(name, older, newer, missing_reason(name, (older, newer), store))
    old, new = store.lookup(name, older), store.lookup(name, newer)
    invalid = [g.message for g in (old, new) if g.trace is None]
    if invalid:  # a golden that is not its pin's (truncated, another pin's, bad provenance)
        return Drift(name, older, newer, "invalid golden: " + "; ".join(invalid))
    old, new = old.trace, new.trace
    a, b = old.layers, new.layers
    layers = []
    for layer in sorted(set(a) | set(b), key=lambda x: LAYERS.index(x) if x in LAYERS else 99):
        # engine layers within the scenario's logprob tolerance are the same
        c = compare(layer, a.get(layer, []), b.get(layer, []), Basis(logprob_atol(old), a))
        if c.equal:
            layers.append((layer, None))
            continue
        where = c.record or c.actual_record or {}
        at = where.get("row") or (f"step {where['step']}" if "step" in where else f"record {c.index}")
        layers.append((layer, LayerDrift(at, c.first.path, c.first.expected, c.first.actual)))
    for layer, form in old.forms.items():  # production: where, by digest
        c = compare(layer, form, new.forms.get(layer) or {"records": []}, form=DIGEST)
        layers.append((layer, None if c.equal else
                       LayerDrift(f"record {c.index}", c.first.path, c.first.expected, c.first.actual)))
    status = DEPARTS if any(d for _, d in layers) else SAME
    return Drift(name, older, newer, status, tuple(layers))


def missing_reason(name: str, releases, store: GoldenStore = GOLDENS) -> str:
    """Why a pair has no drift: a pin without a CPU engine has no engine-layer goldens, and
    pyproject.toml says why it has none (no CPU rebuild on PyPI, or one the fidelity check refuses)."""
    pins = store.pins
    present = [store.lookup(name, r).trace for r in releases if store.exists(name, r)]
    engine = any(layer in ENGINE_LAYERS for g in present if g is not None for layer in g.layers)
    for release in releases:
        if not store.exists(name, release) and engine and not pins.cpu_engine_build(release):
            return (f"no golden for {release}: its whole engine cannot run on CPU "
                    f"({pins.no_cpu_engine_reason(release)}); its engine layers run on GPU runners")
    missing = [r for r in releases if not store.exists(name, r)]
    return f"no golden for {', '.join(missing)}: write it with `make goldens`"


def render_drift(rows: list[Drift]) -> str:
    """The departures, scenario by scenario; scenarios the same for a pair of releases are
    counted, not listed."""
    lines = ["-- drift across pins (from the goldens): where each release first departs from the one before it"]
    for r in rows:
        head = f"   {r.scenario}: {r.older} -> {r.newer}: "
        if r.status == SAME:
            continue
        if r.status != DEPARTS:
            lines.append(head + r.status)
            continue
        lines.append(head.rstrip())
        for layer, d in r.layers:
            text = "same" if d is None else "{}, {}: {} -> {}".format(d.at, d.field, *shown_apart(d.old, d.new))
            lines.append(f"     {layer:<14} {text}")
    pairs: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        pairs.setdefault((r.older, r.newer), [])
        if r.status == SAME:
            pairs[(r.older, r.newer)].append(r.scenario)
    for (older, newer), same in pairs.items():
        lines.append(f"   {older} -> {newer}: {len(same)} scenario(s) the same")
    return "\n".join(lines)


def shown_apart(old, new, width: int = 50) -> tuple[str, str]:
    """Both values shortened to `width`, from a little before where their texts first differ:
    two long values with a common start (two releases' log lines) would otherwise read alike."""
    a, b = json.dumps(old, sort_keys=True), json.dumps(new, sort_keys=True)
    if len(a) <= width and len(b) <= width:
        return a, b
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, first - width // 4)
    if start:
        a, b = "..." + a[start:], "..." + b[start:]
    return tuple(t if len(t) <= width else t[:width - 3] + "..." for t in (a, b))
