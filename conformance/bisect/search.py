"""The port queue of an upstream range A..B: which first-parent commits change what an engine
must do, found by building commit pins (conformance/process/commit_env.py) and running scenarios.

1. The first-parent commits of A..B, each with the files it changes against its first parent.
   A commit touching no file of the measured scheduling code (adequacy_scope.toml's files, those
   `make adequacy` measures) cannot change a stand-in trace: it is counted, not built.
2. The rest are searched per group of scenarios: the traces of both ends of an interval are
   compared scenario by scenario; where none differ, nothing in between is built; where some
   do, the interval is halved and only the differing scenarios follow each half, down to the
   one commit whose trace differs from its predecessor's. A change undone inside an interval
   that is never split is not seen (the search assumes a difference, once made, stays).
3. For each such commit: its subject and PR number, the scenarios and engine-matrix rows it
   changes, and in each the first differing field with its values before and after.

Builds are commit pins' environments, cached by commit like any pin's; each is timed and the
builds left are said as the search goes.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from conformance.adequacy.scope import load_scope
from conformance.formats.engine_ref import EngineRef
from conformance.formats.log import log
from conformance.formats.pins import CommitPin, Pins
from conformance.formats.protocol import ENGINE_LAYERS
from conformance.formats.scenario import Scenario
from conformance.formats.trace import Failure
from conformance.judging.compare import compare_layer
from conformance.process.commit_env import changed_files, git
from conformance.process.envs import env_dir, ensure_env
from conformance.process.launch import prepare_engine
from conformance.process.progress import duration
from conformance.process.session import EngineSession
from conformance.report.port_queue import Change, PortQueue, QueueEntry


class Outcome(NamedTuple):
    """What a commit's run of one scenario gave: its records, and its failure if it had one."""

    layers: dict
    failure: Failure | None


def scheduling_files() -> set[str]:
    """The files of the measured scheduling code (adequacy_scope.toml), as paths in vLLM's repo."""
    return {path for path, _ in load_scope().measure}


def first_parent(repo: Path, start: str, end: str) -> list[tuple[str, str]]:
    """(sha, subject) of each first-parent commit of start..end, oldest first."""
    out = git(repo, "log", "--first-parent", "--reverse", "--format=%H%x00%s", f"{start}..{end}")
    return [tuple(line.split("\0", 1)) for line in out.splitlines() if line]


class Bisect:
    def __init__(self, repo: Path, source: str, base: str, pins: Pins, scenarios: list[Scenario],
                 layers: list[str] | None, log=log):
        self.repo, self.source, self.base, self.pins, self.log = repo, source, base, pins, log
        self.scenarios = {s.name: s for s in scenarios}
        self.layers = layers
        self._traces: dict[str, dict[str, dict]] = {}
        self.builds, self.built, self.points = 0, 0, []  # commits run, environments built now

    def layers_of(self, scenario: Scenario) -> list[str]:
        """--layers where the scenario has them, else its stand-in layers (no whole engine)."""
        if self.layers:
            return [layer for layer in scenario.layers if layer in self.layers]
        return [layer for layer in scenario.layers if layer not in ENGINE_LAYERS]

    def traces(self, sha: str) -> dict[str, dict]:
        """Every scenario's layers at commit `sha` (its environment built once, then cached)."""
        if sha in self._traces:
            return self._traces[sha]
        pin = CommitPin(sha, self.base, self.source)
        pins = replace(self.pins, commits=self.pins.commits + (pin,))
        started = time.monotonic()
        self.builds += 1
        left = len([p for p in self.points if p not in self._traces and p != sha])
        cached = (env_dir(pin.name, None, pins) / "READY").exists()
        self.log(f"[bisect] commit {self.builds} of at most {self.builds + left}: {pin.label} "
                 f"({'its environment cached' if cached else 'building its environment'}; at most {left} left after it)")
        ensure_env(pin.name, self.log, pins)
        built = time.monotonic() - started
        self.built += not cached
        out = {}
        with EngineSession(prepare_engine(EngineRef.pin(pin.name), pins, self.log)) as session:
            for name, scenario in self.scenarios.items():
                trace = session.trace(scenario, self.layers_of(scenario))
                out[name] = Outcome(trace.layers, trace.failure)
        self.log(f"[bisect] {pin.label}: environment {'cached' if cached else 'built in ' + duration(built)}, "
                 f"{len(out)} scenarios in "
                 f"{duration(time.monotonic() - started - built)}")
        self._traces[sha] = out
        return out

    def differing(self, a: str, b: str, names: list[str]) -> list[str]:
        ta, tb = self.traces(a), self.traces(b)
        return [n for n in names if ta[n] != tb[n]]

    def change(self, before: str, after: str, name: str) -> Change:
        """The first field where scenario `name` differs between two commits."""
        a, b = self.traces(before)[name], self.traces(after)[name]
        rows = self.scenarios[name].rows
        if a.failure != b.failure:
            return Change(name, rows, "run", "failure", "failure", a.failure and a.failure.message,
                          b.failure and b.failure.message)
        for layer in sorted(set(a.layers) | set(b.layers), key=lambda x: self.scenarios[name].layers.index(x)
                            if x in self.scenarios[name].layers else 99):
            compared = compare_layer(layer, a.layers.get(layer, []), b.layers.get(layer, []))
            if not compared.equal:
                first = compared.first
                return Change(name, rows, layer, compared.where, first.path if first else "?",
                              first.expected if first else None, first.actual if first else None)
        return Change(name, rows, "?", "?", "?", None, None)

    def search(self, points: list[str], subjects: dict[str, str]) -> list[QueueEntry]:
        found: dict[int, list[str]] = {}

        def halve(lo: int, hi: int, names: list[str]) -> None:
            names = self.differing(points[lo], points[hi], names)
            if not names:
                return
            if hi == lo + 1:
                found.setdefault(hi, []).extend(names)
                return
            mid = (lo + hi) // 2
            halve(lo, mid, names)
            halve(mid, hi, names)

        self.points = points
        halve(0, len(points) - 1, sorted(self.scenarios))
        return [QueueEntry(points[i], subjects[points[i]],
                           tuple(self.change(points[i - 1], points[i], n) for n in sorted(set(found[i]))))
                for i in sorted(found)]


def bisect(repo: Path, source: str, base: str, start: str, end: str, pins: Pins, scenarios: list[Scenario],
           layers: list[str] | None, log=log) -> PortQueue:
    """The port queue of start..end (revisions of `repo`) for these scenarios (module doc)."""
    start, end = (git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip() for rev in (start, end))
    commits = first_parent(repo, start, end)
    watched = scheduling_files()
    relevant = [sha for sha, _ in commits if watched & set(changed_files(repo, sha))]
    log(f"[bisect] {start[:12]}..{end[:12]}: {len(commits)} first-parent commits; {len(relevant)} touch the "
        f"measured scheduling code ({len(commits) - len(relevant)} do not: not built)")
    search = Bisect(repo, source, base, pins, scenarios, layers, log)
    entries = search.search([start] + relevant, dict(commits)) if relevant else []
    return PortQueue(start, end, len(commits), len(commits) - len(relevant), search.builds, entries,
                     len(scenarios), tuple(layers or ()), search.built)
