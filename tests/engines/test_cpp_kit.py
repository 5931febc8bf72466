"""The C++ adapter kit (engines/cpp/): cross-language stand-in vectors, the protocol rules on
the reference engine, and one gate run of it against the oracle.

`make test` builds the kit first (`make cpp`, engines/cpp/build.sh). Where the compiler or the
libraries are missing and cannot be installed, these tests skip with a one-line reason.
Every process is started from an argument list, never through a shell.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.formats import protocol
from tests.helpers import KIT_RELEASE, REPO

KIT = REPO / "engines" / "cpp"
ENGINE = KIT / "build" / "reference_engine"
CHECK_VECTORS = KIT / "build" / "check_vectors"


def kit_golden(name: str) -> dict:
    return json.loads((REPO / "goldens" / name / f"vllm-{KIT_RELEASE}.json").read_text(encoding="utf-8"))
GEN_VECTORS = KIT / "tests" / "gen_vectors.py"


@pytest.fixture(scope="module")
def kit() -> Path:
    """The built kit; built here when the toolchain is present but the binaries are not."""
    if not (ENGINE.exists() and CHECK_VECTORS.exists()):
        if shutil.which("sh") is None:
            pytest.skip("C++ kit not built and no sh to run engines/cpp/build.sh")
        done = subprocess.run(["sh", str(KIT / "build.sh")], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:  # the toolchain is there and the build failed: a real failure
            pytest.fail(f"engines/cpp/build.sh failed:\n{done.stdout}\n{done.stderr}")
        if not (ENGINE.exists() and CHECK_VECTORS.exists()):
            reason = (done.stdout.strip().splitlines() or ["the C++ kit was not built"])[-1]
            pytest.skip(reason)
    return KIT


# --- 1. the stand-in, bit-exact across languages -------------------------------------------

def test_cpp_stand_in_reproduces_the_python_vectors(kit, tmp_path):
    vectors = tmp_path / "vectors.jsonl"
    subprocess.run([sys.executable, str(GEN_VECTORS), str(vectors)], check=True, timeout=120,
                   capture_output=True)
    done = subprocess.run([str(CHECK_VECTORS), str(vectors)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    cases = int(summary.split()[0])
    assert cases >= 5000 and summary.endswith(", 0 mismatches"), summary
    for fn in ("target_next", "prompt_tokens", "prefix_tokens", "expected_output", "draft", "verify"):
        assert fn in summary


def test_the_vector_check_sees_a_mismatch(kit, tmp_path):
    """The checker is not vacuous: one wrong expected value is one mismatch."""
    from conformance.formats.workload import target_next

    case = {"fn": "target_next", "seed": 0, "tokens": [], "vocab": 2, "expect": target_next(0, [], 2)}
    wrong = dict(case, expect=1 - case["expect"])
    vectors = tmp_path / "vectors.jsonl"
    vectors.write_text(json.dumps(case) + "\n" + json.dumps(wrong) + "\n")
    done = subprocess.run([str(CHECK_VECTORS), str(vectors)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "2 cases" in done.stdout and "1 mismatches" in done.stdout, done.stdout


# --- 2. the protocol, on the reference engine ----------------------------------------------

def test_reference_engine_passes_selfcheck(kit, capsys):
    from conformance.cli import main

    status = main(["selfcheck", "--engine", str(ENGINE), "--scenario", str(REPO / "scenarios" / "steady_decode.json")])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert status == 0, out
    assert "protocol self-check: passed" in out
    assert "layers ['config', 'steps', 'outputs']" in out


class Engine:
    """The reference engine under a raw pipe: what it answers to each line we send."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([str(ENGINE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.hello = self.read()

    def send(self, raw: bytes) -> None:
        self.proc.stdin.write(raw)
        self.proc.stdin.flush()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, "the engine closed its stdout"
        return protocol.decode(line)  # the harness's own reader: every answer must pass it

    def run(self, run_id: str, scenario: dict, layers: list[str]) -> list[dict]:
        self.send(protocol.encode({"type": "run", "id": run_id, "scenario": scenario, "layers": layers}))
        answers = [self.read()]
        while answers[-1]["type"] == "record":
            answers.append(self.read())
        return answers

    def close(self) -> int:
        self.send(protocol.encode({"type": "shutdown"}))
        return self.proc.wait(timeout=10)


