"""The golden front door. `parity goldens` (which `make goldens` calls) regenerates goldens from
the pinned oracles' own runs, or from a gate's results folder where the oracle already ran; the
goldens suite (parity/test_goldens.py) checks each golden through the same code. Every golden
goes through GoldenStore.regenerate (judging/goldens.py), the one lifecycle: a trace of
ORACLE_RUNS runs, a pin that does not serve a scenario here, a failed run, the GPU write rule.
This module adds which goldens (`Selection`), where their traces come from, the orphans, and
what is said.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.files import shown
from conformance.formats.engine_ref import EngineRef
from conformance.formats.errors import InputError
from conformance.formats.gpu import selected_for_goldens
from conformance.formats.pins import Pins, pin_label
from conformance.formats.scenario import Scenario
from conformance.formats.settings import device_mode
from conformance.gate.results import read_results
from conformance.gate.run import assemble
from conformance.judging.goldens import GOLDENS, ORACLE_RUNS, GoldenOutcome, GoldenRefused, GoldenStore
from conformance.judging.verdict import ORACLE
from conformance.process.launch import prepare_engine
from conformance.process.progress import EngineProgress, Progress
from conformance.process.session import EngineSession


def golden_trace(session: EngineSession, scenario: Scenario) -> dict:
    """The oracle's trace for a golden: every layer of the scenario, ORACLE_RUNS runs."""
    return session.trace(scenario, scenario.layers, repeat=ORACLE_RUNS)


@dataclass(frozen=True)
class Selection:
    """Which goldens (`make goldens PINS= LAYERS= SCENARIOS=`): those of `releases`; with `layers`
    only of the scenarios having any of them ("engine": the engine layers; a golden always holds
    every layer of its scenario); with `names` only of those scenarios."""

    releases: tuple[str, ...]
    layers: tuple[str, ...] = ()
    names: frozenset[str] | None = None

    def chosen(self, name: str, layers, release: str) -> bool:
        return (release in self.releases and (self.names is None or name in self.names)
                and selected_for_goldens(layers, release, "", " ".join(self.layers)))


def refuse_device(wanted: list[tuple[str, list, str]], device: str, store: GoldenStore = GOLDENS) -> None:
    """On a GPU, goldens (scenario name, its layers, pin) of which one a CPU writes are refused
    before any is written (the store refuses each such write too)."""
    refused = [f"{name} ({release})" for name, layers, release in wanted
               if not store.written_here(layers, release, device)]
    if refused:
        raise GoldenRefused(f"on a GPU, goldens are written only for the engine layers of pins without a "
                            f"CPU engine build; {len(refused)} selected goldens are written on CPU "
                            f"(first: {refused[0]}). Run `make goldens PINS=0.33.0 LAYERS=engine`")


def oracle_runs(selection: Selection, scenarios: list[Scenario], pins: Pins, log,
                write: bool) -> Iterator[tuple[str, dict]]:
    """(pin, its oracle trace) for each golden selected: one warm session per pin, every pin's
    environment built first (and, when writing on a GPU, every golden checked for the device)."""
    work = [(release, [s for s in scenarios if selection.chosen(s.name, s.layers, release)])
            for release in selection.releases]
    work = [(release, mine) for release, mine in work if mine]
    if write:
        refuse_device([(s.name, s.layers, release) for release, mine in work for s in mine], device_mode())
    work = [(prepare_engine(EngineRef.pin(release), pins, log), mine) for release, mine in work]
    # progress: each pin's cold start and scenarios count one each, the time left by estimate
    with Progress(sum(len(mine) + 1.0 for _, mine in work), log) as progress:
        for spec, mine in work:
            steps = EngineProgress(progress, "goldens", spec.label, [(s.name, s.layers, 1.0) for s in mine], 1.0)
            with EngineSession(spec, progress=steps) as session:
                for scenario in mine:
                    yield spec.release, golden_trace(session, scenario)


def results_runs(folders: list[Path], selection: Selection, pins: Pins, log,
                 write: bool) -> Iterator[tuple[str, dict]]:
    """(pin, its oracle trace) for each golden selected, from a gate's results folders (every
    shard's, made by this checkout): the oracle's traces only, each scenario's units together.
    The other pins ran once, as stand-ins: their goldens come from `parity goldens --engine`."""
    manifest, traces = read_results(folders, pins)
    if manifest.layers is not None:
        raise InputError(f"--from-results: the gate ran only --layers {','.join(manifest.layers)}; a golden "
                         "holds every layer of its scenario: run the gate without --layers")
    oracle = next(e for e in manifest.engines if e.role == ORACLE)
    for release in selection.releases:
        if release != oracle.release:
            log(f"[goldens] {pin_label(release)}: not the oracle of these results (only the oracle, "
                f"{pin_label(oracle.release)}, ran twice, as a golden needs): `parity goldens --engine {release}` "
                "writes its goldens")
    chosen = [s for s in manifest.scenarios if selection.chosen(s["name"], s["layers"], oracle.release)]
    ran = {u.scenario for u in manifest.units if u.engine == oracle.key}
    for s in chosen:
        if s["name"] not in ran:  # the plan refused every layer of it (no engine build here)
            log(f"[goldens] none for this pin here: {GOLDENS.path(s['name'], oracle.release)}: the gate did "
                f"not run its oracle on {', '.join(s['layers'])} here")
    if write:
        refuse_device([(s["name"], s["layers"], oracle.release) for s in chosen], manifest.device)
    for _, trace in assemble([oracle], [s["name"] for s in chosen], manifest.units, traces):
        yield oracle.release, trace


def regenerate(runs, write: bool, say, store: GoldenStore = GOLDENS) -> list[GoldenOutcome]:
    """Each (pin, oracle trace) through the store's one lifecycle; `say` is told each change
    before it is written. A refusal ends the runs there: their engine sessions are closed
    before the error goes on, not left to garbage collection at exit, where closing one would
    start a thread in a finalizing interpreter and hang."""
    try:
        return [store.regenerate(trace, release, write, say) for release, trace in runs]
    finally:
        if hasattr(runs, "close"):  # a generator (oracle_runs, results_runs)
            runs.close()


def report(outcomes: list[GoldenOutcome], orphans: list[Path], check: bool, log) -> int:
    """What was done, said; the exit status: 2 when a run failed, 1 when a golden would change
    (check) or an orphan is found, else 0."""
    for path in orphans:
        log(f"[goldens] orphan: {shown(path)} is not the golden of a scenario and a pin "
            "(a golden of neither, or a killed write's temporary file)")
    unsupported = [o for o in outcomes if o.unsupported]
    failed = [o for o in outcomes if o.failure]
    for o in unsupported:
        log(f"[goldens] none for this pin here: {o.path}: unsupported: {o.unsupported}")
    for o in failed:
        log(f"[goldens] not written: {o.path}: {o.failure}")
    changed = sum(o.changes for o in outcomes)
    log(f"[goldens] {changed} {'would change' if check else 'written'}, {len(orphans)} orphaned, "
        f"{len(unsupported)} unsupported here, {len(failed)} failed")
    if failed:
        return 2
    return 1 if (check and changed) or orphans else 0


