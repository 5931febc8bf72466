"""The trace-mutation catalog: the comparator's own adequacy (`parity adequacy --catalog traces`).

The mutant catalogs edit vLLM and ask whether the scenarios tell; this one edits the oracle's
own records (conformance/adequacy/trace_mutants.py) and asks whether the judge tells. Every
golden of the library, on every pin, is served back as a candidate's run, once as it is (it
must pass: a judge that failed everything would catch every mutant) and once per mutant
(each must be `diverged` or `protocol`, or pass as an intended exception with its reason).

Each candidate run is judged by the gate's own path (gate/run.py `finish`): the scenario's
units as the gate plans them (shards.plan: config apart from steps and outputs), each unit's
trace made as a session makes it (formats/trace.py make_trace; a production scenario's steps
and outputs received into the digest sinks that expect the golden's digests, record by record),
the units assembled (gate/run.py assemble), checked, and judged (judging.judge_layers).

The digest form is judged twice over:
  - every library golden's steps and outputs again in the digest form (its *digest twin*: the
    golden's records digested as `parity goldens` digests a production run), the candidate's
    mutated records received by the sinks, so the digest, its context runs and its comparison
    see every mutant the full form sees;
  - every production golden itself. Its records are not held whole: the candidate's run is the
    golden's digest entries (`Known`, a TEST DOUBLE of the oracle's records, each standing for
    the record whose digest it is) with the golden's checkpoints (records kept whole) as
    records, which the mutants edit; records dropped, copied and swapped anywhere.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace

from conformance.adequacy.trace_mutants import EXCEPTIONS, Known, Mutant, mutants
from conformance.formats.digest import LAYERS as DIGEST_LAYERS, DigestSink, digest_of, expand_context
from conformance.formats.engine_ref import EngineRef
from conformance.formats.pins import load_pins
from conformance.formats.trace import Trace
from conformance.gate.run import assemble
from conformance.gate.shards import plan
from conformance.judging.goldens import GOLDENS, Golden, GoldenStore, without_windows
from conformance.judging.judging import judge_layers, served_layers
from conformance.process.session import trace_of_records
from conformance.judging.verdict import CANDIDATE, DIVERGED, MISSING_GOLDEN, PASS, PROTOCOL, Verdict

CAUGHT = (DIVERGED, PROTOCOL)
CANDIDATE_ENGINE = EngineRef.parse("candidate-engine --parity", ()).with_role(CANDIDATE)
ASKED = SimpleNamespace(layers=None, require_layers=None, require_features=None)  # the gate's defaults


@dataclass(frozen=True)
class Target:
    """A golden served back as a candidate's run: `layers` are the candidate's records (Known
    where a production golden holds only digests), `digest_layers` those received in the digest
    form, judged against `golden`."""

    name: str
    scenario: object
    golden: Trace
    layers: dict
    digest_layers: frozenset = frozenset()
    twin: bool = False  # a library golden judged again in the digest form


def targets(scenarios, releases, store: GoldenStore = GOLDENS, twins: bool = True):
    """Every golden of `scenarios` on `releases` as a Target (its digest twin after it); a
    golden that cannot be read is (name, why) instead."""
    for scenario in scenarios:
        for release in releases:
            golden = store.lookup(scenario.name, release)
            name = f"{scenario.name}/vllm-{release}"
            if golden.trace is None:
                if golden.kind != MISSING_GOLDEN:  # a pin with no golden of it is not in the library
                    yield name, golden.message
                continue
            trace = without_windows(golden.trace)
            digests = trace.forms
            if digests:  # a production golden
                held = {layer: _held(layer, form) for layer, form in digests.items()}
                yield Target(name, scenario, trace, {**trace.layers, **held}, frozenset(digests))
                continue
            yield Target(name, scenario, trace, dict(trace.layers))
            twin = [layer for layer in DIGEST_LAYERS if layer in trace.layers]
            if twins and twin:
                yield Target(f"{name} (digest form)", scenario, digest_twin(trace, twin),
                             dict(trace.layers), frozenset(twin), twin=True)


def digest_twin(golden: Trace, layers: list[str]) -> Trace:
    """The golden with `layers` in the digest form, digested from its records."""
    forms = {}
    for layer in layers:
        sink = DigestSink(layer)
        for record in golden.layers[layer]:
            sink.append(record)
        forms[layer] = sink.to_json()
    return replace(golden, layers={k: v for k, v in golden.layers.items() if k not in layers}, digests=forms)


def _held(layer: str, form: dict) -> list:
    """A production golden's layer as a candidate could send it: its checkpoints whole, every
    other record by its digest entry and context."""
    count = form["count"]
    contexts = expand_context(form.get("context", []), count) if layer == "steps" else [{}] * count
    kept = form.get("checkpoints", {})
    return [kept[str(i)] if str(i) in kept else Known(entry, contexts[i])
            for i, entry in enumerate(form["records"])]


class Received(DigestSink):
    """A digest sink fed a candidate's run: records as a session feeds them, and Known items, the
    oracle's records by their digest (kept out of the records around a difference)."""

    def feed(self, item) -> None:
        if not isinstance(item, Known):
            self.append(item)
            return
        index = self._received
        self._received += 1
        if self.problem is not None:
            return
        self.entries.append(item.entry)
        if self.layer == "steps" and (not self.context or self.context[-1][1] != item.context):
            self.context.append([index, item.context])
        self._watch(index, digest_of(item.entry), item.context, None)
        self._ring.append((index, None))

    def _checkpoint_last(self) -> None:
        if self._ring[-1][1] is not None:
            super()._checkpoint_last()

    def to_json(self) -> dict:
        out = super().to_json()
        for name in ("window", "context_window"):
            if name in out:  # the run of records held, from the first
                window = out[name]
                held = [(window["from"] + i, r) for i, r in enumerate(window["records"]) if r is not None]
                run = [r for k, (i, r) in enumerate(held) if i == held[0][0] + k] if held else []
                out[name] = dict(window, records=run, **({"from": held[0][0]} if held else {}))
        return out


