"""The workload validator and the deterministic stand-in (not a model)."""

import json
import shutil

import pytest

from conformance.formats.scenario import ScenarioError, load_scenario
from conformance.formats.workload import draft, prompt_tokens, target_next, verify
from conftest import REPO


def test_stand_in_is_a_pure_function():
    tokens = prompt_tokens(1, "r0", 50, 1000)
    assert tokens == prompt_tokens(1, "r0", 50, 1000)
    assert tokens != prompt_tokens(2, "r0", 50, 1000) and tokens != prompt_tokens(1, "r1", 50, 1000)
    assert all(0 <= t < 1000 for t in tokens)
    assert target_next(1, tokens, 1000) == target_next(1, list(tokens), 1000)


@pytest.mark.parametrize("accept", [0, 1, 5, 8, 20])
def test_drafts_verify_to_the_target_sequence(accept):
    seed, vocab, k = 3, 97, 8
    tokens = prompt_tokens(seed, "r", 30, vocab)
    drafts = draft(seed, tokens, k, accept, vocab)
    assert len(drafts) == k
    sampled = verify(seed, tokens, drafts, vocab)
    assert len(sampled) == min(accept, k) + 1
    # whatever was accepted, the tokens are exactly what the target alone would produce
    expected, seq = [], list(tokens)
    for _ in sampled:
        expected.append(target_next(seed, seq, vocab))
        seq.append(expected[-1])
    assert sampled == expected


@pytest.mark.parametrize("mutate, field", [
    (lambda w: w["requests"][0].update(prompt_len=9000), "workload.requests[0]"),
    (lambda w: w["requests"][0].update(id="../x"), "workload.requests[0].id"),
    (lambda w: w["requests"].append(dict(w["requests"][0])), "workload.requests[1].id"),
    (lambda w: w.update(vocab_size=True), "workload.vocab_size"),
    (lambda w: w.update(bogus=1), "workload.bogus"),
    (lambda w: w["requests"][0].update(acceptance=[-1]), "workload.requests[0].acceptance"),
])
def test_bad_workload_names_the_field(tmp_path, mutate, field):
    shutil.copytree(REPO / "scenarios" / "models", tmp_path / "models")
    data = json.loads((REPO / "scenarios" / "prefill_budget_binds.json").read_text())
    data["workload"]["requests"] = data["workload"]["requests"][:1]
    mutate(data["workload"])
    (tmp_path / "s.json").write_text(json.dumps(data))
    with pytest.raises(ScenarioError) as err:
        load_scenario(tmp_path / "s.json")
    assert err.value.field.startswith(field), err.value