def _wire(name: str) -> dict:
    from conformance.formats.scenario import load_scenario

    return load_scenario(REPO / "scenarios" / f"{name}.json").to_wire()


BAD_LINES = {
    "not json": b"this is not json\n",
    "byte-order mark": b'\xef\xbb\xbf{"type":"shutdown"}\n',
    "invalid UTF-8": b'{"type":"run","id":"\xff","scenario":{},"layers":[]}\n',
    "NaN": b'{"type":"run","id":"x","scenario":{"a":NaN},"layers":[]}\n',
    "number overflow": b'{"type":"run","id":"x","scenario":{"a":1e400},"layers":[]}\n',
    "lone surrogate": b'{"type":"run","id":"\\ud800","scenario":{},"layers":[]}\n',
    "too deep": b'{"type":"run","id":"x","layers":[],"scenario":' + b'[' * 70 + b']' * 70 + b'}\n',
    "not an object": b'[1, 2, 3]\n',
    "unknown type": b'{"type":"hello","protocol":1}\n',
    "missing field": b'{"type":"run","scenario":{},"layers":[]}\n',
    "wrong type": b'{"type":"run","id":7,"scenario":{},"layers":[]}\n',
    "boolean for a string": b'{"type":"run","id":true,"scenario":{},"layers":[]}\n',
}


def test_malformed_lines_are_answered_and_the_engine_keeps_serving(kit):
    engine = Engine()
    try:
        assert engine.hello["protocol"] == protocol.PROTOCOL_VERSION and engine.hello["capabilities"] == ["config", "steps", "outputs"]
        for what, raw in BAD_LINES.items():
            engine.send(raw)
            answer = engine.read()
            assert (answer["type"], answer["id"], answer["kind"]) == ("error", None, "bad_request"), what
        # the nesting limit falls where the harness's own reader puts it
        for depth in range(60, 66):
            line = (b'{"type":"run","id":"deep","layers":["no-such-layer"],"scenario":{"a":'
                    + b'[' * depth + b']' * depth + b'}}\n')
            try:
                protocol.decode(line)
                expected = "deep"  # a message: its unknown layer is refused with its id
            except protocol.ProtocolError:
                expected = None
            engine.send(line)
            assert engine.read()["id"] == expected, depth
        # a line over 64 MiB is consumed and refused, and memory stays bounded
        engine.send(b'{"type":"run","id":"' + b"x" * protocol.MAX_LINE_BYTES + b'"}\n')
        answer = engine.read()
        assert (answer["id"], answer["kind"]) == (None, "bad_request") and "at most" in answer["message"]
        # a well-formed run whose scenario is wrong: bad_request with the run's id, naming the field
        scenario = _wire("steady_decode")
        bad = json.loads(json.dumps(scenario))
        bad["engine_args"]["max_num_seqs"] = "four"
        [answer] = engine.run("r-bad", bad, ["config"])
        assert (answer["type"], answer["id"], answer["kind"]) == ("error", "r-bad", "bad_request")
        assert "engine_args.max_num_seqs" in answer["message"]
        # and after all that, a real run
        answers = engine.run("r-ok", scenario, ["config", "steps", "outputs"])
        assert answers[-1] == {"type": "done", "id": "r-ok", "records": len(answers) - 1}
        assert answers[0]["data"]["max_num_scheduled_tokens"] == \
            kit_golden("steady_decode")["layers"]["config"][0]["max_num_scheduled_tokens"]
        assert engine.close() == 0
    finally:
        engine.proc.kill()


