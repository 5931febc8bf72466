"""Run scenarios on one engine through one warm process; every outcome becomes a trace."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .engine import EngineFailure, EngineProcess, EngineSpec, end_all
from .scenario import Scenario
from .trace import make_trace


@dataclass
class EngineRun:
    spec: EngineSpec
    traces: list[dict]
    cold_starts: int


def only_layers(scenarios: list[Scenario], layers: list[str] | None) -> list[tuple[Scenario, list[str]]]:
    """Each scenario with the given layers among its own (all of its own when None); the
    scenarios that have none of them are left out. The gate's --layers is such a filter."""
    pairs = [(s, [x for x in s.layers if layers is None or x in layers]) for s in scenarios]
    return [(s, chosen) for s, chosen in pairs if chosen]


def run_scenarios(spec: EngineSpec, scenarios: list[Scenario], layers: list[str] | None = None,
                  log=print, repeat: int = 1, layer_filter: bool = False) -> EngineRun:
    """One cold start per engine; a crashed or hung engine is restarted for the next scenario,
    so one bad scenario never hides the others. `layers` defaults to each scenario's own; with
    layer_filter, each scenario runs those of its own layers that `layers` names (only_layers).

    With repeat=2 (the oracle) every scenario runs twice in the warm process; records that
    differ between the two runs make a `nondeterministic` failure, never a golden."""
    traces, starts = [], 0
    proc: EngineProcess | None = None
    chosen = {s.name: x for s, x in only_layers(scenarios, layers)} if layer_filter else {}
    if layer_filter:
        scenarios = [s for s in scenarios if s.name in chosen]
    for number, scenario in enumerate(scenarios, 1):
        wanted = chosen.get(scenario.name) or layers or scenario.layers
        if proc is None:
            proc = EngineProcess(spec)
            starts += 1
            try:
                proc.start()
            except EngineFailure as failure:
                traces.append(_failed(spec, {}, scenario, failure))
                proc = None
                continue
        log(f"[run] {spec.label}: {scenario.name} ({number}/{len(scenarios)})")
        try:
            layers_out = proc.run(scenario, wanted)
            for _ in range(repeat - 1):
                again = proc.run(scenario, wanted)
                if again != layers_out:
                    raise EngineFailure("nondeterministic", _nondeterminism(scenario, layers_out, again),
                                        layers_out)
        except EngineFailure as failure:
            traces.append(_failed(spec, proc.hello, scenario, failure))
            if failure.kind != "unsupported":  # a refused layer leaves a healthy, warm engine
                proc.close()
                proc = None
            continue
        traces.append(make_trace(spec.label, proc.hello, scenario, layers_out))
    if proc is not None:
        proc.close()
    return EngineRun(spec, traces, starts)


def run_engines(jobs: list[tuple[EngineSpec, int]], scenarios: list[Scenario],
                layers: list[str] | None = None, log=print, parallel: int = 1,
                layer_filter: bool = False) -> list[EngineRun]:
    """run_scenarios for each (engine, repeat), up to `parallel` engines at once, each in its
    own process: their cold starts (~6 s of importing vLLM each) overlap. Results in job
    order. An interrupt ends every engine process before it propagates."""
    if parallel <= 1 or len(jobs) <= 1:
        return [run_scenarios(spec, scenarios, layers, log, repeat, layer_filter) for spec, repeat in jobs]
    pool = ThreadPoolExecutor(max_workers=min(parallel, len(jobs)))
    try:
        futures = [pool.submit(run_scenarios, spec, scenarios, layers, log, repeat, layer_filter)
                   for spec, repeat in jobs]
        return [f.result() for f in futures]
    except BaseException:
        end_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def default_parallel(device: str) -> int:
    """Engines run side by side on CPU (one compute thread each; up to the core count); on a
    GPU runner one at a time, since engines on one GPU would share its memory."""
    import os

    return 1 if device == "gpu" else max(1, len(os.sched_getaffinity(0)))


def _failed(spec: EngineSpec, hello: dict, scenario: Scenario, failure: EngineFailure) -> dict:
    return make_trace(spec.label, hello, scenario, failure.partial,
                      failure={"kind": failure.kind, "message": str(failure)})


def _nondeterminism(scenario: Scenario, first: dict, second: dict) -> str:
    from .compare import compare_layer

    for layer in first:
        c = compare_layer(layer, first[layer], second.get(layer, []))
        if not c.equal:
            f = c.first
            return (f"scenario {scenario.name}: two runs of the same engine differ in layer {layer} "
                    f"at record {c.index}, field {f.path}: {f.expected!r} then {f.actual!r}")
    return f"scenario {scenario.name}: two runs of the same engine differ"
