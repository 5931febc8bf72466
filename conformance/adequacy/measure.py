"""The suite's power, measured: how much of the scheduling code the scenario library runs
(coverage.py, per pin), and how many generated mutants of it the gate catches.

Coverage: each pin's worker runs the scenario library under coverage.py
(conformance/process/coverage_run.py); conformance/adequacy/scope.py decides what counts. The engine layers'
scenarios are left out unless asked for (--engine-layers): measured on 0.27.1, they cost
about 100 s per pin under coverage and add two branches the stand-in scenarios do not take.

Mutants: conformance/adequacy/mutation.py generates the catalogs (CATALOGS: the scheduler's own
code, and the KV cache manager and block pool it calls) from the gate oracle's own sources;
each mutant is served as a CANDIDATE through the protocol (engines/vllm/mutant_server.py
forks it from one warm import of the release) and judged against the oracle's goldens by
conformance/judging/verdict.py, scenario after scenario until one catches it: the stand-in ones, then,
for a mutant none of them caught and not listed as equivalent, the ENGINE_TIER scenarios.
Results are cached per (pin, mutant, scenario), so a re-run pays only for what changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from conformance.formats.kinds import Kind
from conformance.adequacy.mutation import generate
from conformance.adequacy.scope import FunctionScope, Scope, function_scopes
from conformance.formats.engine_ref import EngineRef
from conformance.formats.log import log
from conformance.formats.mutant import Mutant
from conformance.formats.pins import load_pins
from conformance.formats.scenario import Scenario
from conformance.formats.settings import cache_root
from conformance.formats.trace import Trace
from conformance.judging.goldens import GOLDENS
from conformance.judging.judging import judge_trace
from conformance.judging.requirement_rows import where_of
from conformance.judging.verdict import CANDIDATE, NUMERICS, PASS
from conformance.process.client import EngineFailure
from conformance.process.coverage_run import (MEASURED, ensure_coverage, json_report, measured_worker,
                                              write_rcfile)
from conformance.process.envs import ensure_env, site_packages
from conformance.process.launch import Launcher
from conformance.process.session import EngineSession, served

MUTANT_RUN_TIMEOUT = 20.0  # one scenario on a mutant (a mutated loop may never end); the oracle needs under 5 s
ENGINE_RUN_TIMEOUT = 300.0  # one engine-layer scenario (a whole engine on CPU) on a mutant
# The second tier: mutants no stand-in scenario caught run these engine-layer scenarios, where
# the real model runner reads what the steps layer does not record (block ids, the cached
# request data, the client-facing outputs, the drafts of every request a step lists). Three, for
# cost: every draft accepted, preemption, and the priority policy's victim taken back out of a
# step with its drafts.
ENGINE_TIER = ("engine_draft_model_self", "engine_kv_pressure", "engine_priority_victim_drafts")
GOAL_BRANCHES, GOAL_KILLED = 90.0, 97.0  # percent: in-scope branches of each part, each catalog's kill rate
# The generated catalogs: the scheduler's own code, and the code it calls to decide (the KV
# cache manager, its coordinator, the single-type managers, the block pool and its free queue:
# the scope's `callee = true` files). Each is run, reported and held to GOAL_KILLED on its own.
CATALOGS = ("scheduler", "kv")
CATALOG_TITLES = {"scheduler": "the scheduler", "kv": "the KV cache manager and the block pool"}


def measured_files(site: Path) -> list[str]:
    """The measured files of a pin, relative to its site-packages."""
    found = set()
    for pattern in MEASURED:
        found.update(str(p.relative_to(site)) for p in site.glob("vllm/" + pattern.split("/vllm/", 1)[1]))
    return sorted(found)


# -- coverage -------------------------------------------------------------------------------

@dataclass
class PinCoverage:
    release: str
    functions: list[FunctionScope]
    sources: dict[str, list[str]]  # file (relative) -> its lines
    seconds: float
    callees: tuple[str, ...] = ()  # files of code the scheduler calls (scope `callee = true`)

    def part(self, callees: bool = False) -> list[FunctionScope]:
        """The scheduler's own functions, or (callees) those of the code it calls."""
        return [f for f in self.functions if any(f.file.endswith(c) for c in self.callees) == callees]

    def totals(self, callees: bool = False) -> tuple[int, int, int, int]:
        """(covered lines, lines, covered branches, branches), in scope: of the scheduler's own
        code (what the goal is on), or of the code it calls."""
        fs = self.part(callees)
        return (sum(len(f.covered) for f in fs), sum(len(f.statements) for f in fs),
                sum(len(f.covered_branches) for f in fs), sum(len(f.branches) for f in fs))