def test_layers_it_does_not_serve_are_unsupported(kit):
    engine = Engine()
    try:
        [answer] = engine.run("r-engine", _wire("engine_dflash_gate"),
                              ["config", "engine_config", "engine_steps", "engine_outputs"])
        assert (answer["type"], answer["id"], answer["kind"]) == ("error", "r-engine", "unsupported")
        [answer] = engine.run("r-methods", _wire("method_matrix"), ["config", "methods"])
        assert (answer["type"], answer["kind"]) == ("error", "unsupported")
        assert engine.close() == 0
    finally:
        engine.proc.kill()


def test_config_record_is_the_oracles_on_the_gate_configuration(kit):
    """The 0.27.1 reservation, without the oracle: 4096 - 4 x 15 = 4036, and vLLM's log lines."""
    engine = Engine()
    try:
        answers = engine.run("r-gate", _wire("dflash_27b_gate"), ["config"])
        assert answers[0]["data"] == kit_golden("dflash_27b_gate")["layers"]["config"][0]
        engine.close()
    finally:
        engine.proc.kill()
    bugged = Engine("--no-draft-reservation")
    try:
        record = bugged.run("r-gate", _wire("dflash_27b_gate"), ["config"])[0]["data"]
        assert record["max_num_scheduled_tokens"] == 4096
        bugged.close()
    finally:
        bugged.proc.kill()


# The stand-in scenarios docs/porting.md says the reference engine passes on 0.27.1: a second,
# independent implementation of the driver contract in engines/PROTOCOL.md (arrivals, verify
# steps, padding, empty steps, `finished`) and of the state each step records after its update.
AGREEING = ("prefill_budget_binds", "steady_decode", "kv_pressure", "staggered_arrivals", "stop_conditions",
            "chunk_one_short", "drafts_cut_to_none", "eagle_kv_pressure", "priority_kv_pressure",
            "max_model_len_edge", "drafts_cut_by_budget", "drafts_cut_by_one", "drafts_use_input_budget",
            "long_prefill_threshold", "kv_pressure_no_spec", "long_prefill_threshold_one", "no_chunked_prefill",
            # found by `parity fuzz` against the reference engine, which now follows 0.27.1 on them
            "priority_victim_same_arrival", "drafts_no_pad_without_running",
            # the orthogonal library: core behaviours without speculation or priority
            "core_admission", "core_chunk_first", "core_chunk_second", "core_fcfs_full_batch",
            "core_kv_admission_blocked", "core_long_prefill_threshold", "core_max_model_len",
            "core_resume_chunked", "core_stop_ids",
            # protocol 3: the block pool (ids, hits, eviction), shared prefixes, multi-turn prompts, aborts
            "prefix_caching_resume", "kv_pressure_no_spec_cached", "eagle_kv_pressure_cached",
            "priority_kv_pressure_cached", "block_pool_contract", "prefix_shared_hits", "prefix_full_hit",
            "prefix_eviction", "prefix_duplicate_blocks", "prefix_multi_turn", "prefix_dflash", "prefix_draft_model",
            "prefix_eagle3", "prefix_mtp", "prefix_ngram", "prefix_pard", "abort_states", "abort_mid_prefill",
            "abort_waiting_queue", "abort_waiting_queue_priority", "prefix_duplicate_evicted",
            "prefix_hit_after_prepend", "abort_priority_heap",
            # duplicated blocks evicted first copy first, a prefix one token short of a block,
            # one-token blocks with EAGLE-3
            "prefix_duplicate_first_evicted", "prefix_block_one_short", "prefix_one_token_blocks",
            # the priority policy's victim scheduled earlier in the same step, with requests after
            "priority_victim_scheduled_before",
            # the stops a request may ask for: its eos, min_tokens, repetition detection (and inside
            # accepted DFlash drafts)
            "stop_eos", "stop_min_tokens", "stop_repetition", "stop_repetition_edges", "stop_dflash",
            # two KV cache groups (gpt-oss: sliding-window and full attention) over one block pool
            "sliding_window_chunked", "sliding_window_kv_pressure", "sliding_window_prefix_hits",
            "sliding_window_eagle3_hits",
            # a KV connector (the stand-in's remote store): synchronous and asynchronous loads,
            # failed loads under both policies
            "kv_connector_sync", "kv_connector_async", "kv_connector_failures", "kv_connector_fail_policy",
            # LoRA: admission under max_loras (a skipped request in the side queue, drained first),
            # adapters in the block hashes
            "lora_max_loras_admission", "lora_adapters_come_and_go", "lora_preemption", "lora_prefix_caching",
            "lora_priority", "lora_abort_skipped",
            # a running prefill continued by more than 2048 tokens in one step (the budget left)
            "long_running_chunk", "long_running_chunk_dflash")
