"""The harness against a real misbehaving process (the TEST DOUBLE engine)."""

import json
import time

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.process.client import EngineFailure, EngineProcess
from conformance.process.launch import EngineSpec
from tests.helpers import GATE, alive

# a complete config record (the double lays a partial one over a complete record of its own)
RECORD = {**GOLDENS.load("dflash_27b_gate", load_pins().oracle).layers["config"][0], "budget_log_lines": ["line"]}


@pytest.fixture
def record_file(tmp_path):
    path = tmp_path / "record.json"
    path.write_text(json.dumps(RECORD))
    return str(path)


def spec(argv, label="double"):
    return EngineSpec(label, tuple(argv))


def test_well_behaved_engine_returns_records(double_engine, record_file):
    with EngineProcess(spec(double_engine("--record", record_file))) as proc:
        assert proc.hello["engine"] == "double"
        assert proc.run(load_scenario(GATE), ["config"]) == {"config": [RECORD]}
        assert proc.run(load_scenario(GATE), ["config"]) == {"config": [RECORD]}


@pytest.mark.parametrize("fault, kind, words", [
    ("crash", "crash", "exited (status 3)"),
    ("garbage", "protocol", "expected a JSON object"),
    ("out-of-order", "protocol", "expected seq 0, got 1"),
    ("bad-count", "protocol", "done says 5 records, 1 arrived"),
    ("wrong-id", "protocol", "expected messages for 'run-1'"),
    ("error", "engine_error", "the double was told to fail"),
])
def test_each_fault_has_a_named_kind(double_engine, record_file, fault, kind, words):
    with EngineProcess(spec(double_engine("--record", record_file, "--fault", fault))) as proc:
        with pytest.raises(EngineFailure) as err:
            proc.run(load_scenario(GATE), ["config"])
    assert err.value.kind == kind
    assert words in str(err.value)


def test_crash_keeps_the_partial_trace(double_engine, record_file):
    with EngineProcess(spec(double_engine("--record", record_file, "--fault", "crash"))) as proc:
        with pytest.raises(EngineFailure) as err:
            proc.run(load_scenario(GATE), ["config"])
    assert err.value.partial == {"config": [RECORD]}


def test_wrong_protocol_version_is_named(double_engine):
    with pytest.raises(EngineFailure, match="expected protocol version 3, got 99$"):
        EngineProcess(spec(double_engine("--fault", "wrong-version"))).start()


def test_an_engine_at_the_older_version_is_told_so_and_what_to_add(double_engine):
    """A protocol-2 port (the C++ kit until it follows) is refused with the reason: its version is
    old, and version 3 adds the steps records' identities."""
    with pytest.raises(EngineFailure) as err:
        EngineProcess(spec(double_engine("--fault", "old-version"))).start()
    assert err.value.kind == "protocol"
    message = str(err.value)
    assert "expected protocol version 3, got 2: the engine speaks an older version of the protocol" in message
    assert '"Changes by version"' in message and "block_ids" in message and "stop_reason" in message


def test_hang_is_timed_out_and_children_are_ended(double_engine, tmp_path):
    pidfile = tmp_path / "pids"
    proc = EngineProcess(spec(double_engine("--fault", "fork-hang", "--pidfile", str(pidfile))))
    proc.start()
    with pytest.raises(EngineFailure) as err:
        proc.run(load_scenario(GATE), ["config"], timeout=2)
    assert err.value.kind == "timeout"
    pids = [int(p) for p in pidfile.read_text().split()]
    time.sleep(0.2)
    for pid in pids:
        assert not alive(pid), f"process {pid} outlived the timeout"  # no orphan left behind


def test_handshake_timeout(double_engine):
    proc = EngineProcess(spec(double_engine("--fault", "no-hello")), handshake_timeout=1)
    with pytest.raises(EngineFailure) as err:
        proc.start()
    assert err.value.kind == "timeout" and "handshake" in str(err.value)


def test_missing_binary_is_a_crash_verdict():
    with pytest.raises(EngineFailure) as err:
        EngineProcess(spec(["/nonexistent/engine"])).start()
    assert err.value.kind == "crash" and "cannot start" in str(err.value)