def measure_coverage(release: str, scenarios: list[Scenario], scope: Scope, log=log) -> PinCoverage:
    python = ensure_env(release, log=log)
    coverage_dir = ensure_coverage(python, log=log)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"parity-adequacy-{release}-") as tmp:
        rcfile, data = write_rcfile(Path(tmp)), Path(tmp) / "coverage.data"
        # the worker exits on shutdown (the session's close), and coverage.py writes its data
        with EngineSession(measured_worker(release, python, coverage_dir, rcfile, data)) as session:
            hello = session.start().hello
            for scenario in scenarios:
                log(f"[adequacy] coverage {release}: {scenario.name}")
                if not served(scenario.layers, hello)[1]:  # a scenario the worker serves whole
                    measured(session.trace(scenario))
        report = json_report(python, coverage_dir, rcfile, data)
    texts = {path: Path(path).read_text(encoding="utf-8") for path in report["files"]}
    functions = function_scopes(report, texts, scope)
    sources = {"vllm/" + p.split("/vllm/", 1)[1]: t.splitlines() for p, t in texts.items()}
    return PinCoverage(release, functions, sources, time.monotonic() - started, scope.callees)


def measured(trace: Trace) -> None:
    """A run under coverage.py counts only when it ran to its end: a failure stops the measure."""
    if trace.failure is not None:
        raise EngineFailure(trace.failure.kind, trace.failure.message)


# -- mutants --------------------------------------------------------------------------------

def catalog(release: str, scope: Scope, log=log, name: str = "scheduler") -> tuple[list[Mutant], dict[str, str]]:
    """Every mutant of one catalog (CATALOGS) of the pin's counted code, and the sources they
    were made from: "scheduler" mutates the scheduler's files, "kv" the files it calls."""
    if name not in CATALOGS:
        raise ValueError(f"catalog {name!r}: expected one of {', '.join(CATALOGS)}")
    site = site_packages(ensure_env(release, log=log))
    mutants, sources = [], {}
    for rel in measured_files(site):
        if scope.callee(rel) != (name == "kv"):
            continue
        sources[rel] = (site / rel).read_text(encoding="utf-8")
        mutants += generate(sources[rel], rel, scope)
    return mutants, sources


def sample(mutants: list[Mutant], size: int | None, seed: int) -> list[Mutant]:
    """A deterministic sample: the same catalog, size and seed give the same mutants."""
    if size is None or size >= len(mutants):
        return list(mutants)
    chosen = random.Random(seed).sample(sorted(mutants, key=lambda m: m.id), size)
    return sorted(chosen, key=lambda m: (m.file, m.start, m.replacement))


def scenario_hash(release: str, scenario: Scenario) -> str:
    """What a verdict on one scenario depends on besides the mutant: the scenario and its golden."""
    h = hashlib.sha256(f"{release}\0{scenario.name}\0{scenario.sha256}\0".encode())
    h.update(GOLDENS.content(scenario.name, release))
    return h.hexdigest()[:16]


def scenario_set_hash(release: str, scenarios: list[Scenario]) -> str:
    return hashlib.sha256("\0".join(sorted(scenario_hash(release, s) for s in scenarios)).encode()).hexdigest()[:16]


