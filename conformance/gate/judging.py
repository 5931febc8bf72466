"""From a trace to its verdict: against the oracle's golden, on the layers the engine was
judged on, each other layer recorded as not judged with why."""

from __future__ import annotations

from pathlib import Path

from ..pins import Pins
from ..protocol import LAYERS
from ..trace import TraceError
from . import golden_store as golden_files
from .verdict import MISSING, NOT_ASKED, NOT_SERVED, NUMERICS, PASS, Verdict, judge


def served_layers(engines, units: list, traces: dict[str, dict]) -> dict[str, list[str]]:
    """Per engine key, the layers it served somewhere in this run (asked and declared)."""
    out: dict[str, list[str]] = {}
    for engine in engines:
        mine = [u for u in units if u.engine == engine.key]
        layers = {layer for u in mine for layer in u.layers
                  if layer not in traces[u.key].get("not_served", [])}
        out[engine.key] = [layer for layer in LAYERS if layer in layers]
    return out


def judge_layers(trace: dict, engine, scenario: dict, units: list, manifest,
                 pins: Pins, served: list[str]) -> tuple[Verdict, dict | None]:
    """The verdict on the layers this engine was judged on: the scenario's layers that were
    asked (--layers) and that the engine serves (its hello). Each other layer is recorded as
    not judged, with why. A layer the gate requires (--require-layers; by default every layer
    asked) that the engine does not serve makes the verdict `unsupported`, saying so: a port
    cannot pass by serving less."""
    name = scenario["name"]
    planned = [layer for u in units if u.engine == engine.key and u.scenario == name for layer in u.layers]
    not_served = [layer for layer in planned if layer in trace.get("not_served", [])]
    layers = [layer for layer in planned if layer not in not_served]
    everything = not not_served and manifest.layers is None
    path = golden_files.golden_path(name, pins.oracle)
    verdict, golden = judge_against(trace, path, engine.role, layers=None if everything else layers)
    verdict.judged = layers
    declared = trace.get("capabilities")  # a candidate's hello: a layer not asked may not be served either
    verdict.not_judged = {layer: NOT_SERVED if declared is not None and layer not in declared else NOT_ASKED
                          for layer in scenario.get("layers", planned) if layer not in planned}
    verdict.not_judged.update((layer, NOT_SERVED) for layer in not_served)
    required = manifest.require_layers
    missing = [layer for layer in not_served if required is None or layer in required]
    verdict.not_judged.update((layer, MISSING) for layer in missing)
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
        verdict.kind, verdict.message = "unsupported", why
    elif why not in verdict.message:
        verdict.message = f"{verdict.message}\n{why}".strip()
    return verdict, golden


def judge_against(trace: dict, path: Path, role: str, layers=None) -> tuple[Verdict, dict | None]:
    """The verdict, and the golden it was judged against (None when there is none); with
    `layers`, against those layers of the golden only."""
    engine, scenario = trace["engine"]["label"], trace["scenario"]["name"]
    if "failure" in trace:  # an engine failure is its own verdict, whatever the golden's state;
        try:  # the records it sent before failing are still compared with a readable golden
            golden = golden_files.load_golden(path) if path.exists() else None
        except TraceError:
            golden = None
        if golden is not None and layers is not None:
            golden = dict(golden, layers={k: v for k, v in golden["layers"].items() if k in layers})
        return judge(trace, golden, role), golden
    if not path.exists():
        return Verdict(engine, scenario, "missing_golden", role,
                       message=f"no golden at {path}; write it with `make goldens`"), None
    try:
        golden = golden_files.load_golden(path)
    except TraceError as exc:
        return Verdict(engine, scenario, "invalid_golden", role, message=str(exc)), None
    if layers is not None:
        golden = dict(golden, layers={k: v for k, v in golden["layers"].items() if k in layers})
    return judge(trace, golden, role), golden
