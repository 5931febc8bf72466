"""The pull request's text of an oracle bump (`parity bump`), in markdown.

Old oracle -> new oracle, per scenario and layer: the first differing field with both values,
and the upstream change that explains it where upstream-changes.toml knows one; unchanged
scenarios counted, not listed. Every value is escaped as render_ci escapes the gate's summary
(the goldens and the facts are shown, never obeyed): _text for text, _code inside a code span
(a backslash escapes nothing there, so a backtick in a _text value would close the span).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from conformance.formats.errors import InputError
from conformance.formats.files import read_toml
from conformance.formats.pins import REPO_ROOT, is_commit_name, load_pins
from conformance.report.drift import DEPARTS, SAME, Drift, shown_apart
from conformance.report.render_ci import _code, _text

NOTES = REPO_ROOT / "upstream-changes.toml"


class NotesError(InputError):
    """upstream-changes.toml is malformed."""


@dataclass(frozen=True)
class Note:
    """An upstream change: the release that first carries it, and the fields it changes."""

    release: str
    upstream: tuple[str, ...]
    fields: tuple[str, ...]
    says: str

    def explains(self, older: str, newer: str, layer: str, field: str) -> bool:
        """It lies between the two releases (either way round) and names the field."""
        pins = load_pins()  # a pinned commit is read as its base release
        low, high = sorted((Version(pins.base(older)), Version(pins.base(newer))))
        return low < Version(self.release) <= high and any(
            fnmatch.fnmatchcase(f"{layer}.{field}", pattern) for pattern in self.fields)

    @property
    def name(self) -> str:
        return ", ".join(self.upstream)


def load_notes(path: Path = NOTES) -> tuple[Note, ...]:
    table = read_toml(path, lambda exc: NotesError(f"{path.name}: cannot read: {exc}"))
    notes = []
    for number, entry in enumerate(table.get("change", []), 1):
        where = f"{path.name}: [[change]] {number}"
        if set(entry) != {"release", "upstream", "fields", "says"}:
            raise NotesError(f"{where}: expected the keys release, upstream, fields, says; got {sorted(entry)}")
        try:
            Version(entry["release"])
        except (InvalidVersion, TypeError):
            raise NotesError(f"{where}: release {entry['release']!r} is not a version") from None
        if not all(isinstance(x, str) for x in [*entry["upstream"], *entry["fields"], entry["says"]]):
            raise NotesError(f"{where}: upstream and fields are lists of strings, says a string")
        notes.append(Note(entry["release"], tuple(entry["upstream"]), tuple(entry["fields"]), entry["says"]))
    return tuple(notes)


def pull_request_text(old: str, new: str, drifts: list[Drift], notes: tuple[Note, ...],
                      sections: list[tuple[str, list[str]]]) -> str:
    """`drifts`: each scenario's goldens of `old` against `new`; `sections`: what the bump did
    and checked, as (heading, lines) in the order shown."""
    lines = [f"# Bump the gate oracle: vLLM {_text(_named(old))} -> {_text(_named(new))}", "",
             f"Made by {_code(f'parity bump {new}')} ({_code(f'make bump PIN={new}')}).", ""]
    for heading, body in sections:
        lines += [f"## {_text(heading)}", "", *[f"- {_text(line, cut=2000)}" for line in body], ""]
    lines += _drift_section(old, new, drifts, notes)
    return "\n".join(lines).rstrip() + "\n"


def _named(pin: str) -> str:
    """A release as itself, a pinned commit as reports name it (vllm@<sha12>)."""
    return f"vllm@{pin}" if is_commit_name(pin) else pin


def _drift_section(old: str, new: str, drifts: list[Drift], notes: tuple[Note, ...]) -> list[str]:
    departing = [d for d in drifts if d.status == DEPARTS]
    same = [d for d in drifts if d.status == SAME]
    other = [d for d in drifts if d.status not in (DEPARTS, SAME)]
    lines = [f"## What the oracle says now: {_text(_named(old))} -> {_text(_named(new))}, per scenario and layer", "",
             f"From the goldens: the first field where each layer of a scenario differs. "
             f"{len(departing)} scenario(s) differ, {len(same)} unchanged (not listed), "
             f"{len(other)} not compared.", ""]
    used: list[Note] = []
    if departing:
        lines += [f"| scenario | layer | first difference | {_text(old)} | {_text(new)} | why |",
                  "|---|---|---|---|---|---|"]
        for d in departing:
            for layer, change in d.departs:
                why = [n for n in notes if n.explains(old, new, layer, change.field)]
                used += [n for n in why if n not in used]
                refs = ", ".join(f"[{used.index(n) + 1}]" for n in why) or "not known"
                was, now = shown_apart(change.old, change.new, 60)
                lines.append(f"| {_text(d.scenario)} | {_text(layer)} | {_text(change.at)} "
                             f"{_code(change.field, table=True)} | {_code(was, table=True)} "
                             f"| {_code(now, table=True)} | {refs} |")
        lines.append("")
    if other:
        lines += ["Not compared:", ""] + [f"- {_text(d.scenario)}: {_text(d.status)}" for d in other] + [""]
    if used:
        lines += ["Upstream changes:", ""]
        lines += [f"{i}. {_text(n.name)} (first in {_text(n.release)}): {_text(n.says, cut=2000)}"
                  for i, n in enumerate(used, 1)]
        lines.append("")
    return lines
