"""`parity adequacy`: the coverage pass over every pin, then the generated mutant catalogs (the
scheduler's, the KV cache manager's and block pool's) and the engine path's
(conformance/adequacy/engine_path.py) on the gate oracle; prints conformance/adequacy/report.py's
report, each catalog in a block of its own. Exit 0 when every goal is met, 1 when one is missed.
`--catalog traces` runs the trace-mutation catalog alone (conformance/adequacy/trace_catalog.py).
The catalogs' modules are imported when the command runs, not when `parity` parses its options."""

from __future__ import annotations

import signal
import sys

from conformance.formats.errors import InputError
from conformance.formats.log import log
from conformance.formats.pins import load_pins
from conformance.gate.options import read_scenarios


def register(sub) -> None:
    p = sub.add_parser("adequacy", help="coverage of vLLM's scheduler by the scenarios, and the "
                       "mutants of the scheduler and the engine path the gate catches (make adequacy)")
    p.add_argument("--pin", action="append", help="coverage of these pins only (default: all pins)")
    p.add_argument("--sample", type=int, help="run a deterministic sample of this many of the scheduler's mutants")
    p.add_argument("--kv-sample", type=int, help="run a deterministic sample of this many of the KV cache "
                   "manager's and block pool's mutants (default: all)")
    p.add_argument("--seed", type=int, default=13, help="the sample's seed (default 13)")
    p.add_argument("--no-mutants", action="store_true", help="coverage only")
    p.add_argument("--no-coverage", action="store_true", help="mutants only")
    p.add_argument("--engine-layers", action="store_true",
                   help="measure coverage on the engine-layer scenarios too (about 100 s per pin)")
    p.add_argument("--no-engine-tier", action="store_true",
                   help="mutants run the stand-in scenarios only, not the engine-layer tier after them")
    p.add_argument("--engine-sample", type=int,
                   help="run a deterministic sample of this many engine-path mutants (default: all)")
    p.add_argument("--catalog", choices=("scheduler", "kv", "engine", "all", "traces"), default="all",
                   help="which mutant catalog to run: the scheduler's, the KV cache manager's and block "
                   "pool's, the engine path's (sampler, drafters, model runner, numerics), or all of these "
                   "(default); or traces: the oracle's own goldens mutated and served back as candidates, "
                   "every golden of every scale (the judge's adequacy; alone, no coverage pass, no vLLM)")
    p.add_argument("--trace-sample", type=int,
                   help="traces: a deterministic sample of this many mutants of each family per golden "
                   "(default: all)")
    p.add_argument("--trace-scenario", action="append",
                   help="traces: this scenario's goldens only (by name; repeatable; default: every scenario)")
    p.set_defaults(handler=command)


def command(args) -> int:
    if args.catalog == "traces":  # every golden: the production scenarios' digests too
        return trace_adequacy(args, read_scenarios(None, "all"), log)
    return adequacy(args, read_scenarios(None, "library"), log)


def adequacy(args, scenarios, log) -> int:
    from conformance.process.coverage_run import CoverageError
    from conformance.process.mutant_server import MutantServerError

    # A run can be long: on SIGTERM, unwind (SystemExit) so the mutant server and its forks
    # are ended by their `finally`, and the results cached so far are kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for flag, value in (("--sample", args.sample), ("--kv-sample", args.kv_sample),
                        ("--engine-sample", args.engine_sample)):
        if value is not None and value <= 0:
            raise InputError(f"{flag} {value}: expected a positive number of mutants")
    try:
        return _adequacy(args, scenarios, log)
    except (CoverageError, MutantServerError) as exc:
        log(f"parity adequacy: error: {exc}")
        return 2


