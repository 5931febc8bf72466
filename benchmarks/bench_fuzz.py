"""(h) `parity fuzz` on the stand-in layers: examples per second of the gate oracle against a
second copy of itself (nothing to find, so every example is generated, run on both and judged),
and (i) the time to find, shrink and confirm a planted divergence (the TEST DEVICE mutant
ignore-max-num-seqs, seed 1), cold starts left out of both.
"""

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance import fuzz_cli  # noqa: E402
from conformance.engine import prepare_engine  # noqa: E402
from conformance.gate.engine_ref import EngineRef  # noqa: E402
from conformance.fuzz import STAND_IN_LAYERS, Pair, Search  # noqa: E402
from conformance.pins import load_pins  # noqa: E402

QUIET = lambda message: None  # noqa: E731
EXAMPLES = 200


def main() -> None:
    oracle = load_pins().oracle
    spec = prepare_engine(EngineRef.pin(oracle), log=QUIET)
    pair = Pair(spec, replace(spec, label=f"{spec.label} (copy)"), list(STAND_IN_LAYERS))
    try:
        pair.start()
        search = Search(pair, 7, QUIET, examples=EXAMPLES)
        start = time.perf_counter()
        search.run()
        seconds = time.perf_counter() - start
    finally:
        pair.close()
    print(f"(h) parity fuzz, stand-in layers: {EXAMPLES / seconds:.1f} examples/s "
          f"({EXAMPLES} examples of vllm-{oracle} against itself in {seconds:.1f} s; "
          f"{search.stats.refused} refused, {search.stats.skipped} skipped)")

    pair = Pair(spec, prepare_engine(EngineRef.test_device(oracle, "ignore-max-num-seqs"), log=QUIET), list(STAND_IN_LAYERS))
    try:
        pair.start()
        start = time.perf_counter()
        [finding] = Search(pair, 1, QUIET, examples=1000).run()
        with tempfile.TemporaryDirectory() as folder:
            fuzz_cli.confirm(pair, finding, Path(folder), 1, "mutant", oracle, QUIET)
        seconds = time.perf_counter() - start
    finally:
        pair.close()
    print(f"(i) parity fuzz finds, shrinks and confirms the planted divergence of mutant "
          f"ignore-max-num-seqs in {seconds:.1f} s: after {finding.examples} examples, "
          f"{finding.shrink_runs} shrink runs, {finding.first_requests} -> "
          f"{len(finding.raw['workload']['requests'])} requests, "
          f"{'confirmed' if finding.confirmed else 'NOT confirmed'}")


if __name__ == "__main__":
    main()
