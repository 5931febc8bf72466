"""Run scenarios on one engine through one warm process; every outcome becomes a trace."""

from __future__ import annotations

from dataclasses import dataclass

from .engine import EngineFailure, EngineProcess, EngineSpec
from .scenario import Scenario
from .trace import make_trace


@dataclass
class EngineRun:
    spec: EngineSpec
    traces: list[dict]
    cold_starts: int


def run_scenarios(spec: EngineSpec, scenarios: list[Scenario], layers: list[str] | None = None,
                  log=print, repeat: int = 1) -> EngineRun:
    """One cold start per engine; a crashed or hung engine is restarted for the next scenario,
    so one bad scenario never hides the others. `layers` defaults to each scenario's own.

    With repeat=2 (the oracle) every scenario runs twice in the warm process; records that
    differ between the two runs make a `nondeterministic` failure, never a golden."""
    traces, starts = [], 0
    proc: EngineProcess | None = None
    for number, scenario in enumerate(scenarios, 1):
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
            layers_out = proc.run(scenario, layers or scenario.layers)
            for _ in range(repeat - 1):
                again = proc.run(scenario, layers or scenario.layers)
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
