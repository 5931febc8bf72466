"""A pin as its committed goldens recorded it (formats/engine_ref.py RECORDED, `0.28.0+goldens`):
the gate's stand-ins when no candidate is named, unless `--stand-ins live`.

A stand-in is informational: it shows a newcomer what a divergence looks like on real releases.
Its live run would say again what its goldens already say: each golden was written by that
pin's own run, its provenance names the run, and `make goldens-check` and `make test` run every
pin again against them (integer facts exactly, logprobs within the scenario's tolerance). So by
default the gate reads them instead, and a first `make parity` builds and runs the oracle alone.
The oracle itself, and every candidate, always runs live.

A unit's trace is the golden's records of the unit's layers, under the pin's hello as the
golden recorded it. A layer the golden lacks is a failure the report names: `unsupported` where
the pin has no CPU engine here (its engine layers are written on GPU runners), else
`missing_golden`.
"""

from __future__ import annotations

from conformance.formats.engine_ref import EngineRef
from conformance.formats.protocol import ENGINE_LAYERS
from conformance.formats.scenario import Scenario
from conformance.formats.trace import make_trace
from conformance.judging.goldens import GOLDENS, GoldenStore


class RecordedSession:
    """What gate/execute.py asks of an EngineSession, served from the goldens: no process."""

    cold_starts = 0

    def __init__(self, engine: EngineRef, device: str, store: GoldenStore = GOLDENS):
        self.engine, self.device, self.store = engine, device, store

    def __enter__(self) -> "RecordedSession":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def trace(self, scenario: Scenario, layers: list[str], repeat: int = 1, needs=None) -> dict:
        release = self.engine.release
        golden = self.store.lookup(scenario.name, release)
        if golden.trace is None or golden.trace["scenario"]["sha256"] != scenario.sha256:
            return make_trace(self.engine.label, {}, scenario, {}, failure=self._none(scenario, layers, golden))
        recorded = golden.trace
        hello = {"engine": recorded["engine"]["name"], "version": recorded["engine"]["version"],
                 "protocol": recorded["engine"]["protocol"], "environment": recorded["provenance"]["environment"]}
        records = {layer: recorded["layers"][layer] for layer in layers if layer in recorded["layers"]}
        absent = [layer for layer in layers if layer not in records and layer not in recorded.get("digests", {})]
        if absent:
            return make_trace(self.engine.label, hello, scenario, {}, failure=self._none(scenario, absent, golden))
        trace = make_trace(self.engine.label, hello, scenario, records)
        digests = {layer: form for layer, form in recorded.get("digests", {}).items() if layer in layers}
        if digests:
            trace["digests"] = digests
        return trace

    def _none(self, scenario: Scenario, layers: list[str], golden) -> dict:
        """Why the goldens hold no record of `layers` for this unit, as a trace's failure."""
        release = self.engine.release
        pins = self.store.pins
        # a pin without a CPU engine refuses a scenario with engine layers whole, as its worker does
        if self.device == "cpu" and set(scenario.layers) & set(ENGINE_LAYERS) and not pins.cpu_engine_build(release):
            return {"kind": "unsupported",
                    "message": f"no golden of vllm {release} for {scenario.name}: its whole engine cannot run on "
                               f"CPU ({pins.no_cpu_engine_reason(release)}); its engine layers run on GPU runners"}
        if golden.trace is not None:  # a golden of another version of the scenario
            return {"kind": "missing_golden",
                    "message": f"{golden.path} records another version of scenario {scenario.name}: write it with "
                               f"`make goldens`, or run the pin with --stand-ins live"}
        message = golden.message if golden.kind else f"{golden.path} holds no record of {', '.join(layers)}"
        return {"kind": golden.kind or "missing_golden",
                "message": f"{message} (the stand-in {self.engine.key} is read from its goldens; "
                           f"--stand-ins live runs the pin)"}