# The scenarios whose GPU rule turns async scheduling on: the reference engine drives its
# AsyncScheduler through the kit's batch-queue loop (run_workload_async, a port of
# engines/vllm/async_loop.py), and agrees with 0.27.1 on each of them.
ASYNC_AGREEING = ("async_worked_example", "abort_states_async", "async_draft_model", "async_mtp", "async_pard",
                  "async_peagle", "chunk_one_short_async", "drafts_cut_by_budget_async", "eagle_kv_pressure_async",
                  "kv_pressure_async", "kv_pressure_no_spec_async", "long_prefill_threshold_async",
                  "max_model_len_edge_async", "prefix_caching_resume_async", "priority_kv_pressure_async",
                  "staggered_arrivals_async", "steady_decode_async", "stop_conditions_async", "stop_dflash_async",
                  "kv_connector_async_scheduling", "lora_async_in_flight")


def _async_goldens() -> set[str]:
    """The scenarios with a steps golden of the kit's release whose GPU rule is async."""
    names = set()
    for path in (REPO / "goldens").glob(f"*/vllm-{KIT_RELEASE}.json"):
        layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
        if "steps" in layers and layers["config"][0].get("async_scheduling_gpu"):
            names.add(path.parent.name)
    return names


# The features the reference engine does not have, and declares so (its kFeatures lacks them):
# structured outputs (no grammar library), and with them structured outputs after reasoning
# (a reasoning parser defers a grammar it has not got); streaming input sessions (not implemented yet);
# hybrid mamba models (no MambaManager); KV cache events and prefix-cache resets (its block pool
# queues no events and has no reset); encoder inputs (no multimodal processor to compute the
# encoder budget from).
LACKS = frozenset({"structured_outputs", "reasoning", "streaming_input", "mamba", "kv_cache_events",
                   "prefix_cache_resets", "encoder_inputs"})


def test_agreeing_is_every_steps_scenario_of_the_kit_release(kit):
    """AGREEING and ASYNC_AGREEING name every scenario with a steps golden of the kit's release
    that needs no feature in LACKS: the reference engine declares every other feature, so the
    gate sends it each one, and a new one is either shown to agree or found here."""
    from conformance.formats import features

    engine = Engine()
    try:
        have = frozenset(engine.hello["features"])
        sent = set()
        for path in (REPO / "goldens").glob(f"*/vllm-{KIT_RELEASE}.json"):
            layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
            if "steps" not in layers:
                continue
            wire = _wire(path.parent.name)
            needs = features.needed(wire["engine_args"], wire.get("workload"), wire.get("method_matrix"),
                                    layers["config"][0])
            assert set(features.not_declared(needs, have)) <= LACKS, path.parent.name
            if not features.not_declared(needs, have):
                sent.add(path.parent.name)
        agreeing = set(AGREEING) | set(ASYNC_AGREEING)
        assert sent == agreeing, (sorted(sent - agreeing), sorted(agreeing - sent))
        assert _async_goldens() & sent == set(ASYNC_AGREEING)  # the async ones it is sent
        assert len(ASYNC_AGREEING) >= 10  # the async library
        assert engine.close() == 0
    finally:
        engine.proc.kill()


