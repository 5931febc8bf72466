"""The gate's stand-ins read from their goldens (conformance/gate/recorded.py): the same verdicts
their live runs give, no environment and no process for them, and what a missing golden says."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from conformance import cli
from conformance.formats.engine_ref import RECORDED, EngineRef
from conformance.formats.errors import InputError
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.gate.context import RunContext
from conformance.gate.engines import gate_engines
from conformance.gate.plan import pins_needed, plan_inputs, shard_plan
from conformance.gate.recorded import recorded_session
from conformance.judging.goldens import GoldenStore
from conformance.process.launch import prepare_engine
from tests.helpers import CANDIDATE_PINS, GATE, REPO

PINS = load_pins()
ENGINE = REPO / "scenarios" / "engine_ngram.json"


def test_a_pins_goldens_parse_as_an_engine_that_starts_no_process():
    ref = EngineRef.parse(f"{PINS.candidates[0]}+goldens", PINS)
    assert ref.kind is RECORDED and ref.release == PINS.candidates[0] and not ref.kind.runs
    assert ref.label == f"vllm-{PINS.candidates[0]}+goldens" and not ref.is_pin  # never an oracle
    assert EngineRef.from_json(ref.with_role("stand-in").to_json(), PINS) == ref.with_role("stand-in")
    with pytest.raises(InputError, match=r"read by `parity gate`.*give .* to run the pin itself"):
        prepare_engine(ref, PINS, log=lambda m: None)


@pytest.mark.parametrize("stand_ins, built", [("goldens", "oracle"), ("live", "every pin")])
def test_a_gate_without_a_candidate_builds_the_environments_it_runs(stand_ins, built):
    """Read from their goldens, the stand-ins need no environment: `parity envs` given the
    gate's plan options builds the oracle's alone; run live, every pin's."""
    engines = gate_engines(PINS, [], lambda m: None, stand_ins)
    scenarios = [load_scenario(GATE), load_scenario(ENGINE)]
    manifest, share = shard_plan(RunContext(PINS, lambda m: None), scenarios, engines)
    expected = [PINS.oracle] if built == "oracle" else list(PINS.releases)
    assert pins_needed(manifest, share, PINS) == expected
    read = [u for u in manifest.units if u.engine.endswith("+goldens")]
    assert (stand_ins == "goldens") == bool(read) and all(u.cost == 0 for u in read)


@pytest.mark.parametrize("scale, default", [("library", "goldens"), ("production", "live"), ("all", "live")])
def test_the_stand_ins_run_live_by_default_where_goldens_hold_digests(scale, default):
    """A production scenario's golden holds digests, not the records a report shows at a first
    difference: with --scale production or all the stand-ins run live unless told otherwise."""
    args = cli.build_parser().parse_args(["gate", "--scale", scale])
    engines = plan_inputs(args, PINS, lambda m: None)[3]
    assert {e.kind.runs for e in engines[1:]} == {default == "live"}
    args = cli.build_parser().parse_args(["gate", "--scale", scale, "--stand-ins", "goldens"])
    assert not any(e.kind.runs for e in plan_inputs(args, PINS, lambda m: None)[3][1:])


def test_parity_envs_with_the_default_stand_ins_builds_the_oracles_environment_alone(capsys):
    assert cli.main(["envs", "--stand-ins", "goldens", "--key"]) == 0
    oracle_only = capsys.readouterr().out
    assert cli.main(["envs", "--pin", PINS.oracle, "--key"]) == 0
    assert capsys.readouterr().out == oracle_only
    assert cli.main(["envs", "--stand-ins", "live", "--key"]) == 0
    assert capsys.readouterr().out != oracle_only


def test_a_stand_in_without_its_golden_is_missing_golden_naming_it(tmp_path):
    store = GoldenStore(tmp_path, PINS)  # no golden at all
    release = PINS.candidates[0]
    session = recorded_session(EngineRef.recorded(release), "cpu", store)
    trace = session.trace(load_scenario(GATE), ["config"])
    assert trace.failure.kind == "missing_golden"
    assert str(tmp_path / "dflash_27b_gate" / f"vllm-{release}.json") in trace.failure.message
    assert "--stand-ins live runs the pin" in trace.failure.message


def test_a_stand_ins_golden_of_another_version_of_the_scenario_is_not_read():
    other = replace(load_scenario(GATE), sha256="0" * 64)  # the scenario edited since its goldens
    trace = recorded_session(EngineRef.recorded(PINS.candidates[0]), "cpu").trace(other, ["config"])
    assert trace.failure.kind == "missing_golden" and "another version of scenario" in trace.failure.message
    assert trace.layers == {}


def test_a_stand_ins_trace_is_its_golden_under_its_recorded_hello():
    release = PINS.candidates[0]
    trace = recorded_session(EngineRef.recorded(release), "cpu").trace(load_scenario(GATE), ["config"])
    golden = GoldenStore(REPO / "goldens", PINS).load("dflash_27b_gate", release)
    assert trace.failure is None
    assert trace.layers == {"config": golden.layers["config"]}
    assert trace.engine["version"] == release
    assert trace.provenance["environment"] == golden.provenance["environment"]


@pytest.mark.oracle
@pytest.mark.xdist_group(CANDIDATE_PINS)  # warms every pin: where the other pins' tests run
def test_stand_ins_read_from_their_goldens_get_the_verdicts_of_their_live_runs(capsys, warm_gate):
    """The same gate with its stand-ins read, then run live (warm sessions of every pin): the
    report is the same but for the stand-ins' names and the one message a live pin words
    itself (a pin without a CPU engine refusing an engine-layer scenario)."""
    scenarios = ["--scenario", str(GATE), "--scenario", str(ENGINE)]
    assert cli.main(["gate", *scenarios]) == 0
    read, err = capsys.readouterr()
    assert re.search(r"\[gate\] cold starts: [01] for 3 engines", err), err  # the oracle's, if it was not warm
    assert cli.main(["gate", "--stand-ins", "live", *scenarios]) == 0
    live = capsys.readouterr().out

    def shown(report: str) -> list[str]:
        lines = report.replace("+goldens", "").splitlines()
        return [re.sub(r"\s+", " ", line) for line in lines if "whole engine cannot run on CPU" not in line]

    assert shown(read) == shown(live)
    assert all(f"vllm-{release}+goldens" in read for release in PINS.candidates)
    assert "diverged config.max_num_scheduled_tokens" in read