class _Held:
    """The golden store of one golden (judge_layers' `store`)."""

    def __init__(self, trace: Trace):
        self.trace = trace

    def lookup(self, scenario: str, release: str) -> Golden:
        return Golden(Path(scenario), self.trace)


def judge_run(target: Target, layers: dict) -> Verdict:
    """A candidate's run of `target`'s scenario that sent `layers`, judged as the gate judges it."""
    engine, scenario, golden = CANDIDATE_ENGINE, target.scenario, target.golden
    units = plan([(engine.key, 1)], [scenario], None)
    hello = {"engine": golden.engine.get("name"), "version": golden.engine.get("version"),
             "protocol": golden.engine.get("protocol")}
    traces = {}
    for unit in units:
        sent = {}
        for layer in unit.layers:
            items = layers.get(layer, [])
            if layer in target.digest_layers:
                sink = Received(layer, golden.forms[layer])
                for item in items:
                    sink.feed(item)
                sent[layer] = sink
            else:
                sent[layer] = items
        traces[unit.key] = trace_of_records(engine.label, hello, scenario, sent)
    # the gate then checks the assembled trace for its reports; judge_trace checks it again
    [(_, trace)] = assemble([engine], [scenario.name], units, traces)
    info = {"name": scenario.name, "layers": scenario.layers}
    served = served_layers([engine], units, traces)[engine.key]
    verdict, _ = judge_layers(trace, engine, info, units, ASKED, _pins(), served, _Held(golden))
    return verdict


@cache
def _pins():
    return load_pins()


