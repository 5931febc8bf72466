"""(a) First divergence on a 50,000-step trace: the suite's compare vs DeepDiff on the whole trace.

Both run in this process on the same pair of traces; the figure is their ratio.

--quick (`make bench BENCH_QUICK=1`, run by tests/house/test_doc_commands.py): 500 steps, to check
that it runs; its figures mean nothing.
"""

import sys
import time

from deepdiff import DeepDiff

from conformance.judging.compare import compare_layer

STEPS = 50_000
QUICK_STEPS = 500


def trace(n: int, diverge_at: int | None = None) -> list[dict]:
    out = []
    for i in range(n):
        reqs = {f"r{j}": {"tokens": 17 if i % 7 else 1024, "draft_tokens": 16} for j in range(4)}
        out.append({"step": i, "total_num_scheduled_tokens": sum(r["tokens"] for r in reqs.values()),
                    "token_budget": 4036, "requests": reqs, "new": [], "resumed": [],
                    "preempted": [], "finished": []})
    if diverge_at is not None:
        out[diverge_at]["requests"]["r2"]["tokens"] += 1
    return out


def main() -> None:
    steps = QUICK_STEPS if "--quick" in sys.argv[1:] else STEPS
    golden, cand = trace(steps), trace(steps, diverge_at=steps // 2 + 17)
    t0 = time.perf_counter()
    result = compare_layer("steps", golden, cand)
    suite = time.perf_counter() - t0
    assert result.index == steps // 2 + 17 and result.explanation
    t0 = time.perf_counter()
    diff = DeepDiff(golden, cand)
    whole = time.perf_counter() - t0
    assert diff
    print(f"(a) {steps} steps, one divergence at step {result.index}: suite {suite:.3f} s "
          f"(target < 0.5 s), DeepDiff on the whole trace {whole:.2f} s, ratio {whole / suite:.0f}x "
          f"(target >= 100x)")


if __name__ == "__main__":
    main()
