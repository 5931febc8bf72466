"""Comparison of the engine layers: knows *why* two real-engine runs differ.

Two real engines can differ because they decide differently (a scheduling divergence: a bug
a port must fix) or because their arithmetic differs in the last bits (another CPU, bf16 on
a GPU, another kernel). The rules, after vLLM's own check_outputs_equal and
check_logprobs_close (tests/models/utils.py):

engine_outputs, per request (sorted by id), position by position:
  - same token: every entry of the two top-k lists is compared. A token both sides list must
    agree within the scenario's tolerance (`logprob_atol`); a token only one side lists must not
    beat the other side's k-th logprob by more than the tolerance (it would have been in the
    other side's top-k). Either is a `logprobs` difference: a logit scale of 1.1 keeps every
    greedy token and moves the rest of the top-k by nats.
  - different token (a flip): the ORACLE's logprobs decide, never the candidate's. It is
    `numerics` only when the oracle's own top-k lists both tokens and its top-1 margin over the
    candidate's token (the oracle's token's logprob minus the candidate's token's, both as the
    oracle reports them: its top-1 minus top-2 when the candidate took the runner-up) is within
    the tolerance either way: a near-tie that different arithmetic resolves the other way. Even
    then the top-k at that position must agree as at any other (a `logprobs` difference
    otherwise), so a candidate's numbers can fail it but never excuse it. The logprobs are the
    model's raw ones (vLLM's default logprobs_mode), so where a logits processor masked a token
    (min_tokens' stop tokens) the oracle may emit a token its logprobs rank below the
    candidate's: that margin is negative, and beyond the tolerance no near-tie. Any other flip
    is a `mismatch` (failing), with the margin as evidence. After a genuine near-tie the request is not
    compared further: its prefix differs from there on, so its later tokens, its length and its
    finish reason legitimately differ, and no golden holds the oracle's answer to the
    candidate's prefix. The evidence says how many of the oracle's positions were left
    unjudged; the other requests are still compared whole.
engine_steps, at the first step that differs (budget and worker counts are context, as in
the steps layer):
  - a scheduling field differs (scheduled tokens, draft tokens, new / resumed / preempted):
    `scheduling`, a decision that differs on the same state (every earlier step was equal);
  - only accepted drafts or finished requests differ: the drafter or the target decided
    differently. That is `numerics` only with evidence: the oracle's own logprobs show a
    near-tie (top-1 minus top-2 within the tolerance) at the output position where the two
    sides' acceptance parts. Without it the cause is `acceptance`, a failing divergence (a
    rejection sampler that drops the bonus token, say): no arithmetic noise rejects a draft
    the target prefers by a wide margin.
  - only the state recorded after the update differs (computed or output tokens, KV blocks,
    queues): `state`, a failing divergence in what the engine kept, every decision equal;
  - nothing but the recorded budget or the worker's token counts differ: `context` (every
    decision is equal; a release that records its per-step input budget, say).
Capacity: every forward the worker ran, target and drafter, against max_num_batched_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.formats.kinds import Kind
from conformance.judging.compare import AFTER_UPDATE, CONTEXT_FIELDS, FieldDiff, LayerComparison

NUMERICS_CAUSES = frozenset({Kind.NUMERICS})  # differences arithmetic explains, with evidence
STEP_CONTEXT = CONTEXT_FIELDS["engine_steps"]
MODEL_FIELDS = ("accepted_draft_tokens", "finished")  # decided by the model's outputs
# State recorded after a step's update: where it differs beside an acceptance difference, it
# follows from it; where it differs alone, the engine kept its state differently (`state`).
STATE_FIELDS = tuple(f for f in AFTER_UPDATE if f not in MODEL_FIELDS)


def step_cause(c: LayerComparison, expected: list[dict], oracle_outputs: list[dict] = (),
               atol: float = 0.0) -> LayerComparison:
    """The cause of an engine_steps difference, on the layer's exact comparison `c` (its first
    divergent step found as in every layer: judging/compare.py), with its evidence."""
    if not c.equal:
        decided = [f.path for f in c.fields if _top_field(f.path) not in STEP_CONTEXT]
        model = [p for p in decided if _leaf(p) in MODEL_FIELDS or _top_field(p) in MODEL_FIELDS]
        state = [p for p in decided if _leaf(p) in STATE_FIELDS or _top_field(p) in STATE_FIELDS]
        c.cause = ("context" if not decided else
                   "scheduling" if len(model) + len(state) < len(decided) else
                   "acceptance" if model else "state")
        if c.cause == "acceptance":
            _acceptance_evidence(c, expected, oracle_outputs, atol)
    return c


def _top_field(path: str) -> str:
    return path.split(".")[0].split("[")[0]


def _leaf(path: str) -> str:
    return path.rsplit(".", 1)[-1].split("[")[0]


def _acceptance_evidence(c: LayerComparison, steps: list[dict], oracle_outputs, atol: float) -> None:
    """Decide an acceptance difference: `numerics` where the oracle's logprobs show a near-tie at
    the output position where the two sides' acceptance parts, else `acceptance` (failing)."""
    here, there = c.record or {}, c.actual_record or {}
    margins = {r.get("id"): r.get("logprobs", []) for r in oracle_outputs if isinstance(r, dict)}
    found = []
    for rid, e in sorted((here.get("requests") or {}).items()):
        a = (there.get("requests") or {}).get(rid, {})
        ea, aa = e.get("accepted_draft_tokens"), a.get("accepted_draft_tokens")
        if ea == aa or not isinstance(ea, int) or not isinstance(aa, int):
            continue
        draft = min(ea, aa)  # the first draft one side accepted and the other rejected
        before = _output_tokens_before(steps, c.index, rid)
        position = None if before is None else before + draft
        margin = _margin(margins.get(rid, []), position)
        found.append((rid, draft, position, margin))
    if not found:
        return  # only `finished` differs: no draft to judge, a failing difference
    near = [f for f in found if f[3] is not None and within(f[3], atol)]
    rid, draft, position, margin = (near or found)[0]
    where = (f"step {c.index}, request {rid}, draft position {draft}"
             + (f" (output position {position})" if position is not None else ""))
    if near:
        c.cause = Kind.NUMERICS
        c.evidence = (f"acceptance differs at {where}: the oracle's top-1 margin there is {margin:.4g}, "
                      f"within the tolerance {atol:g}: a near-tie, resolved differently by "
                      "different arithmetic")
    elif margin is not None:
        c.evidence = (f"acceptance differs at {where}: the oracle's top-1 margin there is {margin:.4g}, "
                      f"beyond the tolerance {atol:g}: no arithmetic noise explains it")
    else:
        c.evidence = (f"acceptance differs at {where}: the oracle's records name no top-1 margin "
                      "there, so no near-tie explains it")


