"""The `parity` command line, driven with the TEST DOUBLE engine (no vLLM needed)."""

import json
import shutil

import pytest

from conformance import cli
from conformance.commands import compare
from conformance.gate.options import read_scenarios
from conformance.formats.pins import load_pins
from conformance.formats.trace import SCHEMA, load_trace
from conformance.judging.goldens import GOLDENS
from tests.helpers import GATE, double_command

# the gate's config record as the oracle wrote it: every field PROTOCOL.md declares
ORACLE_CONFIG = GOLDENS.load("dflash_27b_gate", load_pins().oracle).layers["config"][0]
BUDGET = ORACLE_CONFIG["max_num_scheduled_tokens"]  # 4036 on 0.27.1, 4096 on 0.28.0
RECORD = {**ORACLE_CONFIG, "budget_log_lines": [
    f"max_num_scheduled_tokens is set to {BUDGET} based on the speculative decoding settings."]}


@pytest.fixture
def record_file(tmp_path):
    def make(record):
        path = tmp_path / f"record-{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(record))
        return str(path)
    return make


def test_bad_scenario_is_refused_before_any_engine_starts(tmp_path, capsys):
    bad = json.loads(GATE.read_text())
    bad["engine_args"]["speculative_config"].pop("model")
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    pidfile = tmp_path / "started"
    status = cli.main(["run", "--engine", double_command("--fault", "fork-hang", "--pidfile", str(pidfile)),
                       "--scenario", str(path), "--out", str(tmp_path / "t.json")])
    assert status == 2
    assert "engine_args.speculative_config.model" in capsys.readouterr().err
    assert not pidfile.exists() and not (tmp_path / "t.json").exists()


def test_run_then_compare(tmp_path, record_file, capsys):
    golden_trace = tmp_path / "golden.json"
    assert cli.main(["run", "--engine", double_command("--record", record_file(RECORD)),
                     "--scenario", str(GATE), "--out", str(golden_trace)]) == 0
    assert json.loads(golden_trace.read_text())["schema"] == SCHEMA
    trace = load_trace(golden_trace)
    assert trace.layers["config"] == [RECORD]

    other = BUDGET + 60  # a port's budget that is not the oracle's
    port = dict(RECORD, max_num_scheduled_tokens=other,
                budget_log_lines=[f"max_num_scheduled_tokens is set to {other} based on the speculative decoding settings."])
    port_trace = tmp_path / "port.json"
    assert cli.main(["run", "--engine", double_command("--record", record_file(port)),
                     "--scenario", str(GATE), "--out", str(port_trace)]) == 0
    capsys.readouterr()
    assert cli.main(["compare", "--trace", str(port_trace), "--golden", str(golden_trace)]) == 1
    out = capsys.readouterr().out
    assert "DIVERGED" in out
    assert f"field max_num_scheduled_tokens: oracle {BUDGET}, candidate {other}" in out
    assert f"! oracle   : max_num_scheduled_tokens is set to {BUDGET}" in out
    assert f"! candidate: max_num_scheduled_tokens is set to {other}" in out
    # the run is named by its hello (engine and version), as the gate names it, not by its command line
    hello = trace.engine
    assert f"== {hello['name']} {hello['version']} [candidate] on " in out, out
    assert "double_engine.py" not in out.splitlines()[0]
    assert cli.main(["compare", "--trace", str(golden_trace), "--golden", str(golden_trace)]) == 0


def test_compare_with_missing_or_corrupt_golden(tmp_path, record_file, capsys):
    trace = tmp_path / "t.json"
    cli.main(["run", "--engine", double_command("--record", record_file(RECORD)), "--scenario", str(GATE),
              "--out", str(trace)])
    assert cli.main(["compare", "--trace", str(trace), "--golden", str(tmp_path / "none.json")]) == 2
    assert "MISSING_GOLDEN" in capsys.readouterr().out
    (tmp_path / "cut.json").write_text(trace.read_text()[:50])
    assert cli.main(["compare", "--trace", str(trace), "--golden", str(tmp_path / "cut.json")]) == 2
    assert "INVALID_GOLDEN" in capsys.readouterr().out


