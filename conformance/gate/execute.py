"""Running a gate's units: one warm worker per engine, engines side by side, every outcome a
trace (gate/runner.py). What runs is decided by the plan (gate/plan.py); what the traces mean, by
the judging that follows (gate/run.py `finish`)."""

from __future__ import annotations

import functools
from dataclasses import replace

from conformance.gate.context import RunContext
from conformance.gate.engines import GateEngine
from conformance.gate.runner import run_units, side_by_side
from conformance.gate.shards import COLD_START, Unit, share_cost
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import CANDIDATE, ORACLE
from conformance.process.launch import prepare_engine
from conformance.process.progress import EngineProgress, Progress, duration


def run_share(context: RunContext, engines: list[GateEngine], scenarios, units: list[Unit],
              features: dict | None = None) -> dict[str, dict]:
    """Run `units` (in plan order), one warm worker per engine, up to `context.parallel`
    engines side by side (runner.side_by_side); unit key -> its trace. `features`: scenario name
    -> the features it needs (the manifest's); a candidate is not sent a scenario needing one its
    hello does not declare."""
    log, parallel = context.log, context.parallel
    by_name = {s.name: s for s in scenarios}
    traces: dict[str, dict] = {}
    with Progress(share_cost(units), log) as progress:
        def run_engine(number: int, engine: GateEngine, mine: list[Unit]):
            progress.say(f"[gate] engine {number}/{len(engines)}: {engine.key} ({engine.role}), "
                         f"{len(mine)} unit{'s' if len(mine) != 1 else ''}")
            # named by its key while it runs (a command line can be long); the report names it
            # by its NAME or its hello
            spec = replace(prepare_engine(engine.ref(context.pins), context.pins, log), label=engine.key)
            # a candidate is asked only for the layers its hello declares (judge_layers)
            return run_units(spec, [(by_name[u.scenario], list(u.layers)) for u in mine], log,
                             repeat=2 if engine.role == ORACLE else 1,
                             declared_only=engine.role == CANDIDATE, features=features,
                             expect=lambda scenario: golden_digests(scenario.name, context.pins.oracle),
                             progress=EngineProgress(progress, "gate", engine.key,
                                                     [(u.scenario, u.layers, u.cost) for u in mine], COLD_START))

        shares = [(number, engine, [u for u in units if u.engine == engine.key])
                  for number, engine in enumerate(engines, 1)]
        shares = [share for share in shares if share[2]]
        runs = side_by_side([functools.partial(run_engine, *share) for share in shares], parallel)
        for (_, _, mine), run in zip(shares, runs):
            traces.update((u.key, t) for u, t in zip(mine, run.traces))
        log(f"[gate] cold starts: {sum(run.cold_starts for run in runs)} for {len(shares)} engines "
            f"({min(parallel, max(len(shares), 1))} side by side); {len(units)} units in "
            f"{duration(progress.elapsed())}")
    return traces


def golden_digests(scenario: str, oracle: str) -> dict | None:
    """The oracle's golden digests of a production scenario, which a run's records are checked
    against as they arrive (the records around the first difference are kept); None without one."""
    golden = GOLDENS.lookup(scenario, oracle).trace
    return None if golden is None else golden.get("digests")
