"""Structured outputs after reasoning, in every pin's goldens (engines/PROTOCOL.md "Structured
outputs after reasoning"): a grammar request samples freely and keeps every draft while it
reasons, its reasoning ends where its reasoning_end says, the end token may arrive inside a
scheduled draft window, and its grammar decides what follows."""

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from tests.engines.tiny_text import decode, follows
from tests.helpers import REPO

pytestmark = pytest.mark.oracle
PINS = load_pins()
NAMES = ("grammar_reasoning", "grammar_reasoning_eagle3", "grammar_reasoning_dflash")
SCENARIOS = {name: load_scenario(REPO / "scenarios" / f"{name}.json") for name in
             (*NAMES, "grammar_reasoning_constrained")}


def _requests(name: str) -> dict:
    return {r["id"]: r for r in SCENARIOS[name].workload["requests"]}


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("name", NAMES)
def test_drafts_are_kept_while_reasoning_and_the_grammar_follows_the_end(name, release):
    layers = GOLDENS.load(name, release).layers
    requests = _requests(name)
    for step in layers["steps"]:
        assert step["grammar_errors"] == []
        for rid, entry in step["requests"].items():
            spec = requests[rid].get("structured_output")
            if spec is None:
                assert "proposed_draft_token_ids" not in entry
                continue
            if rid in step["finished"]:  # a finished request keeps no draft
                continue
            proposed, kept = entry["proposed_draft_token_ids"], entry["next_draft_token_ids"]
            assert proposed[:len(kept)] == kept, (step["step"], rid)
            end = requests[rid].get("reasoning_end")
            if end is None or entry["output_tokens"] <= end["at"]:
                # still reasoning: no draft up to the end token is cut (0.33.0 validates the
                # drafts after one inside the window, 0.27.1 and 0.28.0 keep them too)
                upto = proposed[:proposed.index(end["token_id"]) + 1] if end and end["token_id"] in proposed \
                    else proposed
                assert kept[:len(upto)] == upto, (step["step"], rid)
    outputs = {o["id"]: o for o in layers["outputs"]}
    ended = 0
    for rid, req in requests.items():
        out = outputs[rid]["output_token_ids"]
        end = req.get("reasoning_end")
        if end is None:
            continue
        assert out[end["at"]] == end["token_id"] and end["token_id"] not in out[:end["at"]], rid
        if outputs[rid]["finish_reason"] == "stop":
            ended += 1
            assert out[-1] == 2 and follows(decode(out[end["at"] + 1:]), req["structured_output"]), rid
    assert ended


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("name", NAMES[1:])
def test_the_end_token_arrives_inside_a_scheduled_draft_window(name, release):
    """The manager's mid-window reasoning end: a scheduled draft is the end token, so the rows
    after it in the same step are the grammar's."""
    requests = _requests(name)
    inside = {(rid, step["step"]) for step in GOLDENS.load(name, release).layers["steps"]
              for rid, entry in step["requests"].items()
              if "reasoning_end" in requests[rid]
              and requests[rid]["reasoning_end"]["token_id"] in entry["draft_token_ids"]}
    assert inside


@pytest.mark.parametrize("release", PINS.releases)
def test_a_request_that_never_ends_its_reasoning_keeps_its_grammar_off(release):
    """muse has a grammar and no reasoning_end: every draft kept, its output not its regex's."""
    layers = GOLDENS.load("grammar_reasoning_eagle3", release).layers
    out = {o["id"]: o for o in layers["outputs"]}["muse"]
    assert out["finish_reason"] == "length"
    spec = _requests("grammar_reasoning_eagle3")["muse"]["structured_output"]
    assert not follows(decode(out["output_token_ids"]), spec)
    drafts = [e for step in layers["steps"] for rid, e in step["requests"].items()
              if rid == "muse" and rid not in step["finished"]]
    assert len(drafts) > 3
    assert all(e["next_draft_token_ids"] == e["proposed_draft_token_ids"] for e in drafts)


@pytest.mark.parametrize("release", PINS.releases)
def test_enable_in_reasoning_applies_the_grammar_from_the_first_token(release):
    layers = GOLDENS.load("grammar_reasoning_constrained", release).layers
    requests = _requests("grammar_reasoning_constrained")
    for out in layers["outputs"]:
        assert 2047 not in out["output_token_ids"]  # masked like any token the grammar refuses
        assert out["finish_reason"] == "stop"
        assert follows(decode(out["output_token_ids"]), requests[out["id"]]["structured_output"]), out["id"]


def test_the_reasoning_tokenizer_regenerates_byte_for_byte():
    """engines/vllm/tiny_tokenizer.py --reasoning, with the oracle pin's `tokenizers`; the tiny
    target's folder is not the reasoning variant."""
    import subprocess

    from conformance.process.envs import env_dir, env_python

    python = env_python(env_dir(PINS.oracle))
    if not python.exists():
        pytest.skip(f"the oracle pin's environment is not built ({python}): `parity envs`")
    script = REPO / "engines" / "vllm" / "tiny_tokenizer.py"
    models = REPO / "scenarios" / "models"

    def check(*args):
        return subprocess.run([str(python), str(script), *args], capture_output=True, text=True).returncode

    assert check("--reasoning", "--check", str(models / "reasoning-tokenizer")) == 0
    assert check("--reasoning", "--check", str(models / "tiny-qwen3")) == 1
    assert check("--check", str(models / "reasoning-tokenizer")) == 1
