"""The oracle's records at a production-scale run's first difference, fetched live.

A production scenario's golden holds the oracle's records as digests (conformance/formats/
digest.py): enough to say, exactly, at which step a run first differs, not which field. The
report needs both sides' records there. The run's own were kept as they arrived; the oracle's
are fetched here, after the runs and before judging, so judging stays apart from running:

- `steps`: the pinned oracle is run again from step 0 with `stop_after_step` (engines/
  PROTOCOL.md) at the window's last step, its records digested as they arrive and checked
  against the golden's digests; the last records, the window, travel with the run's trace
  (`digests.steps.oracle_window`). A step cannot be restarted from a checkpoint: a record is
  not the scheduler's state (its block pool, prefix cache, Request objects, the drafts).
  Where the oracle no longer reproduces its golden, the window says so instead. Every replay
  of one run goes to one oracle engine, kept warm between them (ReplaySession): one cold
  start for all the windows of a gate, as its units share their engines.
- `outputs`: no engine is needed. An output is the stand-in target's own chain from the
  request's prompt (conformance/formats/workload.py), regenerated and kept only where its digest
  is the golden's, so the tokens shown are the oracle's.

The comparator (judging/digest_compare.py) checks every record again against the golden's
digest at its place before it shows one.
"""

from __future__ import annotations

import time
from dataclasses import replace

from conformance.formats.pins import pin_label
from conformance.formats.digest import WINDOW, DigestSink, digest, digest_of
from conformance.formats.engine_ref import EngineRef
from conformance.formats.scenario import Scenario
from conformance.formats.trace import Trace
from conformance.formats.workload import prompt_tokens, target_next
from conformance.gate.context import ENGINE_SESSIONS
from conformance.judging.digest_compare import compare_digest_layer
from conformance.judging.goldens import GOLDENS, GoldenStore
from conformance.process.launch import prepare_engine
from conformance.process.session import EngineSession


class ReplaySession:
    """The pinned oracle's engine for the live replays of one run: started at the first replay
    and kept warm for the next, closed at the end. `sessions` makes its EngineSession (a gate's
    RunContext.sessions; default ENGINE_SESSIONS's, as a gate's)."""

    def __init__(self, pins, log, sessions=None):
        self.pins, self.log = pins, log
        self.sessions = ENGINE_SESSIONS.get() if sessions is None else sessions
        self.sink: DigestSink | None = None  # the running replay's
        self._session: EngineSession | None = None

    def __enter__(self) -> "ReplaySession":
        return self

    def __exit__(self, *exc) -> None:
        if self._session is not None:
            self._session.close()

    def steps(self, scenario: Scenario, last: int, sink: DigestSink):
        """The run's failure (None when it ran): `scenario`'s steps records up to step `last`
        digested into `sink` as they arrive."""
        if self._session is None:
            spec = prepare_engine(EngineRef.pin(self.pins.oracle), self.pins, self.log)
            self._session = self.sessions(spec, sinks=lambda _scenario, _layers: {"steps": self.sink})
        self.sink = sink
        return self._session.trace(scenario, ["steps"], stop_after_step=last).failure


def with_oracle_windows(traces: dict[str, Trace], scenarios, pins, log,
                        store: GoldenStore = GOLDENS, sessions=None) -> dict[str, Trace]:
    """Every trace of a production scenario that differs from the oracle's golden, with the
    oracle's records at its first difference (one replay per scenario and step, all in one
    oracle engine; `sessions` as ReplaySession's)."""
    by_name = {s.name: s for s in scenarios}
    replays: dict[tuple[str, int], dict] = {}
    out = {}
    with ReplaySession(pins, log, sessions) as oracle:
        for key, trace in traces.items():
            scenario = by_name.get(trace.scenario_name)
            if scenario is not None and scenario.scale == "production" and trace.digests is not None:
                trace = oracle_windows(trace, scenario, pins, log, store, replays, oracle)
            out[key] = trace
    return out