def trace_adequacy(args, scenarios, log) -> int:
    """`--catalog traces`: every golden of `scenarios` (on --pin's pins, default all) mutated and
    judged (conformance/adequacy/trace_catalog.py); exit 0 when every mutant is caught or an
    intended exception, 1 otherwise."""
    if args.trace_sample is not None and args.trace_sample <= 0:
        raise InputError(f"--trace-sample {args.trace_sample}: expected a positive number of mutants")
    from conformance.adequacy.trace_catalog import render_catalog, run_catalog

    pins = load_pins()
    for release in args.pin or ():
        if release not in pins.releases:
            raise InputError(f"--pin {release}: not a configured pin ({', '.join(pins.releases)})")
    names = {s.name for s in scenarios}
    for name in args.trace_scenario or ():
        if name not in names:
            raise InputError(f"--trace-scenario {name}: no such scenario in scenarios/")
    chosen = [s for s in scenarios if not args.trace_scenario or s.name in args.trace_scenario]
    releases = tuple(args.pin or pins.releases)
    log(f"[adequacy] traces: the goldens of {len(chosen)} scenarios on {', '.join(releases)}, seed {args.seed}"
        + (f", {args.trace_sample} mutants of each family per golden" if args.trace_sample else ", every mutant"))
    run = run_catalog(chosen, releases, args.seed, log, per_kind=args.trace_sample)
    print(render_catalog(run), flush=True)
    return 0 if run.ok else 1


def _adequacy(args, scenarios, log) -> int:
    from conformance.adequacy.engine_path import (ENGINE_SCOPE_FILE, engine_catalog, engine_scenarios,
                                                  executed_lines)
    from conformance.adequacy.measure import (CATALOGS, ENGINE_TIER, ResultCache, catalog, measure_coverage,
                                              run_mutants, sample)
    from conformance.adequacy.report import render_coverage, render_goals, render_mutants
    from conformance.adequacy.scope import load_scope

    pins = load_pins()
    scope = load_scope()
    # The engine layers run the whole engine: costly, and the stand-in scenarios drive the
    # same scheduler (see conformance/adequacy/measure.py for the measurement).
    library = [s for s in scenarios if args.engine_layers or s.engine is None]
    coverages = []
    if not args.no_coverage:
        for release in args.pin or pins.releases:
            cov = measure_coverage(release, library, scope, log)
            coverages.append(cov)
            print(render_coverage(cov), flush=True)
    runs = []
    sizes = {"scheduler": args.sample, "kv": args.kv_sample}
    for name in CATALOGS:
        if args.no_mutants or args.catalog not in (name, "all"):
            continue
        mutants, sources = catalog(pins.oracle, scope, log, name)
        chosen = sample(mutants, sizes[name], args.seed)
        log(f"[adequacy] {len(mutants)} {name} mutants generated from vllm {pins.oracle}; running {len(chosen)}")
        stand_in = [s for s in scenarios if s.engine is None]
        # the engine tier runs with prefix caching off: it can tell the scheduler's survivors
        # apart (the model runner reads its output), not the block pool's
        tier = [] if args.no_engine_tier or name != "scheduler" else [s for s in scenarios if s.name in ENGINE_TIER]
        run = run_mutants(pins.oracle, chosen, stand_in, len(mutants), ResultCache(), log,
                          engine_tier=tier, equivalent=scope.equivalent, what=name)
        runs.append(run)
        print(render_mutants(run, sources, scope.equivalent), flush=True)
    engine_run, engine_scope = None, None
    if not args.no_mutants and args.catalog in ("engine", "all"):
        engine_scope = load_scope(ENGINE_SCOPE_FILE)
        tier = engine_scenarios(scenarios)
        executed = executed_lines(pins.oracle, tier, engine_scope, log)
        mutants, sources, not_run = engine_catalog(pins.oracle, engine_scope, executed, log)
        # the hand-written edits always run; the generated mutants are sampled
        edits = [m for m in mutants if m.operator == "edit"]
        chosen = edits + sample([m for m in mutants if m.operator != "edit"], args.engine_sample, args.seed)
        log(f"[adequacy] {len(mutants)} engine-path mutants of vllm {pins.oracle} on lines the engine "
            f"scenarios run ({len(not_run)} more on lines they never run); running {len(chosen)}")
        engine_run = run_mutants(pins.oracle, chosen, tier, len(mutants), ResultCache(), log,
                                 equivalent=engine_scope.equivalent, what="engine path")
        print(render_mutants(engine_run, sources, engine_scope.equivalent, not_run), flush=True)
    text, ok = render_goals(coverages, runs, scope.equivalent, engine_run,
                            engine_scope.equivalent if engine_scope else {})
    print(text)
    return 0 if ok else 1