def test_crashing_engine_keeps_a_partial_trace(tmp_path, record_file, capsys):
    out = tmp_path / "t.json"
    status = cli.main(["run", "--engine", double_command("--record", record_file(RECORD), "--fault", "crash"),
                       "--scenario", str(GATE), "--out", str(out)])
    assert status == 2
    trace = load_trace(out)
    assert trace.failure.kind == "crash" and trace.layers["config"] == [RECORD]


def test_goldens_refuse_a_candidate(capsys):
    assert cli.main(["goldens", "--engine", double_command()]) == 2
    assert "only a pinned vLLM oracle" in capsys.readouterr().err


def test_unknown_engine_is_named(capsys):
    assert cli.main(["run", "--engine", "no-such-engine-binary", "--scenario", str(GATE), "--out", "x"]) == 2
    assert "neither a configured pin" in capsys.readouterr().err


def test_selfcheck_passes_a_well_behaved_engine(record_file, capsys):
    assert cli.main(["selfcheck", "--engine", double_command("--record", record_file(RECORD))]) == 0
    assert "protocol self-check: passed" in capsys.readouterr().out


@pytest.mark.parametrize("fault", ["garbage", "out-of-order", "wrong-version", "crash"])
def test_selfcheck_fails_a_broken_engine(record_file, capsys, fault):
    assert cli.main(["selfcheck", "--engine", double_command("--record", record_file(RECORD), "--fault", fault)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_the_gate_runs_the_library_unless_asked_for_another_scale():
    library = {s.name for s in read_scenarios(None, "library")}
    production = {s.name for s in read_scenarios(None, "production")}
    assert {"prod_kv_storm", "prod_dflash_k16", "prod_dflash_k16_async", "prod_prefix_cache"} <= production
    assert "steady_decode" in library and not library & production
    assert {s.name for s in read_scenarios(None, "all")} == library | production
    # a scenario named on the command line runs whatever its scale
    assert [s.name for s in read_scenarios([GATE.parent / "prod_kv_storm.json"], "library")] == ["prod_kv_storm"]
    with pytest.raises(SystemExit):
        cli.main(["gate", "--scale", "huge"])


@pytest.mark.parametrize("bug", [ValueError, KeyError, TypeError])
def test_a_bug_of_the_harness_is_not_bad_input(tmp_path, monkeypatch, capsys, bug):
    """A ValueError (or any exception) that is no typed bad input is a bug of the harness: exit
    3 with its traceback, not exit 2 "bad input" with one line that hides where it came from."""
    def broken(*_):
        raise bug("a bug of the harness")
    monkeypatch.setattr(compare, "judge_trace", broken)
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"schema": SCHEMA, "engine": {"label": "x"},
                                 "scenario": {"name": "dflash_27b_gate", "sha256": "0"},
                                 "layers": {}, "provenance": {}}))
    assert cli.main(["compare", "--trace", str(trace), "--golden", str(trace)]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert "internal error (a bug of the harness" in err
    from conformance.process.reaper import stopping
    assert not stopping()  # engines may start again in this process


def test_typed_bad_input_is_exit_2_without_a_traceback(tmp_path, capsys):
    from conformance.formats.errors import InputError
    from conformance.formats.scenario import ScenarioError
    from conformance.formats.trace import TraceError
    from conformance.judging.waivers import WaiverError
    assert all(issubclass(e, InputError) for e in (ScenarioError, TraceError, WaiverError))
    assert cli.main(["compare", "--trace", str(tmp_path / "none.json"), "--golden", str(GATE)]) == 2
    err = capsys.readouterr().err
    assert "none.json: no such file" in err and "Traceback" not in err
