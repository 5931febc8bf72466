"""`parity fuzz`, cold starts left out of every figure:

(h) examples per second on the stand-in layers: the gate oracle against a second copy of itself
    (nothing to find, so every example is generated, run on both and judged), without guidance
    and with --guide coverage (the oracle's worker under coverage.py); for each part of a run:
    the small part, and the production part (production shapes: seconds an example);
(i) the time to find, shrink and confirm a planted divergence (the TEST DEVICE mutant
    ignore-max-num-seqs, seed 1);
(l) what coverage guidance buys: distinct branches of the scheduling code (adequacy_scope.toml's
    measured files) the oracle reached after the same number of examples, for two seeds, with
    the oracle measured in both runs and the search guided by what it reached in one;
(m) the engine layers (the whole engine on the tiny models): the time to find, shrink and
    confirm the TEST DEVICE mutant drop-bonus-token, which only the engine layers see.

--quick (`make bench BENCH_QUICK=1`, run by tests/house/test_doc_commands.py): (h) on 5 examples of
the small part, the rest left out, to check that it runs; its figures mean nothing.
"""

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.formats.engine_ref import EngineRef  # noqa: E402
from conformance.formats.pins import load_pins  # noqa: E402
from conformance.fuzz import campaign as fuzz_cli  # noqa: E402
from conformance.fuzz.search import STAND_IN_LAYERS, Pair, Search  # noqa: E402
from conformance.process.coverage_run import BranchesReached, ensure_coverage, guided_worker  # noqa: E402
from conformance.process.envs import ensure_env  # noqa: E402
from conformance.process.launch import prepare_engine  # noqa: E402

QUIET = lambda message: None  # noqa: E731
EXAMPLES = 200
PRODUCTION_EXAMPLES = 12  # two production rounds
GUIDED_EXAMPLES = 150
GUIDED_SEEDS = (7, 8)
QUICK_EXAMPLES = 5


def timed_search(pair: Pair, seed: int, examples: int, **options) -> tuple[Search, float, list]:
    try:
        pair.start()
        search = Search(pair, seed, QUIET, examples=examples, **options)
        start = time.perf_counter()
        findings = search.run()
        return search, time.perf_counter() - start, findings
    finally:
        pair.close()


def find_and_confirm(pair: Pair, oracle: str, seed: int, examples: int) -> tuple[object, float]:
    try:
        pair.start()
        start = time.perf_counter()
        [finding] = Search(pair, seed, QUIET, examples=examples).run()
        with tempfile.TemporaryDirectory() as folder:
            fuzz_cli.confirm(pair, finding, Path(folder), seed, "mutant", oracle, QUIET)
        return finding, time.perf_counter() - start
    finally:
        pair.close()


def main() -> None:
    oracle = load_pins().oracle
    spec = prepare_engine(EngineRef.pin(oracle), log=QUIET)
    copy = replace(spec, label=f"{spec.label} (copy)")
    if "--quick" in sys.argv[1:]:
        search, seconds, _ = timed_search(Pair(spec, copy, list(STAND_IN_LAYERS)), 7, QUICK_EXAMPLES)
        print(f"(h) parity fuzz, stand-in layers: {QUICK_EXAMPLES / seconds:.1f} examples/s ({QUICK_EXAMPLES} "
              f"examples, {search.stats.refused} refused, {search.stats.skipped} skipped); (i) (l) (m): left out (--quick)")
        return
    python = ensure_env(oracle, log=QUIET)
    coverage_dir = ensure_coverage(python, log=QUIET)

    search, seconds, _ = timed_search(Pair(spec, copy, list(STAND_IN_LAYERS)), 7, EXAMPLES)
    production, production_seconds, _ = timed_search(Pair(spec, copy, list(STAND_IN_LAYERS)), 7,
                                                     PRODUCTION_EXAMPLES, production_every=1)
    guided = {}
    for seed in GUIDED_SEEDS:
        for guide in (False, True):
            with tempfile.TemporaryDirectory() as folder:
                branches = BranchesReached(Path(folder) / "branches.jsonl")
                measured = guided_worker(oracle, python, coverage_dir, branches.path)
                run, run_seconds, _ = timed_search(Pair(measured, copy, list(STAND_IN_LAYERS)), seed,
                                                   GUIDED_EXAMPLES, branches=branches, guide=guide)
                guided[seed, guide] = (len(branches.arcs), GUIDED_EXAMPLES / run_seconds)
    rate = sum(r for (_s, g), (_b, r) in guided.items() if g) / len(GUIDED_SEEDS)
    print(f"(h) parity fuzz, stand-in layers: {EXAMPLES / seconds:.1f} examples/s "
          f"({EXAMPLES} examples of vllm-{oracle} against itself in {seconds:.1f} s; "
          f"{search.stats.refused} refused, {search.stats.skipped} skipped); "
          f"with --guide coverage {rate:.1f} examples/s; per part: small {EXAMPLES / seconds:.1f}/s, "
          f"production {PRODUCTION_EXAMPLES / production_seconds:.2f}/s ({PRODUCTION_EXAMPLES} examples in "
          f"{production_seconds:.1f} s; {production.stats.skipped} skipped)")

    finding, seconds = find_and_confirm(
        Pair(spec, prepare_engine(EngineRef.test_device(oracle, "ignore-max-num-seqs"), log=QUIET), list(STAND_IN_LAYERS)),
        oracle, 1, 1000)
    print(f"(i) parity fuzz finds, shrinks and confirms the planted divergence of mutant "
          f"ignore-max-num-seqs in {seconds:.1f} s: after {finding.examples} examples, "
          f"{finding.shrink_runs} shrink runs, {finding.first_requests} -> "
          f"{len(finding.raw['workload']['requests'])} requests, "
          f"{'confirmed' if finding.confirmed else 'NOT confirmed'}")

    print(f"(l) branches of the scheduling code reached after {GUIDED_EXAMPLES} examples, without / with "
          "--guide coverage: " + "; ".join(
              f"seed {seed}: {guided[seed, False][0]} / {guided[seed, True][0]}" for seed in GUIDED_SEEDS))

    layers = ["engine_steps", "engine_outputs"]
    finding, seconds = find_and_confirm(
        Pair(spec, prepare_engine(EngineRef.test_device(oracle, "drop-bonus-token"), log=QUIET), layers), oracle, 1, 200)
    print(f"(m) parity fuzz on the engine layers finds, shrinks and confirms mutant drop-bonus-token "
          f"in {seconds:.1f} s: after {finding.examples} examples, {finding.shrink_runs} shrink runs, "
          f"{finding.first_requests} -> {len(finding.raw['workload']['requests'])} requests, "
          f"{'confirmed' if finding.confirmed else 'NOT confirmed'}")


if __name__ == "__main__":
    main()
