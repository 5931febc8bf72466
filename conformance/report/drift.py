"""Drift across the pins: per scenario, where each release first departs from the previous one.

Read from the committed goldens only (no engine runs), so it is cheap enough for every
`make parity` and is what a reviewer reads when the oracle pin is bumped.
"""

from __future__ import annotations

import json

from conformance.formats.protocol import ENGINE_LAYERS, LAYERS
from conformance.judging.digest_compare import compare_digest_layer
from conformance.judging.goldens import GOLDENS
from conformance.judging.numerics import compare_by_layer
from conformance.judging.verdict import logprob_atol


def drift_rows(scenario_names: list[str], releases: tuple[str, ...]) -> list[dict]:
    rows = []
    for name in scenario_names:
        for older, newer in zip(releases, releases[1:]):
            row = {"scenario": name, "from": older, "to": newer}
            if not (GOLDENS.exists(name, older) and GOLDENS.exists(name, newer)):
                row["status"] = _missing(name, (older, newer))
                rows.append(row)
                continue
            old, new = GOLDENS.load(name, older), GOLDENS.load(name, newer)
            a, b = old["layers"], new["layers"]
            row["layers"] = {}
            for layer in sorted(set(a) | set(b), key=lambda x: LAYERS.index(x) if x in LAYERS else 99):
                # engine layers within the scenario's logprob tolerance are the same
                c = compare_by_layer(layer, a.get(layer, []), b.get(layer, []), logprob_atol(old),
                                     a.get("engine_outputs"))
                if c.equal:
                    row["layers"][layer] = None
                    continue
                f = c.first
                where = c.record or c.actual_record or {}
                at = where.get("row") or (f"step {where['step']}" if "step" in where else f"record {c.index}")
                row["layers"][layer] = {"at": at, "field": f.path, "old": f.expected, "new": f.actual}
            for layer, form in old.get("digests", {}).items():  # production: where, by digest
                c = compare_digest_layer(layer, form, new.get("digests", {}).get(layer) or {"records": []})
                row["layers"][layer] = None if c.equal else {
                    "at": f"record {c.index}", "field": c.first.path, "old": c.first.expected, "new": c.first.actual}
            row["status"] = "departs" if any(row["layers"].values()) else "same"
            rows.append(row)
    return rows


def _missing(name: str, releases) -> str:
    """Why a pair has no drift: a pin without a CPU engine has no engine-layer goldens."""
    from conformance.formats.pins import load_pins

    pins = load_pins()
    present = [GOLDENS.load(name, r) for r in releases if GOLDENS.exists(name, r)]
    engine = any(layer in ENGINE_LAYERS for g in present for layer in g["layers"])
    for release in releases:
        if not GOLDENS.exists(name, release) and engine and not pins.cpu_engine_build(release):
            return f"no golden for {release}: it has no CPU engine (its engine layers run on GPU runners)"
    return "missing golden"


def render_drift(rows: list[dict]) -> str:
    lines = ["-- drift across pins (from the goldens): where each release first departs from the previous"]
    for r in rows:
        head = f"   {r['scenario']}: {r['from']} -> {r['to']}: "
        if r["status"] != "departs":
            lines.append(head + r["status"])
            continue
        lines.append(head.rstrip())
        for layer, d in r["layers"].items():
            text = "same" if d is None else f"{d['at']}, {d['field']}: {_short(d['old'])} -> {_short(d['new'])}"
            lines.append(f"     {layer:<14} {text}")
    return "\n".join(lines)


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 50 else text[:47] + "..."
