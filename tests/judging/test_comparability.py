"""Throughput figures are compared only under equal per-step budgets on the same scenario."""


import pytest

from conformance import cli
from conformance.judging.comparability import NotComparable, check_comparable
from conformance.judging.goldens import GOLDENS


def gold(scenario, release):
    return GOLDENS.load(scenario, release)


def test_unequal_budgets_are_refused_with_the_reason():
    with pytest.raises(NotComparable, match="max_num_scheduled_tokens is 4036 for vllm-0.27.1 and 4096 for vllm-0.28.0"):
        check_comparable(gold("steady_decode", "0.27.1"), gold("steady_decode", "0.28.0"))


def test_per_step_budget_is_checked_too():
    a, b = gold("steady_decode", "0.28.0"), gold("steady_decode", "0.28.0")
    b.engine["label"] = "port"
    b.layers["steps"][3]["input_budget"] = 4000
    with pytest.raises(NotComparable, match="at step 3: input_budget is 4096 for vllm-0.28.0 and 4000 for port"):
        check_comparable(a, b)


def test_same_budgets_are_comparable_and_other_scenarios_are_not(tmp_path, capsys):
    a = gold("steady_decode", "0.28.0")
    check_comparable(a, gold("steady_decode", "0.33.0"))
    with pytest.raises(NotComparable, match="different scenario"):
        check_comparable(a, gold("kv_pressure", "0.28.0"))
    assert cli.main(["comparable", str(GOLDENS.path("steady_decode", "0.27.1")),
                     str(GOLDENS.path("steady_decode", "0.28.0"))]) == 1
    assert "NOT COMPARABLE" in capsys.readouterr().out
