"""parity fuzz's production-shape space (conformance/fuzz/strategies.py production_scenarios):
drawn through the library's own generator, every example at production shapes and valid."""

from hypothesis import HealthCheck, given, settings

from conformance.formats.scenario import parse_scenario
from conformance.fuzz import strategies
from conftest import REPO

LONG = strategies.LONG_PROMPT[0]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=strategies.production_scenarios())
def test_every_production_example_is_at_production_shapes(raw):
    scenario = parse_scenario(raw, REPO / "scenarios" / "fuzz.json")  # valid, as any scenario file
    args, reqs = scenario.engine_args, scenario.workload["requests"]
    assert args["max_num_batched_tokens"] >= 8192 and 64 <= len(reqs) <= 256 + 1
    long = [r for r in reqs if r["id"].startswith("l")]
    assert all(r["prompt_len"] >= LONG for r in long) and len(long) <= 1
    assert all(r["prompt_len"] + r["max_tokens"] <= args["max_model_len"] for r in reqs)
    assert scenario.scale == "library"  # held and judged whole, as every fuzz example


def test_the_long_prompt_is_drawn_and_shrinks_away():
    from hypothesis import find

    with_long = find(strategies.production_scenarios(),
                     lambda raw: any(r["prompt_len"] >= LONG for r in raw["workload"]["requests"]))
    assert max(r["prompt_len"] for r in with_long["workload"]["requests"]) >= LONG
    plain = find(strategies.production_scenarios(), lambda raw: True)
    assert max(r["prompt_len"] for r in plain["workload"]["requests"]) < LONG  # shrinks toward no long prompt
