"""parity fuzz's production-shape space (conformance/fuzz/strategies.py production_scenarios):
drawn through the library's own generator, every example at production shapes and valid."""

import pytest
from hypothesis import HealthCheck, given, settings

from conformance.formats.scenario import parse_scenario
from conformance.fuzz import strategies
from tests.helpers import REPO

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


def test_the_production_part_reaches_the_three_thresholds_in_a_tenth_of_its_examples():
    """Counted over the examples the strategy draws with a fixed seed: a prompt of 8k tokens or
    more, a budget of 8192 or more and 64 requests or more, all three in one example, in at least
    10% of them (half by design: the long prompt is a coin toss)."""
    from hypothesis import seed

    drawn = []

    @seed(26)
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(raw=strategies.production_scenarios())
    def draw(raw):
        reqs = raw["workload"]["requests"]
        drawn.append(max(r["prompt_len"] for r in reqs) >= 8192
                     and raw["engine_args"]["max_num_batched_tokens"] >= 8192 and len(reqs) >= 64)

    draw()
    assert len(drawn) >= 50 and sum(drawn) >= len(drawn) / 10, (sum(drawn), len(drawn))


def test_production_scenarios_keep_to_the_declared_features():
    """A candidate that declares no speculative method, no prefix caching, no async scheduling,
    no shared prefixes and no aborts gets production examples needing none of them."""
    from conformance.formats.features import needed

    @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(raw=strategies.production_scenarios(allowed=frozenset()))
    def plain(raw):
        assert needed(raw["engine_args"], raw["workload"]) == ()
        assert raw["engine_args"]["async_scheduling"] is False

    plain()


def test_async_scheduling_is_drawn_on_off_and_left_to_vllm_with_aborts_too():
    """Both parts draw async scheduling off, on and left to vLLM's default, a workload that
    aborts a request included (the async loop drives aborts between iterations)."""
    seen, with_aborts = set(), set()

    def check(raw):
        seen.add(raw["engine_args"]["async_scheduling"])
        if any("abort_step" in r for r in raw["workload"]["requests"]):
            with_aborts.add(raw["engine_args"]["async_scheduling"])

    for space, examples in ((strategies.scenarios(), 150), (strategies.production_scenarios(), 30)):
        settings(max_examples=examples, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))(given(raw=space)(lambda raw: check(raw)))()
    assert seen == {False, True, None} and True in with_aborts, (seen, with_aborts)


def test_each_part_s_examples_are_counted_and_said():
    """The progress lines and the summary give each part's examples and rate (TEST DOUBLE pair)."""
    from tests.fuzz.double_pair import DoublePair

    from conformance.fuzz.search import PRODUCTION, SMALL, Search

    said: list[str] = []
    search = Search(DoublePair(bug=False), 3, said.append, examples=106, production_every=2)
    assert search.run() == []
    parts = search.stats.parts
    assert (parts[SMALL].examples, parts[PRODUCTION].examples) == (100, 6)  # rounds: small, production
    assert said[-1].startswith("[fuzz] small 100 examples (") and ", production 6 (" in said[-1], said[-1]
    engine = DoublePair(bug=False)
    engine.layers = ["engine_steps", "engine_outputs"]  # no production part on the engine layers
    assert Search(engine, 3, said.append, examples=1).stats.parts_text() == "small 0 examples (0.0/s)"


@pytest.mark.oracle
@pytest.mark.parametrize("mutant", ["ignore-max-num-seqs"])  # warm in test_fuzz_search's group too
def test_a_production_finding_is_shrunk_to_a_small_scenario(mutant, warm_sessions, tmp_path):
    """A built-in TEST DEVICE mutant (admission past max_num_seqs) found at production shapes is
    shrunk (hypothesis, then fuzz/reduce.py, then the polish) to a few requests, confirmed, and
    its report shows the shape it was found at and the one it was shrunk to."""
    from conformance.formats.pins import load_pins
    from conformance.fuzz import campaign as fuzz_cli
    from conformance.fuzz.search import PRODUCTION, Pair, Search

    oracle = load_pins().oracle
    pair = Pair.warm(warm_sessions(oracle), warm_sessions(f"{oracle}+mutant:{mutant}"), ["steps", "outputs"])
    try:
        [finding] = Search(pair, 1, lambda m: None, examples=6, shrink_limit=60.0, production_every=1).run()
        fuzz_cli.confirm(pair, finding, tmp_path, 1, mutant, oracle, lambda m: None)
    finally:
        pair.close()
    assert finding.part == PRODUCTION and finding.confirmed, finding.signature
    assert finding.first_requests >= 64 and len(finding.raw["workload"]["requests"]) <= 3
    text = fuzz_cli.report(finding, oracle, 1, mutant, oracle)
    assert f"shape:    production part; found at {finding.first_shape}; shrunk to {len(finding.raw['workload']['requests'])} request" in text, text


def test_the_production_space_draws_every_family_the_small_space_draws():
    """Over a fixed seed's examples, each family of the small space (strategies.families) turns
    up in the production space too, each example still a valid scenario."""
    from hypothesis import seed

    seen = set()

    @seed(42)
    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(raw=strategies.production_scenarios())
    def draw(raw):
        parse_scenario(raw, REPO / "scenarios" / "fuzz.json")
        args, reqs = raw["engine_args"], raw["workload"]["requests"]
        seen.update(name for name, there in (
            ("priorities", any("priority" in r for r in reqs)),
            ("eos", any("eos_token_id" in r for r in reqs)),
            ("min_tokens", any("min_tokens" in r for r in reqs)),
            ("repetition_detection", any("repetition_detection" in r for r in reqs)),
            ("kv_connector", "kv_transfer_config" in args and any("external" in r for r in reqs)),
            ("hybrid model", args["model"] == strategies.HYBRID),
            ("lora", args.get("enable_lora") is True and any("lora" in r for r in reqs)),
        ) if there)

    draw()
    assert seen == {"priorities", "eos", "min_tokens", "repetition_detection", "kv_connector", "hybrid model",
                    "lora"}, seen
