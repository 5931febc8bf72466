"""Comparison of the engine layers: knows *why* two real-engine runs differ.

Two real engines can differ because they decide differently (a scheduling divergence: a bug
a port must fix) or because their arithmetic differs in the last bits (another CPU, bf16 on
a GPU, another kernel). The rules, after vLLM's own check_outputs_equal and
check_logprobs_close (tests/models/utils.py):

engine_outputs, per request (sorted by id), position by position:
  - same token: its logprob must agree within the scenario's tolerance (`logprob_atol`);
    beyond it the cause is `logprobs`.
  - different token: when each side's token is in the other side's top-k, the difference is
    `numerics` (near-tie between two candidates; the rest of that request is not compared,
    since its continuation legitimately differs); otherwise it is a `mismatch`.
engine_steps, at the first step that differs (budget and worker counts are context, as in
the steps layer):
  - a scheduling field differs (scheduled tokens, draft tokens, new / resumed / preempted):
    `scheduling`, a decision that differs on the same state (every earlier step was equal);
  - only accepted drafts or finished requests differ: `acceptance`, the drafter or the target
    computed differently (numerics), not the scheduler;
  - nothing but the recorded budget or the worker's token counts differ: `context` (every
    decision is equal; a release that records its per-step input budget, say).
Capacity: every forward the worker ran, target and drafter, against max_num_batched_tokens.
"""

from __future__ import annotations

from .compare import CONTEXT_FIELDS, FieldDiff, LayerComparison, compare_layer

NUMERICS_CAUSES = frozenset({"numerics", "acceptance"})  # differences arithmetic explains
STEP_CONTEXT = CONTEXT_FIELDS["engine_steps"]
MODEL_FIELDS = ("accepted_draft_tokens", "finished")  # decided by the model's outputs


def compare_by_layer(layer: str, expected: list[dict], actual: list[dict], atol: float) -> LayerComparison:
    """The comparison each layer gets: the engine layers' knows numerics, the rest is exact."""
    if layer == "engine_steps":
        return compare_engine_steps(expected, actual)
    if layer == "engine_outputs":
        return compare_engine_outputs(expected, actual, atol)
    return compare_layer(layer, expected, actual)


def compare_engine_steps(expected: list[dict], actual: list[dict]) -> LayerComparison:
    c = compare_layer("engine_steps", expected, actual)
    if not c.equal:
        decided = [f for f in c.fields if f.path.split(".")[0].split("[")[0] not in STEP_CONTEXT]
        model_only = decided and all(f.path.endswith(MODEL_FIELDS[0]) or f.path.startswith(MODEL_FIELDS[1])
                                     for f in decided)
        c.cause = ("context" if not decided else "acceptance" if model_only else "scheduling")
    return c


def compare_engine_outputs(expected: list[dict], actual: list[dict], atol: float) -> LayerComparison:
    c = LayerComparison("engine_outputs", expected == actual, expected_count=len(expected),
                        actual_count=len(actual))
    if c.equal:
        return c
    if any("refused" in r for r in expected + actual):  # a refused configuration: exact
        c = compare_layer("engine_outputs", expected, actual)
        c.cause = "mismatch"
        return c
    numerics: list[tuple[int, list[FieldDiff]]] = []
    e_by, a_by = {r.get("id"): r for r in expected}, {r.get("id"): r for r in actual}
    for index, rid in enumerate(sorted(set(e_by) | set(a_by), key=str)):
        e, a = e_by.get(rid), a_by.get(rid)
        if e is None or a is None:  # a request only one side has
            return _diverged(c, index, e, a, [FieldDiff(f"{rid}", e, a)], "mismatch")
        cause, fields = _compare_request(rid, e, a, atol)
        if cause == "numerics":
            numerics.append((index, fields))
        elif cause is not None:
            return _diverged(c, index, e, a, fields, cause)
    if not numerics:
        c.equal = True  # every difference is within the tolerance
        return c
    index, fields = numerics[0]
    rid = sorted(set(e_by) | set(a_by), key=str)[index]
    c = _diverged(c, index, e_by[rid], a_by[rid], fields, "numerics")
    c.explanation = (f"{len(numerics)} request(s) differ only where both tokens are in the other "
                     "side's top-k: near-ties resolved differently by different arithmetic")
    return c


def _compare_request(rid, e: dict, a: dict, atol: float):
    """(cause or None, fields) for one request."""
    e_tokens, a_tokens = e.get("output_token_ids", []), a.get("output_token_ids", [])
    e_lp, a_lp = e.get("logprobs", []), a.get("logprobs", [])
    for pos in range(min(len(e_tokens), len(a_tokens))):
        et, at = e_tokens[pos], a_tokens[pos]
        e_top, a_top = _top(e_lp, pos), _top(a_lp, pos)
        if et != at:
            fields = [FieldDiff(f"{rid}.output_token_ids[{pos}]", et, at),
                      FieldDiff(f"{rid}.logprobs[{pos}]", e_lp[pos] if pos < len(e_lp) else None,
                                a_lp[pos] if pos < len(a_lp) else None)]
            if et in a_top and at in e_top:
                return "numerics", fields
            return "mismatch", fields
        if et in e_top and et in a_top and abs(e_top[et] - a_top[et]) > atol:
            return "logprobs", [FieldDiff(f"{rid}.logprobs[{pos}][token {et}]", e_top[et], a_top[et])]
    if len(e_tokens) != len(a_tokens) or e.get("finish_reason") != a.get("finish_reason"):
        return "mismatch", [FieldDiff(f"{rid}.output_token_ids (length)", len(e_tokens), len(a_tokens)),
                            FieldDiff(f"{rid}.finish_reason", e.get("finish_reason"), a.get("finish_reason"))]
    return None, []


def _top(logprobs: list, pos: int) -> dict:
    if pos >= len(logprobs) or not isinstance(logprobs[pos], list):
        return {}
    return {entry[0]: entry[1] for entry in logprobs[pos] if isinstance(entry, list) and len(entry) == 2}


def _diverged(c: LayerComparison, index: int, e, a, fields: list[FieldDiff], cause: str) -> LayerComparison:
    c.equal, c.index, c.fields, c.cause = False, index, fields, cause
    c.record, c.actual_record = _brief(e), _brief(a)
    c.window = (index, index + 1)
    return c


def _brief(record) -> dict | None:
    """The record without its (long) logprobs, for the report."""
    if not isinstance(record, dict):
        return None
    return {k: v for k, v in record.items() if k != "logprobs"}


def capacity_excess(steps: list[dict]) -> list[dict]:
    """Every step where a forward of the target or the drafter ran more tokens than
    max_num_batched_tokens (the worker's token capacity), and by how much."""
    out = []
    for record in steps:
        limit = record.get("max_num_batched_tokens")
        if not isinstance(limit, int):
            continue
        for who in ("target", "drafter"):
            for tokens in record.get(f"{who}_forward_tokens", []) or []:
                if isinstance(tokens, int) and tokens > limit:
                    out.append({"step": record.get("step"), "forward": who, "tokens": tokens,
                                "limit": limit, "excess": tokens - limit})
    return out