def _output_tokens_before(steps: list[dict], index: int, rid: str) -> int | None:
    """The request's output tokens after the last step before `index` (recorded per request
    as `output_tokens`); 0 before its first step, None when the records do not say."""
    for record in reversed(steps[:index]):
        state = (record.get("requests") or {}).get(rid)
        if state is not None:
            value = state.get("output_tokens")
            return value if isinstance(value, int) else None
    return 0


def _margin(logprobs: list, position: int | None) -> float | None:
    """Top-1 minus top-2 logprob of the oracle at an output position."""
    if position is None or position >= len(logprobs):
        return None
    values = sorted(top_k(logprobs, position).values(), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def compare_engine_outputs(expected: list[dict], actual: list[dict], atol: float) -> LayerComparison:
    """The outputs of a configuration both sides served (a refused one is compared exactly:
    judging/comparators.py), request by request, as the module doc says."""
    c = LayerComparison("engine_outputs", expected == actual, expected_count=len(expected),
                        actual_count=len(actual))
    if c.equal:
        return c
    near_ties: list[tuple[int, RequestDiff]] = []
    e_ids, a_ids = [r.get("id") for r in expected], [r.get("id") for r in actual]
    if e_ids != a_ids and set(e_ids) == set(a_ids):  # one record per request, sorted by id (PROTOCOL.md)
        at = next((i for i, (x, y) in enumerate(zip(e_ids, a_ids)) if x != y), min(len(e_ids), len(a_ids)))
        e, a = (expected[at] if at < len(expected) else None), (actual[at] if at < len(actual) else None)
        c = _diverged(c, at, e, a, [FieldDiff(f"<record {at}>.id", *(ids[at] if at < len(ids) else "<absent>"
                                                                        for ids in (e_ids, a_ids)))], "mismatch")
        c.evidence = ("engine_outputs holds one record per request, sorted by id: the candidate's "
                      f"{len(a_ids)} records name the oracle's requests in another order or more than once")
        return c
    e_by, a_by = {r.get("id"): r for r in expected}, {r.get("id"): r for r in actual}
    ids = sorted(set(e_by) | set(a_by), key=str)
    for index, rid in enumerate(ids):
        e, a = e_by.get(rid), a_by.get(rid)
        if e is None or a is None:  # a request only one side has
            return _diverged(c, index, e, a, [FieldDiff(f"{rid}", e, a)], "mismatch")
        diff = _compare_request(rid, e, a, atol)
        if diff is None:
            continue
        if diff.cause != Kind.NUMERICS:
            c = _diverged(c, index, e, a, diff.fields, diff.cause)
            c.evidence = diff.evidence
            return c
        near_ties.append((index, diff))
    if not near_ties:
        c.equal = True  # every difference is within the tolerance
        return c
    index, diff = near_ties[0]
    c = _diverged(c, index, e_by[ids[index]], a_by[ids[index]], diff.fields, Kind.NUMERICS)
    c.evidence = diff.evidence
    unjudged = sum(d.unjudged for _, d in near_ties)
    c.explanation = (f"{len(near_ties)} request(s) differ only at a near-tie of the oracle (its top-1 "
                     f"margin within the tolerance {atol:g}), resolved differently by different "
                     f"arithmetic; {unjudged} later position(s) of the oracle left unjudged")
    return c


@dataclass
class RequestDiff:
    """How one request differs: the cause, the fields, the evidence behind a token flip, and,
    after a near-tie, how many of the oracle's later positions were left unjudged."""
    cause: str
    fields: list[FieldDiff]
    evidence: str = ""
    unjudged: int = 0


def _compare_request(rid, e: dict, a: dict, atol: float) -> RequestDiff | None:
    """How one request differs, or None when it agrees (its logprobs within `atol`)."""
    e_tokens, a_tokens = e.get("output_token_ids", []), a.get("output_token_ids", [])
    e_lp, a_lp = e.get("logprobs", []), a.get("logprobs", [])
    if len(a_lp) != len(a_tokens):  # one top-k per output position (PROTOCOL.md), whatever the noise
        return RequestDiff("logprobs", [FieldDiff(f"{rid}.logprobs (positions)", len(e_lp), len(a_lp))])
    for pos in range(min(len(e_tokens), len(a_tokens))):
        e_top, a_top = top_k(e_lp, pos), top_k(a_lp, pos)
        if e_tokens[pos] != a_tokens[pos]:
            fields = [FieldDiff(f"{rid}.output_token_ids[{pos}]", e_tokens[pos], a_tokens[pos]),
                      FieldDiff(f"{rid}.logprobs[{pos}]", e_lp[pos] if pos < len(e_lp) else None,
                                a_lp[pos] if pos < len(a_lp) else None)]
            return _token_flip(rid, pos, e_tokens, a_tokens[pos], e_top, a_top, atol, fields)
        beyond = _list_shape(f"{rid}.logprobs[{pos}]", e_lp[pos] if pos < len(e_lp) else [], a_lp[pos],
                             a_tokens[pos]) or _topk_diffs(f"{rid}.logprobs[{pos}]", e_top, a_top, atol)
        if beyond:
            return RequestDiff("logprobs", beyond)
    if len(e_tokens) != len(a_tokens) or e.get("finish_reason") != a.get("finish_reason"):
        return RequestDiff("mismatch", [
            FieldDiff(f"{rid}.output_token_ids (length)", len(e_tokens), len(a_tokens)),
            FieldDiff(f"{rid}.finish_reason", e.get("finish_reason"), a.get("finish_reason"))])
    return None


def _token_flip(rid, pos: int, e_tokens: list, theirs, e_top: dict, a_top: dict, atol: float,
                fields: list[FieldDiff]) -> RequestDiff:
    """A token that differs, judged by the oracle's margin alone (module doc)."""
    ours = e_tokens[pos]
    where = f"output token differs at request {rid}, output position {pos}"
    if ours not in e_top or theirs not in e_top:
        return RequestDiff("mismatch", fields, (
            f"{where}: the candidate's token {theirs!r} is not in the oracle's top-k there, so no "
            "near-tie explains it"))
    margin = e_top[ours] - e_top[theirs]
    if margin < 0 and not within(-margin, atol):
        # The oracle passed over a token its own (raw) logprobs rank higher: a logits processor
        # decided there (min_tokens' mask of stop tokens, say), not a near-tie. A negative margin
        # is no evidence of noise, however small its size.
        return RequestDiff("mismatch", fields, (
            f"{where}: the oracle's logprobs rank the candidate's token above its own by {-margin:.4g} "
            f"there, beyond the tolerance {atol:g}: the oracle chose against its raw logprobs (a "
            "logits processor such as min_tokens' stop-token mask decided), so no near-tie explains it"))
    if not within(margin, atol):
        return RequestDiff("mismatch", fields, (
            f"{where}: the oracle's top-1 margin over the candidate's token there is {margin:.4g}, "
            f"beyond the tolerance {atol:g}: no arithmetic noise explains it"))
    beyond = _topk_diffs(f"{rid}.logprobs[{pos}]", e_top, a_top, atol)
    if beyond:  # a near-tie, but the candidate's top-k there is off: its numbers can only fail it
        return RequestDiff("logprobs", beyond)
    unjudged = len(e_tokens) - pos - 1
    return RequestDiff(Kind.NUMERICS, fields, (
        f"{where}: the oracle's top-1 margin over the candidate's token there is {margin:.4g}, "
        f"within the tolerance {atol:g}: a near-tie, resolved differently by different arithmetic; "
        f"the request's {unjudged} later position(s) are left unjudged (its continuation "
        "legitimately differs)"), unjudged)


def _list_shape(path: str, e_list: list, a_list: list, sampled) -> list[FieldDiff]:
    """A position's list that is no top-k: a token listed twice, or another number of entries
    than the oracle's, unless the one more or less is the sampled token, listed last when the
    top-k leaves it out (noise may move it across the k-th place)."""
    tokens = [entry[0] for entry in a_list if isinstance(entry, list) and entry]
    if len(set(tokens)) != len(tokens):
        return [FieldDiff(f"{path} (a token listed twice)", len(e_list), len(tokens))]
    longer = max((e_list, a_list), key=len)
    if abs(len(e_list) - len(a_list)) > 1 or (len(e_list) != len(a_list) and longer[-1][:1] != [sampled]):
        return [FieldDiff(f"{path} (entries)", len(e_list), len(a_list))]
    return []


def within(margin: float, atol: float) -> bool:
    """A margin within the tolerance; logprobs are rounded to a few decimals, so a margin equal
    to the tolerance may come out a hair above it in binary floating point."""
    return margin <= atol + 1e-9


def _topk_diffs(path: str, e_top: dict, a_top: dict, atol: float) -> list[FieldDiff]:
    """Every top-k entry of one position: a token both sides list agrees within `atol`; a token
    one side lists alone does not beat the other side's k-th logprob by more than `atol`."""
    out = [FieldDiff(f"{path}[token {t}]", e_top[t], a_top[t])
           for t in sorted(set(e_top) & set(a_top), key=lambda t: -e_top[t])
           if abs(e_top[t] - a_top[t]) > atol]
    for mine, other, shown in ((e_top, a_top, lambda t: (e_top[t], "<not in top-k>")),
                               (a_top, e_top, lambda t: ("<not in top-k>", a_top[t]))):
        if not other:
            continue
        floor = min(other.values())
        out += [FieldDiff(f"{path}[token {t}]", *shown(t))
                for t in sorted(set(mine) - set(other), key=lambda t: -mine[t]) if mine[t] > floor + atol]
    return out


def top_k(logprobs: list, pos: int) -> dict:
    """{token id: logprob} of one output position's top-k (empty past the end)."""
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
