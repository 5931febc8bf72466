"""The production-scale generator (conformance/formats/workload_gen.py): seeded and deterministic,
within its bounds, every bad parameter named; the scenario hash over its expansion; and the
stand-in's O(1) context (workload.Context), bit-identical to the whole token list."""

import copy
import hashlib
import json
import random

import pytest

from conformance.formats import workload_gen
from conformance.formats.scenario import ScenarioError, at_scale, load_scenario, parse_scenario
from conformance.formats.workload import CONTEXT, Context, draft, verify
from tests.helpers import REPO

STORM = json.loads((REPO / "scenarios" / "prod_kv_storm.json").read_text(encoding="utf-8"))
ARGS = {"max_model_len": 20480, "max_num_batched_tokens": 8192}


def params(**changes) -> dict:
    out = copy.deepcopy(STORM["generate"])
    out.update(changes)
    return out


def expand(p: dict, args: dict = ARGS) -> dict:
    return workload_gen.expand(p, "x.json", args)


# A small workload whose expansion is pinned below: the draws are the generator's own, not
# `random`'s, so no Python upgrade moves them (a change here changes every generated scenario)
PINNED = {"generator": "production/1", "seed": 5, "vocab_size": 1000, "groups": [
    {"name": "a", "arrivals": {"bursts": [[0, 10, 3]]}, "prompt_len": {"lognormal": [100, 1.0], "min": 4, "max": 900},
     "max_tokens": {"uniform": [1, 50]}, "acceptance": {"length": [1, 3], "values": [0, 8]},
     "stop": {"share": 0.5, "ids": [7]}},
    {"name": "b", "arrivals": {"poisson": {"from": 5, "until": 30, "count": 2}}, "prompt_len": {"uniform": [10, 20]},
     "max_tokens": {"lognormal": [40, 0.5], "min": 1, "max": 100}}]}


def test_the_same_parameters_give_the_same_workload_byte_for_byte():
    first, second = expand(params()), expand(params())
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert expand(PINNED, {"max_model_len": 1000, "max_num_batched_tokens": 64}) == EXPECTED


EXPECTED = {"seed": 5, "vocab_size": 1000, "max_steps": 2256, "requests": [
    {"id": "a0", "arrival_step": 0, "prompt_len": 63, "max_tokens": 40, "acceptance": [3], "stop_token_ids": [7]},
    {"id": "a1", "arrival_step": 3, "prompt_len": 312, "max_tokens": 7, "acceptance": [4, 5, 3]},
    {"id": "a2", "arrival_step": 9, "prompt_len": 55, "max_tokens": 5, "acceptance": [2, 0, 8], "stop_token_ids": [7]},
    {"id": "b0", "arrival_step": 21, "prompt_len": 15, "max_tokens": 15},
    {"id": "b1", "arrival_step": 24, "prompt_len": 12, "max_tokens": 19}]}


def test_a_draw_is_the_documented_blake2b():
    draws = workload_gen.Draws(7)
    for i in range(3):
        h = hashlib.blake2b(b"\x07" + b"\0" * 7 + b"s.prompt\0" + i.to_bytes(8, "little"),
                            digest_size=8, person=b"parity-gen")
        assert draws.u("s.prompt", i) == ((int.from_bytes(h.digest(), "little") >> 11) + 0.5) / 2 ** 53
    assert [round(draws.u("s.prompt", i), 12) for i in range(3)] == [0.283467168046, 0.18704582165, 0.067054550732]
    assert draws.u("s.prompt", 0) != draws.u("s.output", 0)  # streams are independent


def test_another_seed_gives_another_workload():
    assert expand(params(seed=1)) != expand(params())


def test_every_request_within_its_bounds():
    w = expand(params())
    groups = {g["name"]: g for g in STORM["generate"]["groups"]}
    assert len(w["requests"]) == 500 and len({r["id"] for r in w["requests"]}) == 500
    arrivals = [r["arrival_step"] for r in w["requests"]]
    assert arrivals == sorted(arrivals)
    for r in w["requests"]:
        g = groups[r["id"].rstrip("0123456789")]
        length = g["prompt_len"]
        low, high = length.get("uniform") or (length["min"], length["max"])
        assert low <= r["prompt_len"] <= high
        assert 1 <= r["max_tokens"] and r["prompt_len"] + r["max_tokens"] <= ARGS["max_model_len"]
        assert 1 <= len(r["acceptance"]) <= 4 and all(0 <= a <= 4 for a in r["acceptance"])
    longs = [r for r in w["requests"] if r["id"].startswith("l")]
    assert [r["arrival_step"] for r in longs] == [40 + 40 * i for i in range(50)]
    assert w["max_steps"] > max(arrivals)


