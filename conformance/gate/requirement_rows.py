"""Verdicts filed under requirement rows (the engine-matrix rows a scenario covers, or a method's
row), with the waivers applied: the gate's result."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from .verdict import DIVERGED, Verdict, exit_status
from .waivers import Waiver

# Methods-layer rows are attributed by method: the first segment of a row label like pard/K=8.
METHOD_ROWS = {"dflash": "SPEC-DFLASH", "dspark": "SPEC-DSPARK", "draft-model": "SPEC-DRAFT-MODEL",
               "pard": "SPEC-DRAFT-MODEL", "eagle3": "SPEC-EAGLE", "p-eagle": "SPEC-EAGLE",
               "mtp": "SPEC-MTP", "ngram": "SPEC-NGRAM"}

@dataclass
class GateResult:
    verdicts: list[Verdict]
    filed_under: dict[tuple[str, str], str] = field(default_factory=dict)  # verdict key -> its requirement row
    waived: dict[tuple[str, str], Waiver] = field(default_factory=dict)  # verdict key -> the waiver used
    expired: list[Waiver] = field(default_factory=list)
    unused: list[Waiver] = field(default_factory=list)

    def row_of(self, v: Verdict) -> str:
        return self.filed_under[v.key]

    @property
    def status(self) -> int:
        return exit_status(self.verdicts, frozenset(self.waived), bool(self.expired))

    def by_requirement_row(self) -> dict[str, list[Verdict]]:
        groups: dict[str, list[Verdict]] = {}
        for v in self.verdicts:
            groups.setdefault(self.row_of(v), []).append(v)
        return dict(sorted(groups.items()))


def row_of(verdict: Verdict, scenario_rows: tuple[str, ...]) -> str:
    """The requirement row a verdict is filed under."""
    for c in verdict.comparisons:
        if not c.equal and c.layer == "methods":
            label = (c.record or c.actual_record or {}).get("row", "")
            return METHOD_ROWS.get(label.split("/")[0], scenario_rows[0])
    return scenario_rows[0]


def where_of(verdict: Verdict) -> str:
    """layer.field of a verdict's first divergence, as a waiver names it."""
    for c in verdict.comparisons:
        if not c.equal and c.first is not None:
            return f"{c.layer}.{c.first.path}"
    return ""


def apply_gate(verdicts: list[Verdict], rows: dict[str, tuple[str, ...]], waivers: list[Waiver],
               today: dt.date | None = None) -> GateResult:
    today = today or dt.date.today()
    result = GateResult(verdicts)
    result.expired = [w for w in waivers if w.expires < today]
    used: set[int] = set()
    for v in verdicts:
        result.filed_under[v.key] = row_of(v, rows.get(v.scenario, ("ENG-SCHED-CORE",)))
        if v.kind != DIVERGED or not v.gating or v.failure:  # a run that then failed: never waived
            continue
        for i, w in enumerate(waivers):
            if w.expires >= today and w.matches(result.row_of(v), v.scenario, where_of(v)):
                result.waived[v.key] = w
                used.add(i)
                break
    result.unused = [w for i, w in enumerate(waivers) if i not in used and w.expires >= today]
    return result