class ResultCache:
    """What each (pin, mutant) did on each scenario (by scenario_hash): the scenario that caught
    it, or the scenarios it passed. A result for a scenario set is read from it when the set
    holds the catching scenario, or when every scenario of the set was passed; otherwise only
    the scenarios not yet passed are run. One JSON file in the cache, rewritten atomically after
    every mutant, so an interrupted run keeps what it paid for."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_root() / "adequacy" / "mutant-results.json"
        try:
            self.data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def key(release: str, mutant: Mutant) -> str:
        return f"{release}|{mutant.id}"

    def lookup(self, key: str, hashes: dict[str, str]) -> tuple[dict | None, set[str]]:
        """(the result for this scenario set if known, the scenario names already passed)."""
        entry = self.data.get(key, {})
        caught = entry.get("caught")
        if caught and hashes.get(caught["scenario"]) == caught["hash"]:
            return {k: v for k, v in caught.items() if k != "hash"} | {"killed": True}, set(hashes)
        passed = {name for name, h in hashes.items() if h in entry.get("passed", ())}
        if passed == set(hashes):
            return {"killed": False, "kind": Kind.PASS}, passed
        return None, passed

    def record(self, key: str, hashes: dict[str, str], passed: set[str], result: dict) -> None:
        entry = self.data.setdefault(key, {})
        entry["passed"] = sorted(set(entry.get("passed", ())) | {hashes[n] for n in passed})
        if result.get("killed") and result.get("scenario"):
            entry["caught"] = {k: v for k, v in result.items() if k != "killed"} | {
                "hash": hashes[result["scenario"]]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)


def mutant_launcher(mutants: list[Mutant], log=log) -> Launcher:
    """What starts each of `mutants` as an engine of its own: the mutant server of its release
    forks it (ended with the launcher)."""
    by_id = {m.id: m for m in mutants}
    return Launcher(log=log, find_mutant=lambda release, mutant_id: by_id[mutant_id])


def judge_mutant(launcher: Launcher, release: str, mutant: Mutant, scenarios: list[Scenario],
                 goldens: dict[str, dict], passed: set[str] | None = None) -> dict:
    """Run the mutant of `release` as a candidate on the scenarios, in order, until one
    catches it; the names of the scenarios it passed are added to `passed`."""
    passed = set() if passed is None else passed
    spec = launcher.spec(EngineRef.catalog_mutant(release, mutant.id))
    session = EngineSession(spec, handshake_timeout=60.0, run_timeout=MUTANT_RUN_TIMEOUT)
    try:
        session.start()
    except EngineFailure as failure:
        return {"killed": False, "kind": "not_installed", "message": str(failure)[:500]}
    with session:
        for scenario in scenarios:
            trace = session.trace(scenario, timeout=ENGINE_RUN_TIMEOUT if scenario.engine is not None else None)
            verdict = judge_trace(trace, goldens[scenario.name], CANDIDATE)
            if verdict.kind not in (PASS, NUMERICS):  # numerics: arithmetic noise, not a catch
                where = where_of(verdict) or (verdict.message.splitlines() or [""])[0][:300]
                return {"killed": True, "kind": verdict.kind, "scenario": scenario.name, "where": where}
            passed.add(scenario.name)
        return {"killed": False, "kind": PASS}


@dataclass
class MutantRun:
    release: str
    generated: int
    results: list[tuple[Mutant, dict]] = field(default_factory=list)
    cached: int = 0
    seconds: float = 0.0
    set_hash: str = ""
    scenarios: int = 0
    tier: int = 0  # of which the engine-layer tier
    what: str = "scheduler"  # which catalog: one of CATALOGS, or "engine path"


def run_mutants(release: str, mutants: list[Mutant], scenarios: list[Scenario], generated: int,
                cache: ResultCache, log=log, engine_tier: list[Scenario] = (),
                equivalent: dict[str, str] | None = None, what: str = "scheduler") -> MutantRun:
    """`scenarios` (the stand-in ones) first; a mutant none of them caught runs `engine_tier`
    unless it is listed as equivalent. The engine path's catalog passes its engine scenarios
    as `scenarios`, cheapest first, and no tier."""
    pins = load_pins()
    every = list(scenarios) + list(engine_tier)
    goldens = {s.name: GOLDENS.load(s.name, pins.oracle) for s in every}
    hashes = {s.name: scenario_hash(pins.oracle, s) for s in every}
    stand_in = {name: h for name, h in hashes.items() if name in {s.name for s in scenarios}}
    equivalent = equivalent or {}
    run = MutantRun(release, generated, set_hash=scenario_set_hash(pins.oracle, every), scenarios=len(every),
                    tier=len(engine_tier), what=what)
    started = time.monotonic()
    todo = []
    for m in mutants:
        hit, passed = cache.lookup(ResultCache.key(release, m), stand_in if m.id in equivalent else hashes)
        if hit is not None:
            run.results.append((m, hit))
            run.cached += 1
        else:
            todo.append((m, passed))
    if todo:
        kills = {s.name: 0 for s in every}
        with mutant_launcher([m for m, _ in todo], log) as launcher:
            for number, (m, passed) in enumerate(todo, 1):
                # the scenarios that caught most so far go first: a caught mutant stops there;
                # scenarios this mutant already passed (cached) are not run again
                order = sorted((s for s in scenarios if s.name not in passed), key=lambda s: -kills[s.name])
                if m.id not in equivalent:
                    order += [s for s in engine_tier if s.name not in passed]
                result = judge_mutant(launcher, release, m, order, goldens, passed)
                if result.get("scenario"):
                    kills[result["scenario"]] += 1
                cache.record(ResultCache.key(release, m), hashes, passed, result)
                run.results.append((m, result))
                log(f"[adequacy] mutant {number}/{len(todo)} {m.name}: "
                    f"{'caught by ' + result['scenario'] if result['killed'] else result['kind']}")
    run.results.sort(key=lambda r: (r[0].file, r[0].start, r[0].replacement))
    run.seconds = time.monotonic() - started
    return run