@dataclass
class CatalogRun:
    goldens: int = 0  # served back and judged, digest twins counted apart
    twins: int = 0
    mutants: int = 0
    caught: int = 0
    excepted: Counter = field(default_factory=Counter)  # exception -> mutants that passed as it
    survivors: list = field(default_factory=list)  # (golden, mutant name, verdict kind, first line)
    unjudged: list = field(default_factory=list)  # (golden, why): no baseline to mutate
    seconds: float = 0.0

    @property
    def judged(self) -> int:
        return self.mutants - sum(self.excepted.values())

    @property
    def ok(self) -> bool:
        return not self.survivors and not self.unjudged


def run_catalog(scenarios, releases, seed: int, log, per_kind: int | None = None,
                store: GoldenStore = GOLDENS, twins: bool = True) -> CatalogRun:
    """Every golden's mutants judged (with `per_kind`, a seeded sample of that many of each
    family per golden); progress to `log` every 10 seconds."""
    run, start, said = CatalogRun(), time.monotonic(), time.monotonic()
    chosen = list(targets(scenarios, releases, store, twins))
    for n, target in enumerate(chosen, 1):
        if not isinstance(target, Target):
            run.unjudged.append(target)
            continue
        baseline = judge_run(target, target.layers)
        if baseline.kind != PASS:
            run.unjudged.append((target.name, f"the golden served back unchanged is {baseline.kind}, not pass: "
                                 f"{_first_line(baseline)}"))
            continue
        run.twins += target.twin
        run.goldens += not target.twin
        for mutant in _chosen(mutants(target.layers, seed, target.name), per_kind, seed, target.name):
            run.mutants += 1
            verdict = judge_run(target, mutant.apply(target.layers))
            if verdict.kind in CAUGHT:
                run.caught += 1
            elif verdict.kind == PASS and mutant.exception:
                run.excepted[mutant.exception] += 1
            else:
                run.survivors.append((target.name, mutant.name, verdict.kind, _first_line(verdict)))
        if time.monotonic() - said >= 10 or n == len(chosen):
            said = time.monotonic()
            log(f"[adequacy] traces: {n}/{len(chosen)} goldens and digest forms, {run.mutants} mutants, "
                f"{run.caught} caught, "
                f"{len(run.survivors)} not caught, {said - start:.0f} s")
    run.seconds = time.monotonic() - start
    return run


def _chosen(found: list[Mutant], per_kind: int | None, seed: int, salt: str) -> list[Mutant]:
    if per_kind is None:
        return found
    by_kind: dict[str, list[Mutant]] = {}
    for mutant in found:
        by_kind.setdefault(mutant.kind, []).append(mutant)
    rng = random.Random(f"{seed}/{salt}/sample")
    return [m for kind in by_kind for m in (by_kind[kind] if len(by_kind[kind]) <= per_kind
                                             else rng.sample(by_kind[kind], per_kind))]


def _first_line(verdict: Verdict) -> str:
    differing = next((c for c in verdict.comparisons if not c.equal), None)
    if differing is not None and differing.first is not None:
        return f"{differing.layer} {differing.where}: {differing.first.path}"
    return next(iter(verdict.message.splitlines()), "")[:200]


def render_catalog(run: CatalogRun) -> str:
    """The catalog's block of `parity adequacy`."""
    judged = run.judged
    rate = 100.0 * run.caught / judged if judged else 0.0
    lines = [f"-- trace mutations: {run.goldens} golden{'s' if run.goldens != 1 else ''} served back as candidates "
             f"({run.twins} of them again in the digest form), {run.mutants} mutants in {run.seconds:.0f} s",
             f"   caught (diverged or protocol): {run.caught}/{judged} = {rate:.1f}%"]
    for key, n in sorted(run.excepted.items()):
        lines.append(f"   passed as intended ({key}): {n}: {EXCEPTIONS[key]}")
    for name, why in run.unjudged:
        lines.append(f"   NOT JUDGED {name}: {why}")
    for name, mutant, kind, first in run.survivors:
        lines.append(f"   NOT CAUGHT {name}: {mutant}: {kind}" + (f" ({first})" if first else ""))
    return "\n".join(lines)
