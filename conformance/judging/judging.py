"""From a trace to its verdict: `judge_trace`, the one way every part of the house judges a
run (the gate and merge through judge_layers, `parity compare`, a shard's unit summaries,
adequacy's mutants, the fuzzer), against a golden from the store or an oracle trace held in
memory; and the gate's layers judged, each other layer recorded as not judged with why."""

from __future__ import annotations

from dataclasses import replace

from conformance.formats.features import FEATURES, decided_by_config, needed
from conformance.formats.pins import REPO_ROOT, Pins
from conformance.formats.protocol import LAYERS
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import Trace, TraceError, checked
from conformance.judging.goldens import GOLDENS, Golden, GoldenStore, checked_golden
from conformance.judging.verdict import (INVALID_GOLDEN, MISSING, MISSING_GOLDEN, NOT_ASKED, NOT_SERVED,
                                         NUMERICS, ORACLE, PASS, UNSUPPORTED, Verdict, judge)


def served_layers(engines, units: list, traces: dict[str, Trace]) -> dict[str, list[str]]:
    """Per engine key, the layers it served somewhere in this run (asked and declared)."""
    out: dict[str, list[str]] = {}
    for engine in engines:
        mine = [u for u in units if u.engine == engine.key]
        layers = {layer for u in mine if traces[u.key].sent for layer in traces[u.key].served(u.layers)}
        out[engine.key] = [layer for layer in LAYERS if layer in layers]
    return out


def judge_layers(trace: Trace, engine, scenario: dict, units: list, manifest,
                 pins: Pins, served: list[str], store: GoldenStore = GOLDENS) -> tuple[Verdict, Trace | None]:
    """The verdict on the layers this engine was judged on: the scenario's layers that were
    asked (--layers) and that the engine serves (its hello). Each other layer is recorded as
    not judged, with why. A layer the gate requires (--require-layers; by default every layer
    asked) that the engine does not serve makes the verdict `unsupported`, saying so: a port
    cannot pass by serving less. A scenario not run for features the engine does not declare is
    `unsupported` naming them, failing only where the gate requires one (--require-features)."""
    if not trace.sent:
        return judge_trace(trace, None, engine.role, required_features=manifest.require_features or ()), None
    name = scenario["name"]
    planned = [layer for u in units if u.engine == engine.key and u.scenario == name for layer in u.layers]
    layers = trace.served(planned)
    not_served = [layer for layer in planned if layer not in layers]
    everything = not not_served and manifest.layers is None
    golden = store.lookup(name, pins.oracle)
    verdict = judge_trace(trace, golden, engine.role, layers=None if everything else layers,
                          required_features=manifest.require_features or ())
    # a layer never asked (--layers) is said to be not asked, whether or not the engine serves it
    declared = trace.capabilities  # a candidate's hello
    asked = manifest.layers
    not_judged = {layer: NOT_SERVED if (asked is None or layer in asked) and declared is not None
                  and layer not in declared else NOT_ASKED
                  for layer in scenario.get("layers", planned) if layer not in planned}
    not_judged.update((layer, NOT_SERVED) for layer in not_served)
    required = manifest.require_layers
    missing = [layer for layer in not_served if required is None or layer in required]
    not_judged.update((layer, MISSING) for layer in missing)
    verdict = replace(verdict, judged=layers, not_judged=not_judged)
    golden = golden.only(None if everything else layers)
    if not missing and layers:
        return verdict, golden
    why = (f"required layer{'s' if len(missing) > 1 else ''} {', '.join(missing)} not judged: the engine "
           f"does not serve {'them' if len(missing) > 1 else 'it'} (its hello does not declare "
           f"{'them' if len(missing) > 1 else 'it'}); a port cannot pass by serving less. "
           + (f"Judge it on the layers it serves with --layers {','.join(served)} (in make: "
              f"LAYERS={','.join(served)}), or name the layers the gate requires with "
              "--require-layers (REQUIRE_LAYERS=)" if served else "It serves none of the layers asked")
           if missing else "none of this scenario's layers asked is served by the engine")
    if verdict.kind in (PASS, NUMERICS):
        verdict = replace(verdict, kind=UNSUPPORTED, message=why)
    elif why not in verdict.message:
        verdict = replace(verdict, message=f"{verdict.message}\n{why}".strip())
    return verdict, golden