def test_long_tailed_prompts_from_tens_to_sixteen_thousand():
    prompts = sorted(r["prompt_len"] for r in expand(params())["requests"])
    assert prompts[0] < 100 and prompts[-1] > 15000
    assert prompts[len(prompts) // 2] < 400  # most are short: the tail is long


def test_outputs_clipped_to_the_model_length():
    p = params()
    p["groups"][1]["max_tokens"] = {"uniform": [5000, 5000]}
    w = expand(p, {"max_model_len": 16500, "max_num_batched_tokens": 8192})
    for r in w["requests"]:
        assert r["prompt_len"] + r["max_tokens"] <= 16500


@pytest.mark.parametrize("change, field", [
    ({"generator": "production/0"}, "generate.generator"),
    ({"seed": -1}, "generate.seed"),
    ({"vocab_size": True}, "generate.vocab_size"),
    ({"groups": []}, "generate.groups"),
    ({"colour": 1}, "generate.colour"),
    ({"shared_prefixes": {"count": 0, "len": [4, 8], "share": 0.5}}, "generate.shared_prefixes.count"),
    ({"aborts": {"share": 2.0, "after": [1, 5]}}, "generate.aborts.share"),
])
def test_a_bad_top_level_parameter_is_named(change, field):
    with pytest.raises(ScenarioError) as err:
        expand(params(**change))
    assert err.value.field == field, str(err.value)


@pytest.mark.parametrize("path, value, field", [
    (("name",), "S1", "generate.groups[0].name"),
    (("arrivals",), {"bursts": [[0, 0, 3]]}, "generate.groups[0].arrivals.bursts[0][1]"),
    (("arrivals",), {"bursts": [], "every": {}}, "generate.groups[0].arrivals"),
    (("arrivals",), {"poisson": {"from": 5, "until": 5, "count": 1}}, "generate.groups[0].arrivals.poisson.until"),
    (("arrivals",), {"every": {"first": 0, "period": 1000, "count": 200}}, "generate.groups[0].arrivals.every"),
    (("prompt_len", "lognormal"), [150, -1], "generate.groups[0].prompt_len.lognormal[1]"),
    (("prompt_len", "max"), 1, "generate.groups[0].prompt_len.max"),
    (("max_tokens",), {"uniform": [9, 3]}, "generate.groups[0].max_tokens.uniform[1]"),
    (("acceptance", "values"), [0, 2000], "generate.groups[0].acceptance.values[1]"),
    (("stop",), {"share": 2, "ids": [1]}, "generate.groups[0].stop.share"),
    (("stop",), {"share": 0.5, "ids": [151936]}, "generate.groups[0].stop.ids[0]"),
])
def test_a_bad_group_parameter_is_named(path, value, field):
    p = params()
    target = p["groups"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ScenarioError) as err:
        expand(p)
    assert err.value.field == field, str(err.value)


def test_two_groups_with_one_name_are_refused():
    p = params()
    p["groups"][1]["name"] = "s"
    with pytest.raises(ScenarioError, match=r"groups\[1\]\.name: must be 1-8 letters a-z, unique"):
        expand(p)


def test_the_scenario_hash_covers_the_expansion_not_the_scale(tmp_path):
    raw = copy.deepcopy(STORM)
    path = REPO / "scenarios" / "prod_kv_storm.json"
    base = parse_scenario(raw, path)
    assert base.scale == "production" and len(base.workload["requests"]) == 500
    assert parse_scenario(dict(raw, scale="library"), path).sha256 == base.sha256
    moved = copy.deepcopy(raw)
    moved["generate"]["groups"][0]["prompt_len"]["lognormal"] = [151, 0.8]
    assert parse_scenario(moved, path).sha256 != base.sha256
    # the same workload written out by hand is another scenario: the generator's version is hashed
    written = {k: v for k, v in raw.items() if k != "generate"} | {"workload": base.workload}
    assert parse_scenario(written, path).workload == base.workload
    assert parse_scenario(written, path).sha256 != base.sha256


def test_a_scenario_holds_a_workload_or_its_parameters_not_both():
    raw = dict(copy.deepcopy(STORM), workload={"seed": 1})
    with pytest.raises(ScenarioError, match="generate: a scenario holds a `workload` or `generate`, not both"):
        parse_scenario(raw, REPO / "scenarios" / "prod_kv_storm.json")


def test_an_unknown_scale_is_named():
    with pytest.raises(ScenarioError, match="scale: must be one of"):
        parse_scenario(dict(copy.deepcopy(STORM), scale="huge"), REPO / "scenarios" / "prod_kv_storm.json")


def test_the_library_and_the_production_scenarios_are_told_apart():
    scenarios = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))]
    production = at_scale(scenarios, "production")
    assert {"prod_kv_storm"} <= {s.name for s in production}
    assert not {s.name for s in production} & {s.name for s in at_scale(scenarios, "library")}
    assert len(at_scale(scenarios, "all")) == len(scenarios)


