"""Arithmetic noise of the engine layers' logprobs: how far two runs of the same oracle, same
tokens, land apart when only the arithmetic changes (another ISA, thread count or batch layout).
The tolerance a scenario states (`engine.logprob_atol`) is calibrated from these figures
(benchmarks/bench_noise.py measures them; docs/release-gate.md "On every machine")."""

from __future__ import annotations

from dataclasses import dataclass

from conformance.judging.numerics import top_k

# The tolerance is at least this many times the largest noise measured, so a machine a little
# noisier than any measured still passes; stored logprobs are at least this many times finer.
TOLERANCE_OVER_NOISE = 10
STORAGE_UNDER_TOLERANCE = 10


@dataclass(frozen=True)
class Noise:
    largest: float  # largest |difference| of one token's logprob, over tokens both runs list
    compared: int  # logprobs compared
    token_flips: int  # positions whose greedy token differs (must be 0 across machines)


def logprob_noise(expected: list[dict], actual: list[dict]) -> Noise:
    """Compare two engine_outputs layers of the same scenario, request by request, up to the
    first position where the greedy tokens differ (a flip: counted, the rest not compared)."""
    largest, compared, flips = 0.0, 0, 0
    by_id = {r.get("id"): r for r in actual}
    for e in expected:
        a = by_id.get(e.get("id"), {})
        for pos, (et, at) in enumerate(zip(e.get("output_token_ids", []), a.get("output_token_ids", []))):
            if et != at:
                flips += 1
                break
            e_top, a_top = top_k(e.get("logprobs", []), pos), top_k(a.get("logprobs", []), pos)
            for token in set(e_top) & set(a_top):
                largest = max(largest, abs(e_top[token] - a_top[token]))
                compared += 1
    return Noise(largest, compared, flips)