def oracle_windows(trace: Trace, scenario: Scenario, pins, log, store: GoldenStore = GOLDENS,
                   replays: dict | None = None, oracle: ReplaySession | None = None) -> Trace:
    """The trace with `oracle_window` in each digest layer that differs from the golden; the
    steps replayed in `oracle` (default: an engine of its own, started when a replay needs it)."""
    golden = store.lookup(scenario.name, pins.oracle).trace
    if golden is None or golden.sha256 != trace.sha256:
        return trace  # judged as missing or invalid: nothing to show
    if oracle is None:
        with ReplaySession(pins, log) as own:
            return oracle_windows(trace, scenario, pins, log, store, replays, own)
    replays = {} if replays is None else replays
    digests = dict(trace.digests)
    for layer, form in trace.digests.items():
        expected = golden.forms.get(layer)
        if expected is None or "problem" in form:
            continue
        c = compare_digest_layer(layer, expected, form)
        if c.equal or c.index >= min(expected["count"], form["count"]) or _shown(expected, c.index):
            continue  # equal, one side ended, or the golden's checkpoints already show the window
        if layer == "outputs":
            window = _regenerated_output(scenario, expected, c.index)
        else:
            if (scenario.name, c.index) not in replays:
                replays[(scenario.name, c.index)] = replay_steps(scenario, expected, c.index, oracle)
            window = replays[(scenario.name, c.index)]
        if window is not None:
            digests[layer] = dict(form, oracle_window=window)
    return replace(trace, digests=digests)


def _shown(expected: dict, index: int) -> bool:
    """Whether the golden's checkpoints hold the oracle's records of the window up to `index`
    (a checkpoint at the differing step alone shows no step before it)."""
    return all(str(i) in expected.get("checkpoints", {}) for i in range(max(0, index - WINDOW), index + 1))


def replay_steps(scenario: Scenario, expected: dict, index: int, oracle: ReplaySession) -> dict:
    """The oracle's steps records index-WINDOW .. index+WINDOW, replayed live from step 0 in
    `oracle` and checked against the golden's digests (`expected`) on the way."""
    started = time.monotonic()
    pins = oracle.pins
    last = min(index + WINDOW, expected["count"] - 1)
    oracle.log(f"[replay] {scenario.name}: the oracle {pin_label(pins.oracle)} replayed to step {last} for the "
               f"records around step {index}")
    sink = DigestSink("steps", keep_last=2 * WINDOW + 1)
    failure = oracle.steps(scenario, last, sink)
    if failure is not None:
        return _failed(index, started, f"the oracle's replay failed: {failure.kind}: {failure.message}")
    golden = [digest_of(e) for e in expected["records"]]
    ran = [digest_of(e) for e in sink.entries]
    wrong = next((i for i, (x, y) in enumerate(zip(golden, ran)) if x != y), None)
    if wrong is not None:
        return _failed(index, started, f"the oracle {pin_label(pins.oracle)} no longer reproduces its golden at "
                                       f"record {wrong}: regenerate it with `make goldens`")
    if len(ran) <= min(index, last):
        return _failed(index, started, f"the oracle's replay sent {len(ran)} records, fewer than the "
                                       f"golden's {index + 1}")
    first, records = sink.last()
    keep = [(first + i, r) for i, r in enumerate(records) if first + i >= index - WINDOW]
    return {"from": keep[0][0], "at": index, "records": [r for _, r in keep],
            "seconds": round(time.monotonic() - started, 1)}


def _failed(index: int, started: float, problem: str) -> dict:
    return {"from": index, "at": index, "records": [], "problem": problem,
            "seconds": round(time.monotonic() - started, 1)}


def _regenerated_output(scenario: Scenario, expected: dict, index: int) -> dict | None:
    """The oracle's output record at `index`: the target's chain from the request's prompt, as
    long as the golden says, kept only if its digest is the golden's."""
    entry = expected["records"][index]
    if not isinstance(entry, dict) or "id" not in entry or scenario.workload is None:
        return None
    workload = scenario.workload
    request = next((r for r in workload["requests"] if r["id"] == entry["id"]), None)
    if request is None:
        return None
    seed, vocab = workload["seed"], workload["vocab_size"]
    tokens = prompt_tokens(seed, request["id"], request["prompt_len"], vocab)
    out = []
    for _ in range(entry["output_len"]):
        out.append(target_next(seed, tokens, vocab))
        tokens.append(out[-1])
    record = {"id": entry["id"], "output_token_ids": out, "finish_reason": entry["finish_reason"]}
    if digest("outputs", record) != entry["digest"]:
        return None  # not the oracle's: the report says a replay is needed
    return {"from": index, "at": index, "records": [record]}
