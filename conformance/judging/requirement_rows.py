"""Verdicts filed under requirement rows, with the waivers applied: the gate's result.

A verdict is filed under every engine-matrix row its scenario covers (its `rows`), and a
methods-table divergence also under the row of the method that first differs: the scenario
judges each of those rows at once, so a divergence fails each, and a pass counts for each."""

from __future__ import annotations

import datetime as dt
import fnmatch
from dataclasses import dataclass, field

from conformance.judging.verdict import CANDIDATE, DIVERGED, Verdict, exit_status
from conformance.judging.waivers import Waiver

# Methods-layer rows are attributed by method: the first segment of a row label like pard/K=8.
METHOD_ROWS = {"dflash": "SPEC-DFLASH", "dspark": "SPEC-DSPARK", "draft-model": "SPEC-DRAFT-MODEL",
               "pard": "SPEC-DRAFT-MODEL", "eagle3": "SPEC-EAGLE", "p-eagle": "SPEC-EAGLE",
               "mtp": "SPEC-MTP", "ngram": "SPEC-NGRAM"}

@dataclass
class GateResult:
    verdicts: list[Verdict]
    filed_under: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # verdict key -> its rows
    waived: dict[tuple[str, str], Waiver] = field(default_factory=dict)  # verdict key -> the waiver used
    expired: list[Waiver] = field(default_factory=list)
    unused: list[Waiver] = field(default_factory=list)
    why_unused: dict[Waiver, str] = field(default_factory=dict)  # an unused waiver -> why it covered nothing

    def rows_of(self, v: Verdict) -> tuple[str, ...]:
        return self.filed_under[v.key]

    @property
    def status(self) -> int:
        return exit_status(self.verdicts, frozenset(self.waived), bool(self.expired))

    def by_requirement_row(self) -> dict[str, list[Verdict]]:
        """Each row and the verdicts filed under it (a verdict under each of its rows)."""
        groups: dict[str, list[Verdict]] = {}
        for v in self.verdicts:
            for row in self.rows_of(v):
                groups.setdefault(row, []).append(v)
        return dict(sorted(groups.items()))


def rows_of(verdict: Verdict, scenario_rows: tuple[str, ...]) -> tuple[str, ...]:
    """The requirement rows a verdict is filed under: its scenario's, and for a methods-table
    divergence the row of the method that first differs, first."""
    for c in verdict.comparisons:
        if not c.equal and c.layer == "methods":
            label = (c.record or c.actual_record or {}).get("row", "")
            method = METHOD_ROWS.get(str(label).split("/")[0])
            if method is not None:
                return (method,) + tuple(r for r in scenario_rows if r != method)
    return scenario_rows


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
        result.filed_under[v.key] = rows_of(v, rows.get(v.scenario) or ("ENG-SCHED-CORE",))
        # never waived: a run that then failed, and the oracle (it must reproduce its golden)
        if v.kind != DIVERGED or v.role != CANDIDATE or v.failure:
            continue
        for i, w in enumerate(waivers):
            if w.expires >= today and w.matches(result.rows_of(v), v.scenario, where_of(v), v.engine):
                result.waived[v.key] = w
                used.add(i)
                break
    result.unused = [w for i, w in enumerate(waivers) if i not in used and w.expires >= today]
    result.why_unused = {w: why_unused(w, result) for w in result.unused}
    return result


def why_unused(w: Waiver, result: GateResult) -> str:
    """Why a waiver covered no verdict of this gate, from the first thing it did not match: the
    scenario, the engine, a divergence, a run that then failed, the row, the field, or an
    earlier waiver that took the divergence."""
    ran = [v for v in result.verdicts if v.scenario == w.scenario and v.role == CANDIDATE]
    if not ran:
        return f"no candidate ran scenario {w.scenario} in this gate"
    mine = [v for v in ran if w.covers(v.engine)]
    if not mine:
        return f"engine {w.engine} matches no candidate on {w.scenario}"
    diverged = [v for v in mine if v.kind == DIVERGED]
    if not diverged:
        return f"no candidate diverged on {w.scenario} (" + ", ".join(f"{v.engine}: {v.kind}" for v in mine) + ")"
    waivable = [v for v in diverged if not v.failure]
    if not waivable:
        v = diverged[0]
        return f"{v.engine} diverged on {w.scenario}, then its run failed ({v.failure}): a failure is never waived"
    v = waivable[0]
    if not any(w.row in result.rows_of(v) for v in waivable):
        return f"{w.scenario}'s verdicts are filed under {', '.join(result.rows_of(v))}, not {w.row}"
    if not any(fnmatch.fnmatchcase(where_of(v), w.field) for v in waivable):
        return f"{v.engine} first diverges on {w.scenario} at {where_of(v)}, which {w.field} does not match"
    v = next((v for v in waivable if v.key in result.waived), v)
    other = result.waived.get(v.key)
    if other is None:
        return f"it matches {v.engine} on {w.scenario} only in parts (row, field, engine) no one verdict has"
    return f"an earlier waiver ({other.name}) covers {v.engine} on {w.scenario}"
