"""One engine session: an engine kept warm across the units it runs, and every outcome of a unit
made a trace. `EngineSession.trace(scenario, layers, repeat)` is the one way from a unit of work
to its trace: the gate's execute, `parity run`, `parity goldens` and the goldens suite, the
fuzzer, adequacy's mutants and `parity selfcheck` all run their units through it.

Liveness, one rule: an engine that answered the run (records, a refusal, an `unsupported` layer,
an error it reported, two runs that differ) is warm for the next unit; one the client had to end
(it crashed, did not answer before the timeout, or broke the protocol) is gone, and the next unit
starts it afresh (`cold_starts` counts the starts). An engine that cannot start makes the unit's
trace a failure; the next unit tries again.

Outcomes, each a trace (formats/trace.py): the records, a refused configuration among them; a
failure (`crash`, `timeout`, `protocol`, `engine_error`, `unsupported`, `nondeterministic`) with
the records that arrived; and, for a session that asks only for what the engine declares (a
candidate under the gate), the layers its hello does not declare, in `not_served`, with the
layers it declared in `capabilities`, and a scenario needing a feature the hello does not
declare (hello.features) not sent at all, those features in `unsupported_features`. Only a run cut by a deadline its caller set (`until`) is
no trace: OutOfTime, since it says nothing about the engine.

A production-scale scenario's `steps` and `outputs` are received in the digest form (formats/
digest.py DigestSink), never held whole: `sinks(scenario, layers)`, when the session is given it,
makes each run's sinks (those expecting the golden's digests keep the records around the first
difference from it); else plain ones are made.
"""

from __future__ import annotations

import time
from dataclasses import replace

from conformance.formats.kinds import Kind
from conformance.formats import digest
from conformance.formats.features import declared, not_declared
from conformance.formats.scenario import Scenario
from conformance.formats.trace import Failure, Trace, make_trace
from conformance.process.client import HANDSHAKE_TIMEOUT, RUN_TIMEOUT, EngineFailure, EngineProcess, timeout_setting
from conformance.process.launch import EngineSpec


class OutOfTime(Exception):
    """A start or a run given a deadline (`until`) was cut by it: it says nothing about the engine."""


def served(layers: list[str], hello: dict) -> tuple[list[str], list[str]]:
    """(the layers of `layers` the engine's hello declares, those it does not), in order."""
    declared = hello.get("capabilities", [])
    return [layer for layer in layers if layer in declared], [layer for layer in layers if layer not in declared]