def test_hello_declares_every_feature(kit):
    """It has every feature but LACKS, async scheduling included (the kit's batch-queue loop),
    and every name is a known one."""
    from conformance.formats import features

    engine = Engine()
    try:
        declared = engine.hello["features"]
        assert features.declared_problem(declared) is None
        assert set(features.FEATURES) - LACKS == set(declared)
        assert engine.close() == 0
    finally:
        engine.proc.kill()


def _steps_and_outputs(engine: "Engine", name: str) -> dict[str, list]:
    answers = engine.run(f"r-{name}", _wire(name), ["steps", "outputs"])
    assert answers[-1]["type"] == "done", (name, answers[-1])
    layers = {"steps": [], "outputs": []}
    for answer in answers[:-1]:
        layers[answer["layer"]].append(answer["data"])
    return layers


def _agreeing_steps(engine, name: str) -> list[dict]:
    """The engine's steps on scenario `name`, its steps and outputs checked equal to the kit
    release's golden."""
    from conformance.judging.compare import compare_layer

    golden = kit_golden(name)["layers"]
    layers = _steps_and_outputs(engine, name)
    for layer in ("steps", "outputs"):
        c = compare_layer(layer, golden[layer], layers[layer])
        assert c.equal, (name, layer, c.index, c.first)
    return layers["steps"]


def test_reference_engine_steps_equal_the_oracles_golden_state_included(kit):
    engine = Engine()
    try:
        for name in AGREEING:
            steps = _agreeing_steps(engine, name)
            assert all({"kv_blocks", "waiting", "running"} <= set(s) for s in steps), name
            assert all({"computed_tokens", "output_tokens", "kv_blocks", "accepted_draft_tokens"} <= set(r)
                       for s in steps for r in s["requests"].values()), name
            assert not any("iteration" in s for s in steps), name  # the synchronous loop
        assert engine.close() == 0
    finally:
        engine.proc.kill()


def test_reference_engine_async_steps_equal_the_oracles_golden(kit):
    """The kit's batch-queue loop (run_workload_async) over the reference engine's AsyncScheduler
    gives 0.27.1's records on every async scenario: the iteration of each schedule() and update,
    each request's output placeholders and delivery (applied, stale after a preemption,
    dropped after a finish or an abort), and the state read after the next schedule()."""
    engine = Engine()
    try:
        deliveries = set()
        for name in ASYNC_AGREEING:
            steps = _agreeing_steps(engine, name)
            assert all({"iteration", "update_iteration"} <= set(s) for s in steps), name
            assert any(s["update_iteration"] > s["iteration"] for s in steps), name  # scheduled ahead
            deliveries |= {r["delivery"] for s in steps for r in s["requests"].values()}
        assert deliveries == {"applied", "stale", "dropped"}  # every kind is exercised and agrees
        assert engine.close() == 0
    finally:
        engine.proc.kill()


def test_sync_loop_device_diverges_on_every_async_scenario(kit):
    """The TEST DEVICE `--sync-loop` (each batch's output processed before the next schedule():
    the synchronous order under async scheduling) differs from 0.27.1's goldens on every async
    scenario: the records hold the loop's order, not only the scheduler's decisions. On
    kv_connector_async_scheduling that order leaves e, whose synchronous load failed, an output
    placeholder its skipped update never takes back, so vLLM's scheduler never schedules it again:
    the run ends with an error at max_steps, which the gate reports as a divergence too."""
    from conformance.judging.compare import compare_layer

    bugged = Engine("--sync-loop")
    try:
        for name in ASYNC_AGREEING:
            if name == "kv_connector_async_scheduling":
                answers = bugged.run(f"r-{name}", _wire(name), ["steps", "outputs"])
                assert (answers[-1]["type"], answers[-1]["kind"]) == ("error", "internal"), answers[-1]
                assert "did not finish within max_steps" in answers[-1]["message"]
                continue
            c = compare_layer("steps", kit_golden(name)["layers"]["steps"], _steps_and_outputs(bugged, name)["steps"])
            assert not c.equal, name
        assert bugged.close() == 0
    finally:
        bugged.proc.kill()


