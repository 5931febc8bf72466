"""Run scenarios on one engine through one warm process; every outcome becomes a trace."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from conformance.formats import digest
from conformance.formats.features import declared as declared_features, not_declared
from conformance.formats.scenario import Scenario
from conformance.formats.trace import make_trace
from conformance.process.client import EngineFailure, EngineProcess
from conformance.process.launch import EngineSpec
from conformance.process.reaper import end_all, resume


@dataclass
class EngineRun:
    spec: EngineSpec
    traces: list[dict]
    cold_starts: int


def run_scenarios(spec: EngineSpec, scenarios: list[Scenario], layers: list[str] | None = None,
                  log=print, repeat: int = 1, progress=None, expect=None) -> EngineRun:
    """Every scenario with `layers` (default: each scenario's own); see run_units."""
    return run_units(spec, [(s, layers or s.layers) for s in scenarios], log, repeat, progress, expect=expect)


def run_units(spec: EngineSpec, items: list[tuple[Scenario, list[str]]], log=print, repeat: int = 1,
              progress=None, declared_only: bool = False, features: dict | None = None,
              expect=None) -> EngineRun:
    """Each (scenario, layers) item, one trace each. One cold start per engine; a crashed or
    hung engine is restarted for the next item, so one bad scenario never hides the others.

    With repeat=2 (the oracle) every item runs twice in the warm process; records that differ
    between the two runs make a `nondeterministic` failure, never a golden.

    `progress`, when given, is told when the engine starts (`starting()`), when an item starts
    (`item(number)`, 1-based) and ends (`end(number)`); without it each item is logged.

    With declared_only (a candidate under the gate), the engine is asked only for the layers
    its `hello` declares; the others are listed in the trace's `not_served` (the gate reports
    them as not judged), and an item with none of its layers declared is not sent at all.
    Its traces also keep what the hello declared (`capabilities`): they are never goldens. An item
    whose scenario needs a feature the hello does not declare (`features`: scenario name -> the
    features it needs, default Scenario.features) is not sent either: its trace names those
    features (`unsupported_features`), which the gate judges `unsupported`.

    A production-scale scenario's layers are received in the digest form; `expect(scenario)`,
    when given, returns the golden's `digests`, so each trace keeps the records around its first
    difference from the golden (formats/digest.py)."""
    traces, starts = [], 0
    proc: EngineProcess | None = None
    for number, (scenario, layers) in enumerate(items, 1):
        if proc is None:
            proc = EngineProcess(spec)
            starts += 1
            if progress is not None:
                progress.starting()
            try:
                proc.start()
            except EngineFailure as failure:
                traces.append(failure_trace(spec, {}, scenario, failure))
                proc = None
                if progress is not None:
                    progress.end(number)
                continue
        if progress is not None:
            progress.item(number)
        else:
            log(f"[run] {spec.label}: {scenario.name} ({number}/{len(items)})")
        missing: list[str] = []
        lacking = not_declared((features or {}).get(scenario.name, scenario.features),
                               declared_features(proc.hello))
        if declared_only and lacking:
            traces.append(_declared(make_trace(spec.label, proc.hello, scenario, {}, unsupported_features=lacking),
                                    proc))
            if progress is not None:
                progress.end(number)
            continue
        if declared_only:
            declared = proc.hello.get("capabilities", [])
            missing = [layer for layer in layers if layer not in declared]
            layers = [layer for layer in layers if layer in declared]
            if not layers:
                traces.append(_declared(make_trace(spec.label, proc.hello, scenario, {}, not_served=missing), proc))
                if progress is not None:
                    progress.end(number)
                continue
        production = scenario.scale == "production"
        expected = expect(scenario) if expect is not None and production else None
        sinks = (lambda: digest.sinks(layers, expected)) if production else (lambda: None)  # noqa: E731
        try:
            layers_out = proc.run(scenario, layers, sinks=sinks())
            for _ in range(repeat - 1):
                again = proc.run(scenario, layers, sinks=sinks())
                if again != layers_out:
                    raise EngineFailure("nondeterministic", _nondeterminism(scenario, layers_out, again),
                                        layers_out)
        except EngineFailure as failure:
            traces.append(_declared(failure_trace(spec, proc.hello, scenario, failure, missing), proc, declared_only))
            if failure.kind != "unsupported":  # a refused layer leaves a healthy, warm engine
                proc.close()
                proc = None
        else:
            traces.append(_declared(make_trace(spec.label, proc.hello, scenario, layers_out, not_served=missing),
                                    proc, declared_only))
        if progress is not None:
            progress.end(number)
    if proc is not None:
        proc.close()
    return EngineRun(spec, traces, starts)


def _declared(trace: dict, proc: EngineProcess, keep: bool = True) -> dict:
    if keep:
        trace["capabilities"] = [c for c in proc.hello.get("capabilities", []) if isinstance(c, str)]
    return trace


def side_by_side(tasks: list, parallel: int) -> list:
    """Call each task (one engine's run_units, say), up to `parallel` at once, each engine in
    its own process: their cold starts (~6 s of importing vLLM each) overlap. Results in task
    order. An interrupt (or any error) stops the run: every engine process is ended, and no
    thread starts an engine again (each ends with client.Stopped), before it propagates."""
    if parallel <= 1 or len(tasks) <= 1:
        return [task() for task in tasks]
    pool = ThreadPoolExecutor(max_workers=min(parallel, len(tasks)))
    try:
        futures = [pool.submit(task) for task in tasks]
        return [f.result() for f in futures]
    except BaseException as exc:
        exc.parity_strays = end_all()  # the caller says what was ended, by pid where it had to be
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        resume()


def default_parallel(device: str) -> int:
    """Engines side by side: on CPU up to the core count (each computes on one thread); on a
    GPU as many as its free memory holds at one engine's budget (gpu.engines_side_by_side)."""
    cpus = max(1, len(os.sched_getaffinity(0)))
    if device != "gpu":
        return cpus
    from conformance.formats import gpu

    return gpu.engines_side_by_side(gpu.memory()[0], cpus)


def failure_trace(spec: EngineSpec, hello: dict, scenario: Scenario, failure: EngineFailure,
                  not_served: list[str] | None = None) -> dict:
    """The trace of a run that failed: the records it sent, and the failure's kind and message."""
    return make_trace(spec.label, hello, scenario, failure.partial,
                      failure={"kind": failure.kind, "message": str(failure)}, not_served=not_served)


def _nondeterminism(scenario: Scenario, first: dict, second: dict) -> str:
    from conformance.judging.compare import compare_layer

    for layer in first:
        if isinstance(first[layer], digest.DigestSink):  # the first record whose digest differs
            a, b = first[layer].entries, getattr(second.get(layer), "entries", [])
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            if a != b or first[layer] != second.get(layer):
                return (f"scenario {scenario.name}: two runs of the same engine differ in layer {layer} "
                        f"at record {at} (by its digest; {len(a)} then {len(b)} records)")
            continue
        c = compare_layer(layer, first[layer], second.get(layer, []))
        if not c.equal:
            f = c.first
            return (f"scenario {scenario.name}: two runs of the same engine differ in layer {layer} "
                    f"at record {c.index}, field {f.path}: {f.expected!r} then {f.actual!r}")
    return f"scenario {scenario.name}: two runs of the same engine differ"
