"""Shrinking a production-shape finding to a small scenario.

Hypothesis shrinks the parameters a production example was generated from (fewer requests,
shorter medians, no long prompt), but a smaller generator seed is not a smaller scenario, and
the generator never goes below 64 requests. So a production finding then goes through
`reduce_production`, on the expanded scenario (its `workload`), every edit kept only when the
example still fails with the finding's signature:

1. cut at the divergence: the requests arriving after the last iteration the divergent step
   depends on (its schedule, or under async scheduling its update) cannot change it;
2. scale down: prompts, outputs, the token budget, max_model_len, the KV blocks, the long-prefill
   threshold and the shared prefixes all halved together, so the ratios that made the bug stay;
   again while it holds (first, as every later run is cheaper for it);
3. max_num_seqs halved, again while it holds (a bug of admission needs no 128 sequences);
4. ddmin over the requests: remove halves, then quarters, and so on;
5. max_num_seqs down to the number of requests;
6. the plainer configuration: no speculation, async scheduling off, no prefix caching;
then 2-6 again while any of them made the scenario smaller.

The search's own polish (conformance/fuzz/search.py Search._polish) runs after it. Every run is
bounded by the clock: `fails(raw, timeout)` raises OutOfTime when the time is up, which ends the
reduction with what it has.
"""

from __future__ import annotations

import json
from typing import Callable

from conformance.fuzz.strategies import max_steps
from conformance.process.session import OutOfTime

SCALED_ARGS = ("max_num_batched_tokens", "max_model_len", "num_gpu_blocks_override",
               "long_prefill_token_threshold", "max_num_scheduled_tokens")
PLAINER = (("speculative_config", None), ("async_scheduling", False), ("enable_prefix_caching", False))


def shape(raw: dict) -> str:
    """A scenario's size as a reader compares two: requests, the longest prompt, the budget."""
    args, reqs = raw["engine_args"], raw["workload"]["requests"]
    longest = max((r["prompt_len"] for r in reqs), default=0)
    return (f"{len(reqs)} request{'s' if len(reqs) != 1 else ''}, prompts up to {longest} tokens, "
            f"budget {args['max_num_batched_tokens']}, max_num_seqs {args['max_num_seqs']}")


def with_requests(raw: dict, reqs: list[dict]) -> dict:
    """`raw` with only `reqs`: the prefixes none of them uses left out, max_steps no larger."""
    out = json.loads(json.dumps(raw))
    workload = out["workload"]
    workload["requests"] = reqs
    used = {r.get("prefix") for r in reqs}
    prefixes = [p for p in workload.get("prefixes", ()) if p["name"] in used]
    if prefixes:
        workload["prefixes"] = prefixes
    else:
        workload.pop("prefixes", None)
    workload["max_steps"] = min(workload["max_steps"], max_steps(reqs, prefixes))
    return out


def halved(raw: dict) -> dict | None:
    """Every size halved together (rounded so each request still fits max_model_len); None when
    nothing is left to halve."""
    out = json.loads(json.dumps(raw))
    args, workload = out["engine_args"], out["workload"]
    changed = False
    for key in SCALED_ARGS:
        value = args.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            args[key], changed = (value + 1) // 2, True
    for item, keys in [(r, ("prompt_len", "max_tokens")) for r in workload["requests"]] + \
            [(p, ("len",)) for p in workload.get("prefixes", ())]:
        for key in keys:
            if item[key] > 1:
                item[key], changed = item[key] // 2, True
    prefixes = {p["name"]: p["len"] for p in workload.get("prefixes", ())}
    if not changed or any(r["prompt_len"] + r["max_tokens"] + prefixes.get(r.get("prefix"), 0) > args["max_model_len"]
                          for r in workload["requests"]):
        return None  # nothing left to halve, or the smallest requests no longer fit
    workload["max_steps"] = max_steps(workload["requests"], workload.get("prefixes", ()))
    return out


def with_seqs(raw: dict, seqs: int) -> dict:
    out = json.loads(json.dumps(raw))
    out["engine_args"]["max_num_seqs"] = seqs
    return out


def cut_after(raw: dict, iteration: int) -> dict | None:
    """Without the requests arriving after `iteration`; None when none does (or all would go)."""
    reqs = raw["workload"]["requests"]
    kept = [r for r in reqs if r["arrival_step"] <= iteration]
    return with_requests(raw, kept) if kept and len(kept) < len(reqs) else None


def reduce_production(raw: dict, fails: Callable[[dict], bool], divergent_iteration: int | None,
                      log=lambda message: None) -> tuple[dict, int]:
    """The smallest variant of `raw` found that still `fails` (with the finding's signature),
    and the runs it took. `divergent_iteration`: the last driver iteration the first divergent
    step depends on (None: the divergence is not in a step). OutOfTime from `fails` ends it."""
    runs = 0

    def keep(candidate: dict | None) -> bool:
        nonlocal runs
        if candidate is None:
            return False
        runs += 1
        return fails(candidate)

    try:
        if divergent_iteration is not None:
            cut = cut_after(raw, divergent_iteration)
            if keep(cut):
                raw = cut
                log(f"[fuzz] cut at the divergence (iteration {divergent_iteration}): {shape(raw)}")
        changed = True
        while changed:
            before = json.dumps(raw, sort_keys=True)
            while (smaller := halved(raw)) is not None and keep(smaller):
                raw = smaller
            while raw["engine_args"]["max_num_seqs"] > 1 and keep(fewer := with_seqs(raw, raw["engine_args"]["max_num_seqs"] // 2)):
                raw = fewer
            raw = _ddmin(raw, keep)
            seqs = len(raw["workload"]["requests"])
            if raw["engine_args"]["max_num_seqs"] > seqs and keep(fewer := with_seqs(raw, seqs)):
                raw = fewer
            for key, plain in PLAINER:
                if key in raw["engine_args"] and raw["engine_args"][key] != plain:
                    plainer = json.loads(json.dumps(raw))
                    if plain is None:
                        del plainer["engine_args"][key]
                    else:
                        plainer["engine_args"][key] = plain
                    raw = plainer if keep(plainer) else raw
            changed = json.dumps(raw, sort_keys=True) != before
    except OutOfTime:
        log(f"[fuzz] reducing the production finding stopped at its time limit after {runs} runs")
    return raw, runs


def _ddmin(raw: dict, keep: Callable[[dict | None], bool]) -> dict:
    """Requests removed a chunk at a time, halves first, then ever smaller chunks."""
    parts = 2
    while len(reqs := raw["workload"]["requests"]) > 1:
        size = -(-len(reqs) // parts)
        for start in range(0, len(reqs), size):
            rest = reqs[:start] + reqs[start + size:]
            if rest and keep(with_requests(raw, rest)):
                raw, parts = with_requests(raw, rest), max(parts - 1, 2)
                break
        else:
            if parts >= len(reqs):
                return raw
            parts = min(2 * parts, len(reqs))
    return raw
