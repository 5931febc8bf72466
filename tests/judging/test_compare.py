"""First-divergence comparison: cheap equality, precise location, DeepDiff on a window only."""

from unittest import mock

from conformance.judging import compare
from conformance.judging.compare import compare_layer, field_diffs


def steps(n, **changes):
    out = [{"step": i, "total": 10, "requests": {"a": 5, "b": 5}} for i in range(n)]
    for index, record in changes.items():
        out[int(index[1:])] = record
    return out


def test_equal_layers_never_call_deepdiff():
    with mock.patch.object(compare, "explain", side_effect=AssertionError("deepdiff on equal")):
        assert compare_layer("steps", steps(1000), steps(1000)).equal


def test_first_divergent_record_and_field():
    golden = steps(100)
    cand = steps(100, s40={"step": 40, "total": 11, "requests": {"a": 6, "b": 5}})
    cand[70] = {"step": 70, "total": 0, "requests": {}}
    c = compare_layer("steps", golden, cand)
    assert not c.equal and c.index == 40
    assert [(f.path, f.expected, f.actual) for f in c.fields] == [("requests.a", 5, 6), ("total", 10, 11)]
    assert c.window == (38, 43)
    assert "root[40]" in c.explanation and "root[70]" not in c.explanation


def test_deepdiff_sees_only_the_window():
    seen = []
    with mock.patch.object(compare, "explain", side_effect=lambda e, a, off: seen.append(len(e)) or ""):
        c = compare_layer("steps", steps(10_000), steps(10_000, s5000={"step": 5000}))
        assert seen == []  # made when a report reads it, not when the layers are judged
        assert c.explanation == "" and c.explanation == ""
    assert seen == [2 * compare.WINDOW + 1]  # once, on the window only


def test_length_mismatch_is_reported_at_the_first_missing_record():
    c = compare_layer("steps", steps(5), steps(3))
    assert c.index == 3 and c.first.path == "<record count>" and (c.first.expected, c.first.actual) == (5, 3)


def test_budget_fields_come_first():
    diffs = field_diffs({"block_size": 16, "max_num_scheduled_tokens": 4036, "drafting_slots_per_request": 15},
                        {"block_size": 32, "max_num_scheduled_tokens": 4096, "drafting_slots_per_request": 16})
    assert [d.path for d in diffs] == ["max_num_scheduled_tokens", "drafting_slots_per_request", "block_size"]


def test_log_lines_are_one_field():
    diffs = field_diffs({"budget_log_lines": ["x 4036", "y"]}, {"budget_log_lines": ["x 4096", "y"]})
    assert [d.path for d in diffs] == ["budget_log_lines"]


def test_informational_text_is_shown_but_not_compared():
    oracle = [{"row": "pard/K=8", "refused": True, "refusal_kind": "ValueError", "refusal_text": "vLLM words"}]
    same_kind = [{"row": "pard/K=8", "refused": True, "refusal_kind": "ValueError", "refusal_text": "port words"}]
    assert compare_layer("methods", oracle, same_kind).equal
    accepts = [{"row": "pard/K=8", "refused": False, "refusal_kind": None, "refusal_text": None}]
    c = compare_layer("methods", oracle, accepts)
    assert not c.equal and c.record["row"] == "pard/K=8"
    assert [f.path for f in c.fields] == ["refused", "refusal_kind"]


def test_budget_context_does_not_hide_the_first_decision():
    """Budgets differ on every step (4036 vs 4096); the divergence is where a decision differs."""
    golden = [{"step": i, "token_budget": 4036, "requests": {"r0": {"tokens": 1}}} for i in range(10)]
    cand = [{"step": i, "token_budget": 4096, "requests": {"r0": {"tokens": 1}}} for i in range(10)]
    cand[6]["requests"]["r0"]["tokens"] = 2
    c = compare_layer("steps", golden, cand)
    assert c.index == 6
    assert [(f.path, f.expected, f.actual) for f in c.fields] == [
        ("requests.r0.tokens", 1, 2), ("token_budget", 4036, 4096)]
    cand[6]["requests"]["r0"]["tokens"] = 1
    only_budget = compare_layer("steps", golden, cand)
    assert only_budget.index == 0 and only_budget.first.path == "token_budget"
