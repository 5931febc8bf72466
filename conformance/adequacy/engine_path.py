"""The engine path's mutant catalog: mutants of the code the engine layers run beside the
scheduler (the rejection sampler, the sampler and its logprobs, the drafters, the model
runner's spec-decode metadata and input preparation) and hand-written model-numerics edits,
judged on the engine_* scenarios against the gate oracle's goldens, through the same fork
server and result cache as the scheduler's catalog (conformance/adequacy/measure.py).

What is mutated is listed in adequacy_engine_scope.toml (functions per file, rules, the
equivalent mutants, the hand-written edits). These files serve far more than the targeted
configurations (GPU kernels, random sampling, penalties, structured output, ...), so only the
lines the engine scenarios run on CPU are mutated: coverage.py measures them once per pin and
scenario set (cached). A mutant on a line that never runs cannot change a run; the report
counts those apart, as not run, never as caught.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

from conformance.adequacy.measure import measured
from conformance.adequacy.mutation import generate, hand_edit, run_lines
from conformance.adequacy.scope import Scope
from conformance.formats.log import log
from conformance.formats.mutant import Mutant
from conformance.formats.pins import REPO_ROOT
from conformance.formats.scenario import Scenario
from conformance.formats.settings import cache_root
from conformance.process.coverage_run import (COVERAGE, ensure_coverage, json_report, measured_worker,
                                              write_rcfile)
from conformance.process.envs import ensure_env, site_packages
from conformance.process.session import EngineSession

ENGINE_SCOPE_FILE = REPO_ROOT / "adequacy_engine_scope.toml"
GOAL_ENGINE_KILLED = 90.0  # percent of the non-equivalent engine-path mutants
# The order a mutant runs the engine scenarios in (stopping at the first that catches it):
# the cheapest and widest first. engine_ngram runs the ngram drafter with partial acceptance
# (rejection and bonus tokens both), engine_draft_model_self accepts every draft, then one
# scenario per other drafter; engine_kv_pressure (preemption), then the priority policy's
# victim taken back out of a step (engine_priority_victim_drafts), last.
ENGINE_ORDER = ("engine_ngram", "engine_draft_model_self", "engine_eagle3", "engine_dflash_gate",
                "engine_draft_model", "engine_pard", "engine_mtp", "engine_kv_pressure",
                "engine_priority_victim_drafts")


def engine_scenarios(scenarios: list[Scenario]) -> list[Scenario]:
    """The engine-layer scenarios of the library, in ENGINE_ORDER (any other one after)."""
    rank = {name: i for i, name in enumerate(ENGINE_ORDER)}
    return sorted((s for s in scenarios if s.engine is not None), key=lambda s: (rank.get(s.name, 99), s.name))


def engine_files(scope: Scope) -> list[str]:
    return sorted({suffix for suffix, _ in scope.measure} | {e.file for e in scope.edits})


def executed_lines(release: str, scenarios: list[Scenario], scope: Scope, log=log) -> dict[str, set[int]]:
    """file (relative to site-packages) -> the lines the scenarios ran, measured by coverage.py
    in the pin's worker, cached by pin, files and scenarios."""
    files = engine_files(scope)
    key = hashlib.sha256("\0".join([release, COVERAGE, *files, *sorted(s.sha256 for s in scenarios)])
                         .encode()).hexdigest()[:16]
    path = cache_root() / "adequacy" / f"engine-lines-{release}-{key}.json"
    try:
        return {f: set(lines) for f, lines in json.loads(path.read_text(encoding="utf-8")).items()}
    except (OSError, ValueError):
        pass
    python = ensure_env(release, log=log)
    coverage_dir = ensure_coverage(python, log=log)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"parity-engine-lines-{release}-") as tmp:
        rcfile, data = write_rcfile(Path(tmp), [f"*/{f}" for f in files]), Path(tmp) / "coverage.data"
        worker = measured_worker(release, python, coverage_dir, rcfile, data)
        with EngineSession(worker, run_timeout=900.0) as session:  # its close: coverage.py writes its data
            for scenario in scenarios:
                log(f"[adequacy] engine-path lines {release}: {scenario.name}")
                measured(session.trace(scenario))
        report = json_report(python, coverage_dir, rcfile, data)
    found = {f: set() for f in files}
    for name, entry in report["files"].items():
        rel = "vllm/" + name.split("/vllm/", 1)[1]
        found[rel] = set(entry["executed_lines"])
    log(f"[adequacy] engine-path lines measured in {time.monotonic() - started:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({f: sorted(lines) for f, lines in found.items()}), encoding="utf-8")
    return found


def engine_catalog(release: str, scope: Scope, executed: dict[str, set[int]],
                   log=log) -> tuple[list[Mutant], dict[str, str], list[Mutant]]:
    """(the mutants on lines the engine scenarios run, the sources, the mutants on lines they
    never run). Hand-written edits are kept whatever line they are on: each names code that
    builds or runs the model, and one that never runs would be a finding, not a skip."""
    site = site_packages(ensure_env(release, log=log))
    sources = {f: (site / f).read_text(encoding="utf-8") for f in engine_files(scope)}
    run, not_run = [], []
    for rel, source in sources.items():
        lines = run_lines(source, executed.get(rel, set()))
        for m in generate(source, rel, scope):
            (run if m.line in lines else not_run).append(m)
    seen = {m.id for m in run}
    for edit in scope.edits:
        m = hand_edit(sources[edit.file], edit.file, edit)
        if m.id not in seen:
            run.append(m)
            seen.add(m.id)
    return run, sources, not_run
