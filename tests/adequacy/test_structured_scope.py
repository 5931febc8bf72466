"""Structured outputs in the adequacy scope: the scheduler's grammar paths and the structured
output manager's parts it calls are measured and mutated; reasoning parsers stay out, by a
false branch rule that takes the code after `if reasoner is None: return True` (after = true)."""

from __future__ import annotations

import textwrap

import pytest

from conformance.adequacy.scope import SCOPE_FILE, ScopeError, load_scope, out_of_scope_lines
from conformance.process.coverage_run import MEASURED

SOURCE = textwrap.dedent('''\
    class Manager:
        def should_advance(self, request):
            if not request.grammar:
                return False
            reasoner = self.find(request)
            if reasoner is None:
                return True
            ended = request.ended
            return ended

        def loop(self, items):
            for item in items:
                if item is None:
                    continue
                item.go()
            return items
    ''')
# the toy module measured whole, and one false branch rule (`after` filled in by each test)
RULES = (
    'measure = [{file = "m.py", functions = ["*"]}]\n'
    'out_of_scope = [{branch = "^if reasoner is None:$|^if item is None:$", taken = "false", '
    '{after}reason = "test: only the false direction reaches the code after it"}]\n'
)


def _scope(tmp_path, after: str):
    path = tmp_path / "scope.toml"
    path.write_text(RULES.replace("{after}", after))
    return load_scope(path)


def test_after_true_takes_the_code_after_an_if_that_always_leaves(tmp_path):
    out = out_of_scope_lines(SOURCE, _scope(tmp_path, "after = true, "))
    # should_advance's reasoning tail (8-9); in the loop, what follows `continue` in the loop's
    # body (15), not what follows the loop (16)
    assert sorted(out) == [8, 9, 15]
    # without it a false rule takes only an `else` body, here none
    assert out_of_scope_lines(SOURCE, _scope(tmp_path, "")) == {}


@pytest.mark.parametrize("text", [
    '[[out_of_scope]]\nbranch = "x"\ntaken = "true"\nafter = true\nreason = "r"\n',
    '[[out_of_scope]]\nbranch = "x"\ntaken = "false"\nafter = "yes"\nreason = "r"\n',
    '[[out_of_scope]]\nline = "x"\nafter = true\nreason = "r"\n',
])
def test_after_is_refused_but_on_a_false_branch_rule(tmp_path, text):
    path = tmp_path / "scope.toml"
    path.write_text(text)
    with pytest.raises(ScopeError, match=r"out_of_scope\[0\]"):
        load_scope(path)


def test_the_structured_output_managers_decisions_are_measured_with_the_scheduler():
    s = load_scope(SCOPE_FILE)
    manager = "vllm/v1/structured_output/__init__.py"
    assert any(p.endswith("/vllm/v1/structured_output/__init__.py") for p in MEASURED)
    for qualname in ("StructuredOutputManager.should_advance", "StructuredOutputManager.grammar_bitmask",
                     "StructuredOutputManager.trim_reasoning_for_advance"):
        assert s.measured(manager, qualname), qualname
    assert not s.callee(manager)  # mutated in the scheduler's catalog
    assert not s.measured(manager, "StructuredOutputManager.grammar_init")  # EngineCore's, at arrival
    # the scheduler's grammar paths are no longer ruled out
    assert not [r for r in s.rules if r.function in ("Scheduler.get_grammar_bitmask",
                                                     "Scheduler._try_promote_blocked_waiting_request")]
    assert not [r for r in s.rules if r.line and ("grammar" in r.line or "error_req" in r.line)]
    assert [r for r in s.rules if r.function == "StructuredOutputManager._get_reasoner"]
