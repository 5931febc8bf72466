"""`parity adequacy`: the coverage pass over every pin, then the mutant catalog on the gate
oracle; prints conformance/adequacy_report.py's report. Exit 0 when both goals are met,
1 when one is missed."""

from __future__ import annotations

import signal
import sys

from .adequacy import (ENGINE_TIER, MutantServerError, ResultCache, catalog, measure_coverage,
                       run_mutants, sample)
from .adequacy_report import render_coverage, render_goals, render_mutants
from .coverage_run import CoverageError
from .pins import load_pins
from .scope import load_scope


def adequacy(args, scenarios, log) -> int:
    # A run can be long: on SIGTERM, unwind (SystemExit) so the mutant server and its forks
    # are ended by their `finally`, and the results cached so far are kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.sample is not None and args.sample <= 0:
        raise ValueError(f"--sample {args.sample}: expected a positive number of mutants")
    try:
        return _adequacy(args, scenarios, log)
    except (CoverageError, MutantServerError) as exc:
        log(f"parity adequacy: error: {exc}")
        return 2


def _adequacy(args, scenarios, log) -> int:
    pins = load_pins()
    scope = load_scope()
    # The engine layers run the whole engine: costly, and the stand-in scenarios drive the
    # same scheduler (see conformance/adequacy.py for the measurement).
    library = [s for s in scenarios if args.engine_layers or s.engine is None]
    coverages = []
    if not args.no_coverage:
        for release in args.pin or pins.releases:
            cov = measure_coverage(release, library, scope, log)
            coverages.append(cov)
            print(render_coverage(cov), flush=True)
    run = None
    if not args.no_mutants:
        mutants, sources = catalog(pins.oracle, scope, log)
        chosen = sample(mutants, args.sample, args.seed)
        log(f"[adequacy] {len(mutants)} mutants generated from vllm {pins.oracle}; running {len(chosen)}")
        stand_in = [s for s in scenarios if s.engine is None]
        tier = [] if args.no_engine_tier else [s for s in scenarios if s.name in ENGINE_TIER]
        run = run_mutants(pins.oracle, chosen, stand_in, len(mutants), ResultCache(), log,
                          engine_tier=tier, equivalent=scope.equivalent)
        print(render_mutants(run, sources, scope.equivalent), flush=True)
    text, ok = render_goals(coverages, run, scope.equivalent)
    print(text)
    return 0 if ok else 1