STOP_SCENARIOS = ("stop_eos", "stop_min_tokens", "stop_repetition", "stop_dflash")


def test_ignore_min_tokens_device_diverges_where_min_tokens_holds_a_stop_back(kit):
    """The TEST DEVICE `--ignore-min-tokens` (check_stop without its min_tokens gate) differs from
    0.27.1's outputs on every stop scenario where min_tokens holds back an eos, a stop token or a
    repetition, and not on stop_eos, which has no min_tokens."""
    from conformance.judging.compare import compare_layer

    bugged = Engine("--ignore-min-tokens")
    try:
        differs = {name: not compare_layer("outputs", kit_golden(name)["layers"]["outputs"],
                                           _steps_and_outputs(bugged, name)["outputs"]).equal
                   for name in STOP_SCENARIOS}
        assert differs == {"stop_eos": False, "stop_min_tokens": True, "stop_repetition": True,
                           "stop_dflash": True}
        assert bugged.close() == 0
    finally:
        bugged.proc.kill()


def _layers(engine: Engine, name: str, layers: list[str]) -> dict[str, list]:
    answers = engine.run(f"r-{name}", _wire(name), layers)
    assert answers[-1]["type"] == "done", (name, answers[-1])
    out = {layer: [] for layer in layers}
    for answer in answers[:-1]:
        out[answer["layer"]].append(answer["data"])
    return out


def test_reference_engine_config_equals_the_oracles_golden_on_every_scenario(kit):
    """resolve_config() on every scenario of the library the gate sends it: the budget, the log
    lines, and each refusal in vLLM 0.27.1's order and words (SchedulerConfig.verify_max_model_len,
    VllmConfig._set_max_num_scheduled_tokens). A scenario needing a feature it declares missing
    (a mamba model's block size comes from vLLM's page-size unification) is not sent."""
    from conformance.formats import features
    from conformance.judging.compare import compare_layer

    names = sorted(p.parent.name for p in (REPO / "goldens").glob(f"*/vllm-{KIT_RELEASE}.json"))
    assert {"budget_threshold_over_max_len", "budget_no_chunking_below_max_len", "kv_pressure_no_spec"} <= set(names)
    engine = Engine()
    try:
        refused, skipped = 0, set()
        have = frozenset(engine.hello["features"])
        for name in names:
            wire, golden_config = _wire(name), kit_golden(name)["layers"]["config"]
            needs = features.needed(wire["engine_args"], wire.get("workload"), wire.get("method_matrix"),
                                    golden_config[0])
            if features.not_declared(needs, have):
                skipped.add(name)
                continue
            golden = kit_golden(name)["layers"]["config"]
            got = _layers(engine, name, ["config"])["config"]
            c = compare_layer("config", golden, got)
            assert c.equal, (name, c.index, c.first)
            refused += got[0]["refused"] is not None
        assert refused >= 4  # the refusals are compared too, not only accepted configurations
        assert skipped and len(names) - len(skipped) >= 100, sorted(skipped)  # most are sent
        assert engine.close() == 0
    finally:
        engine.proc.kill()


# --- 3. the gate: the reference engine passes, the bugged one diverges -----------------------

