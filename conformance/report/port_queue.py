"""The port queue `parity bisect` finds (conformance/bisect/search.py), rendered as text for a
terminal and as markdown for a pull request or a ticket: the upstream commits in a range that
change what an engine must do, each with what it changes, then how many change nothing.

Every string from a commit (its subject) or a trace (a field's values) is escaped for the
markdown sink and bounded in length.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

PR = re.compile(r"\(#(\d{1,7})\)")
SHOWN = 120  # characters of a value shown


@dataclass(frozen=True)
class Change:
    """Where one scenario's trace first differs between a commit's parent point and the commit."""

    scenario: str
    rows: tuple[str, ...]
    layer: str
    where: str  # "record 0", "step 3", "row dflash/K=8"
    path: str  # the field, e.g. max_num_scheduled_tokens
    before: object
    after: object


@dataclass(frozen=True)
class QueueEntry:
    sha: str
    subject: str
    changes: tuple[Change, ...]

    @property
    def pr(self) -> str | None:
        """The PR number of the subject's last `(#NNNNN)`, as upstream's squash merges write it."""
        found = PR.findall(self.subject)
        return found[-1] if found else None

    @property
    def scenarios(self) -> list[str]:
        return sorted({c.scenario for c in self.changes})

    @property
    def rows(self) -> list[str]:
        return sorted({r for c in self.changes for r in c.rows})


@dataclass
class PortQueue:
    start: str  # sha of A
    end: str  # sha of B
    commits: int  # first-parent commits in A..B
    skipped: int  # touching no measured scheduling file: not built
    run: int  # commits the search ran (A's included)
    entries: list[QueueEntry] = field(default_factory=list)
    scenarios: int = 0
    layers: tuple[str, ...] = ()
    built: int = 0  # of those, the environments built by this search (the rest were cached)

    @property
    def unchanged(self) -> int:
        return self.commits - len(self.entries)


def shown(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def render_text(queue: PortQueue) -> str:
    lines = [f"port queue {queue.start[:12]}..{queue.end[:12]}: {queue.commits} first-parent commits, "
             f"{queue.skipped} touching no measured scheduling file (not built), {queue.run} run "
             f"({queue.built} built now); "
             f"{queue.scenarios} scenarios on {', '.join(queue.layers) or 'their stand-in layers'}"]
    for number, entry in enumerate(queue.entries, 1):
        pr = f" (PR #{entry.pr})" if entry.pr else ""
        lines.append(f"{number}. {entry.sha[:12]} {shown(entry.subject)}{pr}")
        lines.append(f"   changes {len(entry.scenarios)} scenarios: {', '.join(entry.scenarios)}; "
                     f"rows: {', '.join(entry.rows)}")
        for c in entry.changes:
            lines.append(f"   {c.scenario}: {c.layer} {c.where}: {c.path} {shown(c.before)} -> {shown(c.after)}")
    lines.append(f"{queue.unchanged} of {queue.commits} commits change nothing in these scenarios.")
    return "\n".join(lines)


def _md(text: str) -> str:
    """Inline markdown: a value's characters never make markup, a link or a table cell."""
    return re.sub(r"([\\`*_{}\[\]()<>#+!|~])", r"\\\1", text).replace("\n", " ")


def render_markdown(queue: PortQueue) -> str:
    lines = [f"### Port queue `{queue.start[:12]}..{queue.end[:12]}`", "",
             f"{queue.commits} first-parent commits; {queue.skipped} touch no measured scheduling file "
             f"and were not built; {len(queue.entries)} change what an engine must do "
             f"({queue.scenarios} scenarios, layers: {', '.join(queue.layers) or 'stand-in'}).", "",
             "| # | commit | PR | subject | scenarios | rows | first difference |", "|---|---|---|---|---|---|---|"]
    for number, entry in enumerate(queue.entries, 1):
        first = "<br>".join(f"{_md(c.scenario)}: {_md(c.layer)} {_md(c.where)}: {_md(c.path)} "
                            f"{_md(shown(c.before))} → {_md(shown(c.after))}" for c in entry.changes)
        lines.append(f"| {number} | `{entry.sha[:12]}` | {'#' + entry.pr if entry.pr else ''} | "
                     f"{_md(shown(entry.subject))} | {_md(', '.join(entry.scenarios))} | "
                     f"{_md(', '.join(entry.rows))} | {first} |")
    lines += ["", f"{queue.unchanged} of {queue.commits} commits change nothing in these scenarios."]
    return "\n".join(lines) + "\n"
