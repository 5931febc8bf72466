"""Running a gate's units: one engine session per engine (process/session.py: warm, restarted when
it is gone, every outcome a trace), engines side by side, an engine that would hold one core
while the other waits split in two (side_by_side_pieces). What runs is decided by the plan
(gate/plan.py); what the traces mean, by the judging that follows (gate/run.py `finish`)."""

from __future__ import annotations

import functools
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from conformance.formats import digest
from conformance.formats.engine_ref import EngineRef
from conformance.formats.settings import device_mode
from conformance.formats.trace import Trace
from conformance.gate.context import RunContext
from conformance.gate.recorded import recorded_session
from conformance.gate.shards import COLD_START, Unit, assign, share_cost
from conformance.judging.goldens import GOLDENS, ORACLE_RUNS
from conformance.judging.verdict import CANDIDATE, ORACLE
from conformance.process.launch import prepare_engine
from conformance.process.progress import EngineProgress, Progress, duration
from conformance.process.reaper import end_all, ended_unwinding, resume


def run_share(context: RunContext, engines: list[EngineRef], scenarios, units: list[Unit],
              features: dict | None = None) -> dict[str, Trace]:
    """Run `units` (in plan order), one warm session per engine (two where a balanced cut
    splits one, side_by_side_pieces), up to `context.parallel` side by side; unit key -> its
    trace. `features`: scenario name -> the features it needs (the manifest's); a candidate is
    not sent a scenario needing one its hello does not declare."""
    log, parallel = context.log, context.parallel
    by_name = {s.name: s for s in scenarios}
    traces: dict[str, Trace] = {}
    with Progress(share_cost(units), log) as progress:
        def run_engine(number: int, engine: EngineRef, mine: list[Unit]) -> tuple[list[Trace], int]:
            progress.say(f"[gate] engine {number}/{len(engines)}: {engine.key} ({engine.role}), "
                         f"{len(mine)} unit{'s' if len(mine) != 1 else ''}"
                         + ("" if engine.kind.runs else ", read from its goldens"))
            if not engine.kind.runs:  # a pin's goldens (gate/recorded.py): no process
                with recorded_session(engine, device_mode()) as recorded:
                    return [recorded.trace(by_name[u.scenario], list(u.layers)) for u in mine], 0
            # named by its key while it runs (a command line can be long); the report names it
            # by its NAME or its hello
            spec = replace(prepare_engine(engine, context.pins, log), label=engine.key)
            # a candidate is asked only for the layers its hello declares (judge_layers); a pin's
            # worker is asked every layer, and says why it refuses one (a release without a CPU
            # rebuild, a commit whose compiled inputs changed: `unsupported`, the reason named)
            session = context.sessions(spec, declared_only=engine.role == CANDIDATE and not engine.is_pin,
                                       progress=EngineProgress(
                progress, "gate", engine.key, [(u.scenario, u.layers, u.cost) for u in mine], COLD_START),
                sinks=golden_sinks(context.pins.oracle))
            with session:
                repeat = ORACLE_RUNS if engine.role == ORACLE else 1
                return [session.trace(by_name[u.scenario], list(u.layers), repeat,
                                      needs=(features or {}).get(u.scenario)) for u in mine], session.cold_starts

        numbers = {engine.key: (number, engine) for number, engine in enumerate(engines, 1)}
        pieces = side_by_side_pieces(units, parallel)

        def run_piece(piece: list[Unit]) -> tuple[list[Trace], int]:
            done, starts = [], 0
            for key, mine in segments(piece):
                traced, started = run_engine(*numbers[key], mine)
                done += traced
                starts += started
            return done, starts

        runs = side_by_side([functools.partial(run_piece, piece) for piece in pieces], parallel)
        for piece, (done, _) in zip(pieces, runs):
            traces.update((u.key, t) for u, t in zip(piece, done))
        sessions = sum(len(segments(piece)) for piece in pieces)
        log(f"[gate] cold starts: {sum(starts for _, starts in runs)} for {len({u.engine for u in units})} engines "
            f"in {sessions} session{'s' if sessions != 1 else ''} ({max(len(pieces), 1)} side by side); "
            f"{len(units)} units in {duration(progress.elapsed())}")
    return traces


def side_by_side_pieces(units: list[Unit], parallel: int) -> list[list[Unit]]:
    """The units (in plan order) cut into at most `parallel` pieces run side by side, each by
    one thread, its engines one after another. By engine (each engine's units one piece, run
    up to `parallel` at a time) unless cutting the plan into balanced consecutive pieces
    (shards.assign, as a CI matrix's shards are cut) saves more than the cold start of the
    engine it splits: the oracle runs each unit twice, so beside a candidate, or alone (the
    stand-ins read from their goldens), it would hold one core while the other waits."""
    by_engine = [list(group) for _, group in itertools.groupby(units, key=lambda u: u.engine)]
    if parallel <= 1 or sum(1 for group in by_engine if share_cost(group)) > parallel:
        return by_engine  # (a pin read from its goldens costs nothing: it starts no process)
    balanced = [piece for piece in assign(units, parallel) if piece]
    if max(map(share_cost, balanced)) + COLD_START < max(map(share_cost, by_engine)):
        return balanced
    return by_engine


def segments(piece: list[Unit]) -> list[tuple[str, list[Unit]]]:
    """A piece's consecutive runs of one engine: (engine key, its units), in order."""
    return [(key, list(group)) for key, group in itertools.groupby(piece, key=lambda u: u.engine)]


def golden_sinks(oracle: str):
    """EngineSession's `sinks`: a production run's records checked against the golden digests of
    the `oracle` pin as they arrive (the records around the first difference are kept)."""
    def sinks(scenario, layers: list[str]) -> dict:
        golden = GOLDENS.lookup(scenario.name, oracle).trace
        return digest.sinks(layers, None if golden is None else golden.digests)
    return sinks


def side_by_side(tasks: list, parallel: int) -> list:
    """Call each task (one engine's units, say), up to `parallel` at once, each engine in
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
        ended_unwinding(end_all())  # the handler's end_all says what was ended, by pid where it had to be
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
