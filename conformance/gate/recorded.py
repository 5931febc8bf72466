"""A pin as its committed goldens recorded it (formats/engine_ref.py RECORDED, `0.28.0+goldens`):
the gate's stand-ins when no candidate is named, unless `--stand-ins live`.

A stand-in is informational: it shows a newcomer what a divergence looks like on real releases.
Its live run would say again what its goldens already say: each golden was written by that
pin's own run, its provenance names the run, and `make goldens-check` and `make test` run every
pin again against them (integer facts exactly, logprobs within the scenario's tolerance). So by
default the gate reads them instead, and a first `make parity` builds and runs the oracle alone.
The oracle itself, and every candidate, always runs live.

A unit's trace is the golden's records of the unit's layers, under the pin's hello as the
golden recorded it (process/session.py RecordedSession makes it, as EngineSession makes a
run's). A layer the golden lacks is a failure the report names: `unsupported` where the pin
has no CPU engine here (its engine layers are written on GPU runners), else `missing_golden`.
"""

from __future__ import annotations

from conformance.formats.kinds import Kind
from conformance.formats.engine_ref import EngineRef
from conformance.formats.protocol import ENGINE_LAYERS
from conformance.formats.scenario import Scenario
from conformance.formats.trace import Failure, Trace
from conformance.judging.goldens import GOLDENS, GoldenStore
from conformance.process.session import RecordedSession


def recorded_session(engine: EngineRef, device: str, store: GoldenStore = GOLDENS) -> RecordedSession:
    """The session of a pin read from its goldens (`engine`: a RECORDED EngineRef)."""
    return RecordedSession(engine.label, lambda scenario, layers: from_goldens(engine, device, store, scenario, layers))


def from_goldens(engine: EngineRef, device: str, store: GoldenStore, scenario: Scenario,
                 layers: list[str]) -> tuple[Trace | None, Failure | None]:
    """(the pin's golden of `scenario`, None) when it records every layer of `layers`, else
    (None, the failure saying why not)."""
    golden = store.lookup(scenario.name, engine.release)
    if golden.trace is None or golden.trace.sha256 != scenario.sha256:
        return None, _none(engine, device, store, scenario, layers, golden)
    recorded = golden.trace
    absent = [layer for layer in layers if layer not in recorded.layers and layer not in recorded.forms]
    if absent:
        return None, _none(engine, device, store, scenario, absent, golden)
    return recorded, None


def _none(engine: EngineRef, device: str, store: GoldenStore, scenario: Scenario, layers: list[str], golden) -> Failure:
    """Why the goldens hold no record of `layers` for this unit, as a trace's failure."""
    release, pins = engine.release, store.pins
    # a pin without a CPU engine refuses a scenario with engine layers whole, as its worker does
    if device == "cpu" and set(scenario.layers) & set(ENGINE_LAYERS) and not pins.cpu_engine_build(release):
        return Failure(Kind.UNSUPPORTED,
                       f"no golden of vllm {release} for {scenario.name}: its whole engine cannot run on "
                       f"CPU ({pins.no_cpu_engine_reason(release)}); its engine layers run on GPU runners")
    if golden.trace is not None:  # a golden of another version of the scenario
        return Failure(Kind.MISSING_GOLDEN,
                       f"{golden.path} records another version of scenario {scenario.name}: write it with "
                       f"`make goldens`, or run the pin with --stand-ins live")
    message = golden.message if golden.kind else f"{golden.path} holds no record of {', '.join(layers)}"
    return Failure(golden.kind or Kind.MISSING_GOLDEN,
                   f"{message} (the stand-in {engine.key} is read from its goldens; --stand-ins live runs the pin)")