@pytest.mark.oracle
def test_gate_reference_engine_against_the_oracle(kit, capsys, warm_gate):
    """One gate run on the gate scenario (its oracle the tests' warm engine): the verdicts
    docs/porting.md states."""
    from conformance.cli import main

    status = main(["gate", "--candidate", str(ENGINE), "--candidate", f"{ENGINE} --no-draft-reservation",
                   "--scenario", str(REPO / "scenarios" / "dflash_27b_gate.json")])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("dflash_27b_gate "))
    # the matrix: the candidates first (the reference engine, the bugged one, named by its hello
    # and arguments), then the oracle
    assert "parity-cpp-reference 0.1.0 (--no-draft-reservation) [candidate] on dflash_27b_gate" in out
    assert status == 1  # a gating candidate diverged
    from conformance.formats.pins import load_pins
    from conformance.judging.compare import compare_layer
    from conformance.judging.goldens import GOLDENS

    oracle = load_pins().oracle
    if oracle != KIT_RELEASE:  # the reference engine differs from this oracle where the goldens do
        first = compare_layer("config", GOLDENS.load("dflash_27b_gate", oracle).layers["config"],
                              kit_golden("dflash_27b_gate")["layers"]["config"]).first
        assert row.split()[1:3] == ["diverged", f"config.{first.path}"], out
        return
    budget = kit_golden("dflash_27b_gate")["layers"]["config"][0]["max_num_scheduled_tokens"]
    assert row.split()[1:] == ["pass", "diverged", "config.max_num_scheduled_tokens", "pass"], out
    assert f"first divergence at record 0, field max_num_scheduled_tokens: oracle {budget}, candidate 4096" in out


def _gate_beside_device(capsys, flag: str, names: tuple[str, ...]) -> str | None:
    """The gate on these scenarios with the reference engine and its TEST DEVICE `flag` as
    candidates: the device diverges (status 1). Its report, or None where the oracle pin is not
    the kit's release (the goldens the reference engine follows are 0.27.1's)."""
    from conformance.cli import main
    from conformance.formats.pins import load_pins

    status = main(["gate", "--candidate", str(ENGINE), "--candidate", f"{ENGINE} {flag}",
                   *(arg for name in names for arg in ("--scenario", str(REPO / "scenarios" / f"{name}.json")))])
    out = capsys.readouterr().out
    assert f"parity-cpp-reference 0.1.0 ({flag}) [candidate]" in out
    assert status == 1, out  # a gating candidate diverged
    return out if load_pins().oracle == KIT_RELEASE else None


@pytest.mark.oracle
def test_gate_reference_engine_async_loop_against_the_oracle(kit, capsys, warm_gate):
    """The gate on async scenarios (their steps driven by the kit's batch-queue loop): the
    reference engine passes, and the TEST DEVICE `--sync-loop` is diverged at its first record,
    where the update of step 0 comes in the iteration that scheduled it."""
    names = ("async_worked_example", "abort_states_async", "prefix_caching_resume_async")
    out = _gate_beside_device(capsys, "--sync-loop", names)
    if out is None:
        return
    for name in names:  # the reference engine, the device (named by its first difference), the oracle
        row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
        assert row.split()[1:] == ["pass", "diverged", "steps.update_iteration", "pass"], out


@pytest.mark.oracle
def test_gate_catches_a_port_that_ignores_min_tokens(kit, capsys, warm_gate):
    """The gate on the stop scenarios: the reference engine passes each, and the TEST DEVICE
    `--ignore-min-tokens` is diverged on stop_min_tokens at the step where a stop token the
    gate holds back ends the request instead."""
    names = ("stop_eos", "stop_min_tokens")
    out = _gate_beside_device(capsys, "--ignore-min-tokens", names)
    if out is None:
        return
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(names)}
    assert rows["stop_eos"] == ["pass", "pass", "pass"], out
    assert rows["stop_min_tokens"] == ["pass", "diverged", "steps.finished", "pass"], out
    assert "layer steps: first divergence at step 1, field finished: oracle [], candidate [\"r2\"]" in out
