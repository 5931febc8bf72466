"""Waivers: a divergence a team has decided to live with for a while.

A waiver names one divergence by requirement row (an engine-matrix row), scenario and
first-divergence field:
    [[waiver]]
    row = "ENG-SCHED-CORE"            # one of the requirement rows the verdict is filed under
    scenario = "prefill_budget_binds"
    field = "steps.requests.r1.tokens"  # layer.field of the first divergence (fnmatch pattern)
    reason = "..."
    owner = "..."
    expires = 2027-01-31
    engine = "port-*"                 # optional: the engine's label in the report (fnmatch pattern)
Without `engine` it covers every candidate. It never covers the oracle, whatever `engine`
says: the oracle not reproducing its own golden is never a known divergence of a port.
An expired waiver fails the gate (it must be renewed or removed); an unused one is reported.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.files import InputFileError, read_text

WAIVER_KEYS = {"row": str, "scenario": str, "field": str, "reason": str, "owner": str, "expires": dt.date}
OPTIONAL_KEYS = {"engine": str}


class WaiverError(InputError):
    """The waivers file is malformed; the message names the waiver and the field."""


@dataclass(frozen=True)
class Waiver:
    row: str
    scenario: str
    field: str
    reason: str
    owner: str
    expires: dt.date
    engine: str | None = None  # a pattern over the engine's label; None: every candidate

    def matches(self, rows: tuple[str, ...], scenario: str, where: str, engine: str) -> bool:
        """`rows`: the requirement rows the verdict is filed under (the waiver names one of
        them); `engine`: the verdict's engine label. The caller never asks for the oracle."""
        return (self.row in rows and self.scenario == scenario and fnmatch.fnmatchcase(where, self.field)
                and self.covers(engine))

    def covers(self, engine: str) -> bool:
        """Does `engine` (a candidate's label) fall under this waiver's `engine` pattern?"""
        return self.engine is None or fnmatch.fnmatchcase(engine, self.engine)

    @property
    def name(self) -> str:
        """row / scenario / field: how every report names the waiver."""
        return f"{self.row} / {self.scenario} / {self.field}"


def load_waivers(path: Path | None) -> list[Waiver]:
    """The waivers in `path` (None: none). A path that does not exist is an error: a typo
    must not silently waive nothing (the command line lets only its default file be absent)."""
    if path is None:
        return []
    if not path.exists():
        raise WaiverError(f"{path}: no such file")
    try:
        data = tomllib.loads(read_text(path, "waivers"))
    except InputFileError as exc:
        raise WaiverError(str(exc)) from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise WaiverError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"waiver"}
    if unknown:
        raise WaiverError(f"{path}: unknown top-level keys {sorted(unknown)}; expected [[waiver]] tables")
    waivers = []
    for i, raw in enumerate(data.get("waiver", [])):
        where = f"{path}: waiver[{i}]"
        extra = set(raw) - set(WAIVER_KEYS) - set(OPTIONAL_KEYS)
        if extra:
            raise WaiverError(f"{where}.{sorted(extra)[0]}: unknown key; allowed: "
                              f"{sorted(WAIVER_KEYS)}, optional {sorted(OPTIONAL_KEYS)}")
        for key, typ in WAIVER_KEYS.items():
            # a TOML date-time is a datetime, a subclass of date: it would pass isinstance and
            # then fail the gate's comparison with today's date after every engine ran
            if not isinstance(raw.get(key), typ) or isinstance(raw[key], dt.datetime) \
                    or (typ is str and not raw[key].strip()):
                raise WaiverError(f"{where}.{key}: required, of type {typ.__name__} "
                                  f"(expires is a TOML date like 2027-01-31, not a date-time), got {raw.get(key)!r}")
        for key, typ in OPTIONAL_KEYS.items():
            if key in raw and (not isinstance(raw[key], typ) or not raw[key].strip()):
                raise WaiverError(f"{where}.{key}: optional, but when given a non-empty {typ.__name__} "
                                  f"(an engine label or an fnmatch pattern like \"port-*\"), got {raw[key]!r}")
        waivers.append(Waiver(**{k: raw[k] for k in WAIVER_KEYS}, **{k: raw[k] for k in OPTIONAL_KEYS if k in raw}))
    return waivers
