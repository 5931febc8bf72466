"""The plan of a gate run, made before any engine starts: what it is made of, read from the
plan options alike by `parity gate` and `parity envs` (`plan_inputs`); its units of work
(gate/shards.py) and the `RunManifest`, what the run is: the tool, the pins, the scenarios, the
goldens, the engines, the layers and the plan. Every shard of one run computes the same manifest;
it becomes JSON only when a results folder is written (gate/results.py), and a merge reads it
back from there."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from conformance import __version__
from conformance.formats.engine_ref import EngineRef
from conformance.formats.pins import REPO_ROOT
from conformance.gate.context import RunContext
from conformance.gate.engines import gate_engines, refused
from conformance.gate.options import parse_layers, read_scenarios
from conformance.gate.shards import ShardError, Unit, assign, parse_shard, plan
from conformance.judging.goldens import GOLDENS, ORACLE_RUNS
from conformance.judging.judging import scenario_features
from conformance.judging.verdict import ORACLE


@dataclass(frozen=True)
class RunManifest:
    tool: dict  # tool_identity()
    oracle: str
    pins: list[str]
    scenarios: list[dict]  # what the verdicts and reports need of each scenario (scenario_info)
    goldens: str  # goldens_digest()
    engines: list[EngineRef]  # each with its role
    layers: list[str] | None  # the layers asked
    require_layers: list[str] | None
    units: list[Unit]  # the whole plan, in plan order (not only a shard's share)
    device: str
    count: int  # how many shards share the plan
    require_features: list[str] | None = None  # the features a candidate must declare

    @property
    def scenario_set(self) -> str:
        return digest(self.scenarios)

    @property
    def plan(self) -> str:
        return digest([[u.key, list(u.layers)] for u in self.units])

    def to_json(self) -> dict:
        """What every shard of the run shares (results.IDENTITY), and the scenarios."""
        return {"tool": self.tool, "oracle": self.oracle, "pins": self.pins,
                "scenario_set": self.scenario_set, "scenarios": self.scenarios, "goldens": self.goldens,
                "engines": [e.to_json() for e in self.engines], "layers": self.layers,
                "require_layers": self.require_layers, "plan": self.plan, "planned": len(self.units),
                "device": self.device, "count": self.count, "require_features": self.require_features}


def default_stand_ins(scale: str) -> str:
    """The library's stand-ins are read from their goldens; a production scenario's golden holds
    digests, not the records a report shows at a first difference, so there they run live."""
    return "goldens" if scale == "library" else "live"


def plan_inputs(args, pins, log) -> tuple:
    """What the gate's plan is made of, read from the plan options (gate/options.py plan_options)
    alike by `parity gate` and `parity envs`: (shard, scenarios, layers, engines)."""
    shard = parse_shard(args.shard) if args.shard else None
    scenarios = read_scenarios(args.scenario, args.scale)
    layers = parse_layers(args.layers)
    stand_ins = args.stand_ins or default_stand_ins(args.scale)
    return shard, scenarios, layers, gate_engines(pins, args.candidate, log, stand_ins)


def share_pins(args, pins, log) -> list[str]:
    """The pins this share of the gate's plan runs: the plan `parity gate` makes of the same
    options (plan_inputs), cut by the same function (shard_plan)."""
    shard, scenarios, layers, engines = plan_inputs(args, pins, lambda m: None)
    manifest, share = shard_plan(RunContext(pins, log, shard=shard, layers=layers), scenarios, engines)
    return pins_needed(manifest, share, pins)


def plan_run(context: RunContext, scenarios, engines: list[EngineRef]) -> RunManifest:
    """The run's manifest; a shard count above the number of units is refused here."""
    from conformance.formats.settings import device_mode

    pins = context.pins
    # a run's cost per unit: the oracle runs each unit twice; an engine read from its goldens, none
    units = plan([(e.key, 0 if not e.kind.runs else ORACLE_RUNS if e.role == ORACLE else 1) for e in engines],
                 scenarios, context.layers,
                 refused(engines, pins, device_mode()))
    index, count = context.shard or (1, 1)
    if count > max(len(units), 1):  # a share would be empty, and balancing them takes count x units^2
        raise ShardError(f"--shard {index}/{count}: this gate has {len(units)} units of work, so at most "
                         f"{len(units)} shards; use N <= {len(units)}")
    names = [s.name for s in scenarios]
    return RunManifest(tool=tool_identity(), oracle=pins.oracle, pins=list(pins.releases),
                       scenarios=scenario_info(scenarios, pins.oracle),
                       goldens=goldens_digest(names, pins.releases), engines=list(engines), layers=context.layers,
                       require_layers=context.require_layers, units=units, device=device_mode(), count=count,
                       require_features=context.require_features)


def shard_plan(context: RunContext, scenarios, engines: list[EngineRef]) -> tuple[RunManifest, list[Unit]]:
    """The run's manifest and the units `context.shard` runs: what `parity gate` runs and what
    `parity envs --shard` builds the environments for, one computation for both."""
    manifest = plan_run(context, scenarios, engines)
    return manifest, share_of(manifest, context.shard)


def share_of(manifest: RunManifest, shard: tuple[int, int] | None) -> list[Unit]:
    """The units shard (I, N) runs: all of them without a shard."""
    if shard is None:
        return manifest.units
    return assign(manifest.units, manifest.count)[shard[0] - 1]


def pins_needed(manifest: RunManifest, share: list[Unit], pins) -> list[str]:
    """The pinned releases whose environments the share's engines run in (a pin, or a pin's
    TEST DEVICE mutant; not a pin read from its goldens), in pin order: what a shard's runner
    builds, and nothing more."""
    running = {u.engine for u in share}
    needed = {e.release for e in manifest.engines  # a command has none; a pin's goldens need no environment
              if e.key in running and e.release and e.kind.runs}
    return [r for r in pins.releases if r in needed]


def scenario_info(scenarios, oracle: str) -> list[dict]:
    """What the verdicts and reports need of each scenario, kept in the manifest: its features
    as the oracle resolves them (judging.scenario_features), so every shard skips alike."""
    return [{"name": s.name, "sha256": s.sha256, "rows": list(s.rows), "layers": s.layers,
             "method_matrix": s.method_matrix is not None, "features": list(scenario_features(s, oracle))}
            for s in scenarios]


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def tool_identity() -> dict:
    """The harness's version and a digest of its sources and the worker's: two runners on the
    same commit agree, a runner with edited code does not."""
    files = sorted(p for root in ("conformance", "engines/vllm") for p in (REPO_ROOT / root).rglob("*.py"))
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return {"version": __version__, "sources": h.hexdigest()[:16]}


def goldens_digest(names: list[str], releases: tuple[str, ...]) -> str:
    """Every golden the verdicts and the drift report read, by content."""
    return GOLDENS.digest(names, releases)
