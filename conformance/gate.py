"""The release gate: verdicts grouped by engine-matrix row, and waivers.

A waiver names one divergence a team has decided to live with for a while:
    [[waiver]]
    row = "ENG-SCHED-CORE"            # engine-matrix row
    scenario = "prefill_budget_binds"
    field = "steps.requests.r1.tokens"  # layer.field of the first divergence (fnmatch pattern)
    reason = "..."
    owner = "..."
    expires = 2027-01-31
An expired waiver fails the gate (it must be renewed or removed); an unused one is reported.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .verdict import DIVERGED, Verdict, exit_status

# Methods-layer rows are attributed by method: the first segment of a row label like pard/K=8.
METHOD_ROWS = {"dflash": "SPEC-DFLASH", "dspark": "SPEC-DSPARK", "draft-model": "SPEC-DRAFT-MODEL",
               "pard": "SPEC-DRAFT-MODEL", "eagle3": "SPEC-EAGLE", "p-eagle": "SPEC-EAGLE",
               "mtp": "SPEC-MTP", "ngram": "SPEC-NGRAM"}
WAIVER_KEYS = {"row": str, "scenario": str, "field": str, "reason": str, "owner": str, "expires": dt.date}


class WaiverError(ValueError):
    """The waivers file is malformed; the message names the waiver and the field."""


@dataclass(frozen=True)
class Waiver:
    row: str
    scenario: str
    field: str
    reason: str
    owner: str
    expires: dt.date

    def matches(self, row: str, scenario: str, where: str) -> bool:
        return self.row == row and self.scenario == scenario and fnmatch.fnmatchcase(where, self.field)


@dataclass
class GateResult:
    verdicts: list[Verdict]
    rows: dict[str, str] = field(default_factory=dict)  # id(verdict) -> its row
    waived: dict[int, Waiver] = field(default_factory=dict)  # id(verdict) -> the waiver used
    expired: list[Waiver] = field(default_factory=list)
    unused: list[Waiver] = field(default_factory=list)

    def row_of(self, v: Verdict) -> str:
        return self.rows[id(v)]

    @property
    def status(self) -> int:
        return exit_status(self.verdicts, frozenset(self.waived), bool(self.expired))

    def by_row(self) -> dict[str, list[Verdict]]:
        groups: dict[str, list[Verdict]] = {}
        for v in self.verdicts:
            groups.setdefault(self.row_of(v), []).append(v)
        return dict(sorted(groups.items()))


def load_waivers(path: Path | None) -> list[Waiver]:
    if path is None or not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise WaiverError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"waiver"}
    if unknown:
        raise WaiverError(f"{path}: unknown top-level keys {sorted(unknown)}; expected [[waiver]] tables")
    waivers = []
    for i, raw in enumerate(data.get("waiver", [])):
        where = f"{path}: waiver[{i}]"
        extra = set(raw) - set(WAIVER_KEYS)
        if extra:
            raise WaiverError(f"{where}.{sorted(extra)[0]}: unknown key; allowed: {sorted(WAIVER_KEYS)}")
        for key, typ in WAIVER_KEYS.items():
            if not isinstance(raw.get(key), typ) or (typ is str and not raw[key].strip()):
                raise WaiverError(f"{where}.{key}: required, of type {typ.__name__} "
                                  f"(expires is a TOML date like 2027-01-31), got {raw.get(key)!r}")
        waivers.append(Waiver(**{k: raw[k] for k in WAIVER_KEYS}))
    return waivers


def row_of(verdict: Verdict, scenario_rows: tuple[str, ...]) -> str:
    """The engine-matrix row a verdict is filed under."""
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
        result.rows[id(v)] = row_of(v, rows.get(v.scenario, ("ENG-SCHED-CORE",)))
        if v.kind != DIVERGED or not v.gating or v.failure:  # a run that then failed: never waived
            continue
        for i, w in enumerate(waivers):
            if w.expires >= today and w.matches(result.row_of(v), v.scenario, where_of(v)):
                result.waived[id(v)] = w
                used.add(i)
                break
    result.unused = [w for i, w in enumerate(waivers) if i not in used and w.expires >= today]
    return result