def judge_trace(trace: Trace, golden: Golden | Trace | None, role: str, layers=None,
                required_features=()) -> Verdict:
    """The verdict on one trace, in `role`: against a golden looked up in the store (a
    missing or invalid one is the verdict, unless the run failed: an engine failure is its own
    verdict, its records compared with a readable golden), or an oracle's trace held in
    memory (a Trace; None: no golden at all); with `layers`, on those layers of the golden only.
    Every record is judged against its layer's declaration before anything compares it
    (trace.checked): one that is not what it declares ends the run there as a `protocol`
    failure, and an oracle's trace in memory with such a record is an invalid golden. A run not
    sent for features the engine does not declare is `unsupported` naming them (not_declared)."""
    trace = checked(trace)
    if not trace.sent:
        return not_declared(trace, role, required_features)
    if isinstance(golden, Trace):
        try:
            golden = checked_golden(golden, "the oracle's trace")
        except TraceError as exc:
            return Verdict(trace.label, trace.scenario_name, INVALID_GOLDEN, role, message=str(exc))
    if isinstance(golden, Golden):
        if golden.trace is None and trace.failure is None:
            return Verdict(trace.label, trace.scenario_name, golden.kind, role, message=golden.message)
        golden = golden.trace
    if golden is None and trace.failure is None:  # a failed run is judged by its failure alone
        return Verdict(trace.label, trace.scenario_name, MISSING_GOLDEN, role,
                       message="no golden to judge this run against")
    if golden is not None:
        golden = golden.only(layers)
    if golden is not None and not prints_log_lines(trace, required_features):
        trace, golden = without_log_lines(trace), without_log_lines(golden)
    return judge(trace, golden, role)


def prints_log_lines(trace: Trace, required_features=()) -> bool:
    """Whether a run is judged on vLLM's log lines: its engine's hello lists no features, or
    lists `vllm_log_lines`, or the gate requires that feature (--require-features)."""
    features = trace.features
    return features is None or LOG_LINES in features or LOG_LINES in required_features


LOG_LINES = "vllm_log_lines"
LOG_FIELDS = ("budget_log_lines", "async_log_lines")  # the config records' log lines


def without_log_lines(trace: Trace) -> Trace:
    """A trace or golden whose config records hold no log lines: a foreign engine that does not
    print vLLM's is judged on its behaviour."""
    layers = dict(trace.layers)
    for layer in ("config", "engine_config"):
        if isinstance(layers.get(layer), list):
            layers[layer] = [{k: v for k, v in r.items() if k not in LOG_FIELDS} if isinstance(r, dict) else r
                             for r in layers[layer]]
    return replace(trace, layers=layers)


def not_declared(trace: Trace, role: str, required_features=()) -> Verdict:
    """The verdict on a scenario not run because it needs features the engine's hello does not
    declare: `unsupported`, naming them, and those of them the gate requires."""
    missing = tuple(trace.unsupported_features)
    required = tuple(f for f in missing if f in required_features)
    some = "s" if len(missing) > 1 else ""
    message = (f"not run: it needs the feature{some} {', '.join(missing)}, which the engine does not "
               "declare (hello.features); ")
    if required:
        message += (f"the gate requires {', '.join(required)} (--require-features, REQUIRE_FEATURES=): "
                    "a port cannot pass by declaring less")
    else:
        message += ("not failing; require the feature{0} with --require-features (REQUIRE_FEATURES=) "
                    "once the engine has {1}").format(some, "them" if some else "it")
    return Verdict(trace.label, trace.scenario_name, UNSUPPORTED, role, message=message,
                   missing_features=missing, required_features=required)


def scenario_features(scenario, oracle: str, store: GoldenStore = GOLDENS) -> tuple[str, ...]:
    """The features a scenario needs (Scenario.features), async scheduling left to vLLM's default
    decided as the oracle resolved it: its golden's config record (`async_scheduling_gpu`)."""
    config = None
    if decided_by_config(scenario.engine_args):
        golden = store.lookup(scenario.name, oracle).trace
        records = (golden.layers if golden else {}).get("config") or [None]
        config = records[0]
    return needed(scenario.engine_args, scenario.workload, scenario.method_matrix, config)


# The gate exists for the DFlash 27B gate configuration: by default a candidate's PASS requires
# the features its own scenarios need (--require-features none opts out).
GATE_CONFIGURATION = "dflash_27b_gate*"


def gate_configuration_features(oracle: str, store: GoldenStore = GOLDENS) -> list[str]:
    """The features the gate configuration's own scenarios (scenarios/dflash_27b_gate*.json) need,
    as the oracle resolves them: what a candidate must declare to pass by default."""
    found = {name for path in sorted((REPO_ROOT / "scenarios").glob(f"{GATE_CONFIGURATION}.json"))
             for name in scenario_features(load_scenario(path), oracle, store)}
    return [name for name in FEATURES if name in found]


def judge_unit(trace: Trace, scenario: str, oracle: str, layers: list[str], role: str = ORACLE,
               store: GoldenStore = GOLDENS) -> Verdict:
    """A unit of a shard judged alone, with its engine's role, against the oracle's golden on
    the unit's layers."""
    return judge_trace(trace, store.lookup(scenario, oracle), role, layers)