class EngineSession:
    """One engine, started when a unit first needs it and kept warm (see the module).

    declared_only: ask only for the layers the hello declares (the rest in `not_served`);
    handshake_timeout, run_timeout: as EngineProcess's (None: the environment's or defaults);
    progress: told of each cold start (`starting()`), each unit's run (`item()`) and its
    trace (`end()`), as process/progress.py EngineProgress is; sinks: (a production-scale
    scenario, its layers) -> each run's digest sinks (see the module)."""

    def __init__(self, spec: EngineSpec, declared_only: bool = False, handshake_timeout: float | None = None,
                 run_timeout: float | None = None, progress=None, sinks=None):
        self.spec, self.declared_only, self.progress = spec, declared_only, progress
        self.sinks = sinks
        self.handshake_timeout, self.run_timeout = handshake_timeout, run_timeout
        self.cold_starts = 0
        self._proc: EngineProcess | None = None

    @property
    def hello(self) -> dict | None:
        """The running engine's hello (None before it started or once it is gone)."""
        return self._proc.hello if self._proc is not None else None

    def __enter__(self) -> "EngineSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, until: float | None = None) -> EngineProcess:
        """The warm engine, started when there is none (its handshake within `until`, a
        time.monotonic() deadline, when given: OutOfTime when it cut the handshake short).
        EngineFailure when it cannot start."""
        if self._proc is not None and self._proc.alive:
            return self._proc
        self._proc = None
        handshake, cut = self._within(self.handshake_timeout, "VLLM_PARITY_HANDSHAKE_TIMEOUT",
                                      HANDSHAKE_TIMEOUT, until)
        proc = EngineProcess(self.spec, handshake_timeout=handshake, run_timeout=self.run_timeout)
        self.cold_starts += 1
        if self.progress is not None:
            self.progress.starting()
        try:
            proc.start()
        except EngineFailure as failure:
            if cut and failure.kind == Kind.TIMEOUT:
                raise OutOfTime(f"{self.spec.label}: not started within the time limit") from None
            raise
        self._proc = proc
        return proc

    def trace(self, scenario: Scenario, layers: list[str] | None = None, repeat: int = 1,
              until: float | None = None, timeout: float | None = None, needs=None,
              stop_after_step: int | None = None) -> Trace:
        """The trace of one unit: `scenario` on `layers` (default: the scenario's own), run
        `repeat` times in the warm engine (records that differ make a `nondeterministic`
        failure, never a golden). `timeout` bounds each run (default: the session's);
        `until`, a time.monotonic() deadline, bounds the unit, a restart included. `needs`: the
        features the scenario needs (default: Scenario.features; a gate's, as its manifest says).
        `stop_after_step`: the run message's (engines/PROTOCOL.md), for a window replayed live."""
        trace = self._outcome(scenario, list(scenario.layers if layers is None else layers), repeat, until,
                              timeout, scenario.features if needs is None else needs, stop_after_step)
        if self.progress is not None:
            self.progress.end()
        return trace

    def close(self) -> bool:
        """End the engine (`shutdown`, then its process group); True when it exited by itself
        within the protocol's grace (PROTOCOL.md: 10 s)."""
        proc, self._proc = self._proc, None
        return proc.close() if proc is not None else False

    def _outcome(self, scenario: Scenario, layers: list[str], repeat: int, until: float | None,
                 timeout: float | None, needs, stop_after_step: int | None = None) -> Trace:
        try:
            proc = self.start(until)
        except EngineFailure as failure:
            return self._made(scenario, None, failure.partial, failure)
        if self.progress is not None:
            self.progress.item()
        lacking = not_declared(needs, declared(proc.hello)) if self.declared_only else ()
        if lacking:  # not sent: the gate judges it `unsupported`, naming the features
            return self._made(scenario, proc, {}, unsupported_features=lacking)
        asked, missing = served(layers, proc.hello) if self.declared_only else (layers, [])
        if not asked:
            return self._made(scenario, proc, {}, not_served=missing)
        try:
            records = self._runs(proc, scenario, asked, repeat, until, timeout, stop_after_step)
        except EngineFailure as failure:
            return self._made(scenario, proc, failure.partial, failure, missing)
        return self._made(scenario, proc, records, not_served=missing)

    def _runs(self, proc: EngineProcess, scenario: Scenario, layers: list[str], repeat: int,
              until: float | None, timeout: float | None, stop_after_step: int | None) -> dict[str, list]:
        records = None
        made = self.sinks is not None and scenario.scale == "production"
        for _ in range(repeat):
            seconds, cut = self._within(timeout or self.run_timeout, "VLLM_PARITY_RUN_TIMEOUT", RUN_TIMEOUT, until)
            try:
                again = proc.run(scenario, layers, seconds, sinks=self.sinks(scenario, layers) if made else None,
                                 stop_after_step=stop_after_step)
            except EngineFailure as failure:
                if cut and failure.kind == Kind.TIMEOUT:
                    raise OutOfTime(f"{self.spec.label}: the run was cut by the time limit") from None
                raise
            if records is not None and again != records:
                raise EngineFailure(Kind.NONDETERMINISTIC, _nondeterminism(scenario, records, again), records)
            records = again
        return records

    def _made(self, scenario: Scenario, proc: EngineProcess | None, records: dict,
              failure: EngineFailure | None = None, not_served: list[str] | None = None,
              unsupported_features=()) -> Trace:
        hello = proc.hello if proc is not None else {}
        capabilities = features = None
        if self.declared_only and proc is not None:  # such a trace is never a golden
            capabilities = [c for c in hello.get("capabilities", []) if isinstance(c, str)]
            if isinstance(hello.get("features"), list):  # how it is judged: vllm_log_lines
                features = [f for f in hello["features"] if isinstance(f, str)]
        return make_trace(self.spec.label, hello, scenario, records, not_served=not_served,
                          failure=None if failure is None else Failure(failure.kind, str(failure)),
                          unsupported_features=unsupported_features, capabilities=capabilities,
                          features=features)

    @staticmethod
    def _within(seconds: float | None, setting: str, default: float, until: float | None) -> tuple[float | None, bool]:
        """A timeout cut to the deadline `until` when it is nearer: (seconds, whether it was cut)."""
        if until is None:
            return seconds, False
        seconds = seconds if seconds is not None else timeout_setting(setting, default)
        left = max(until - time.monotonic(), 0.0)
        return min(seconds, left), left < seconds