# --- the stand-in's context ----------------------------------------------------------------


def _target_next_list(seed, tokens, vocab):  # the list form as it was written first
    h = hashlib.blake2b(digest_size=8, person=b"parity-target")
    h.update(seed.to_bytes(8, "little", signed=True))
    h.update(len(tokens).to_bytes(8, "little", signed=True))
    for token in tokens[-16:]:
        h.update(token.to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little") % vocab


def _verify_list(seed, tokens, drafts, vocab):
    context, out = list(tokens), []
    for proposed in drafts:
        true = _target_next_list(seed, context, vocab)
        out.append(true)
        if proposed != true:
            return out
        context.append(true)
    return out + [_target_next_list(seed, context, vocab)]


def _draft_list(seed, tokens, k, accept, vocab):
    context, out = list(tokens), []
    for i in range(k):
        true = _target_next_list(seed, context, vocab)
        token = true if i < accept else (true + 1) % vocab
        out.append(token)
        context.append(token)
    return out


def test_the_context_gives_the_list_forms_answers_bit_for_bit():
    rng = random.Random(26)
    for _ in range(300):
        vocab = rng.choice([2, 1000, 151936])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 60))]
        seed, k = rng.randrange(1 << 40), rng.randrange(0, 17)
        accept = rng.randrange(0, k + 2)
        proposed = _draft_list(seed, tokens, k, accept, vocab)
        for given in (tokens, Context.of(tokens), Context(len(tokens), tokens[-CONTEXT:])):
            assert draft(seed, given, k, accept, vocab) == proposed
            assert verify(seed, given, proposed, vocab) == _verify_list(seed, tokens, proposed, vocab)
            assert verify(seed, given, [-1] * k, vocab) == _verify_list(seed, tokens, [-1] * k, vocab)


def test_a_context_refuses_what_it_does_not_hold():
    context = Context.of(list(range(40)))
    assert len(context) == 40 and context[-CONTEXT:] == list(range(24, 40))
    with pytest.raises(IndexError):
        context[0]
    with pytest.raises(IndexError):
        context[-CONTEXT - 1:]


def test_shared_prefixes_and_aborts_write_a_valid_workload():
    """The workload's prefixes, each chosen request's prefix within max_model_len, and aborts
    after arrival: what the workload schema accepts and the stand-in drives."""
    from conformance.formats.workload import validate_workload

    args = dict(ARGS, max_model_len=4096)
    w = expand(params(shared_prefixes={"count": 3, "len": [64, 512], "share": 0.5},
                      aborts={"share": 0.2, "after": [1, 50]}), args)
    validate_workload(w, "x.json", args)
    lengths = {p["name"]: p["len"] for p in w["prefixes"]}
    assert sorted(lengths) == ["p0", "p1", "p2"] and all(64 <= n <= 512 for n in lengths.values())
    shared = [r for r in w["requests"] if "prefix" in r]
    aborted = [r for r in w["requests"] if "abort_step" in r]
    assert 0.3 < len(shared) / len(w["requests"]) < 0.7 and 0.1 < len(aborted) / len(w["requests"]) < 0.3
    assert {r["prefix"] for r in shared} == set(lengths)
    for r in shared:
        assert lengths[r["prefix"]] + r["prompt_len"] + r["max_tokens"] <= 4096
    for r in aborted:
        assert r["arrival_step"] < r["abort_step"] < w["max_steps"]