def _nondeterminism(scenario: Scenario, first: dict, second: dict) -> str:
    """Where two runs of the same engine first differ: the layer, the record and its field."""
    for layer, records in first.items():
        again = second.get(layer, [])
        if records == again:
            continue
        if isinstance(records, digest.DigestSink):  # the first record whose digest differs
            a, b = records.entries, getattr(again, "entries", [])
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return (f"scenario {scenario.name}: two runs of the same engine differ in layer {layer} "
                    f"at record {at} (by its digest; {len(a)} then {len(b)} records)")
        index = next((i for i, (a, b) in enumerate(zip(records, again)) if a != b), None)
        if index is None:
            return (f"scenario {scenario.name}: two runs of the same engine differ in layer {layer}: "
                    f"{len(records)} records, then {len(again)}")
        path, a, b = _first_field(records[index], again[index], "")
        return (f"scenario {scenario.name}: two runs of the same engine differ in layer {layer} "
                f"at record {index}, field {path or '(the record)'}: {a!r} then {b!r}")
    return f"scenario {scenario.name}: two runs of the same engine differ"


def _first_field(a, b, path: str) -> tuple[str, object, object]:
    if isinstance(a, dict) and isinstance(b, dict):
        key = next((k for k in sorted(set(a) | set(b), key=str) if a.get(k, ...) != b.get(k, ...)), None)
        return _first_field(a.get(key), b.get(key), f"{path}.{key}".lstrip("."))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        index = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return _first_field(a[index], b[index], f"{path}[{index}]")
    return path, a, b


class RecordedSession:
    """An engine read from its records instead of run (a pin's goldens: gate/recorded.py): what
    a gate asks of an EngineSession, with no process. `recorded(scenario, layers)` gives
    (the recorded trace, None), or (None, a trace's failure saying why there is none)."""

    cold_starts = 0

    def __init__(self, label: str, recorded):
        self.label, self.recorded = label, recorded

    def __enter__(self) -> "RecordedSession":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def trace(self, scenario: Scenario, layers: list[str], repeat: int = 1, needs=None) -> Trace:
        """The unit's records as recorded, under the hello the record holds (`repeat` and
        `needs` are a run's: nothing runs here)."""
        recorded, failure = self.recorded(scenario, layers)
        if failure is not None:
            return make_trace(self.label, {}, scenario, {}, failure=failure)
        hello = {"engine": recorded.engine["name"], "version": recorded.engine["version"],
                 "protocol": recorded.engine["protocol"], "environment": recorded.environment}
        trace = make_trace(self.label, hello, scenario, {layer: recorded.layers[layer] for layer in layers
                                                        if layer in recorded.layers})
        digests = {layer: form for layer, form in recorded.forms.items() if layer in layers}
        return replace(trace, digests=digests) if digests else trace


def trace_of_records(label: str, hello: dict, scenario, records: dict) -> Trace:
    """A unit's trace made from records an engine would have sent, without a process: the
    trace-mutation catalog's candidate (conformance/adequacy/trace_catalog.py), each of its
    records as edited. The one place besides the sessions above where a trace is made."""
    return make_trace(label, hello, scenario, records)
