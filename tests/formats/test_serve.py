"""The one serve loop (conformance/formats/serve.py), driven in process: what it sends for each kind of
line and each way a run ends. The vLLM worker and the TEST DOUBLE engines serve through it."""

import json

import pytest

from conformance.formats.protocol import PROTOCOL_VERSION, decode, encode
from conformance.formats.scenario import ScenarioError
from conformance.formats.serve import RunError, serve, writer

HELLO = {"engine": "test-double", "version": "0.0-test", "capabilities": ["config", "steps"]}


def run_line(run_id: str, layers: list, scenario: dict | None = None) -> bytes:
    return encode({"type": "run", "id": run_id, "scenario": scenario or {"name": "s"}, "layers": layers})


def session(run, *lines: bytes, **options) -> list[dict]:
    sent: list[bytes] = []
    status = serve(HELLO, run, send=lambda m: sent.append(encode(m)), lines=list(lines), **options)
    assert status == 0
    return [decode(line) for line in sent]


def answer(scenario, layers):
    if scenario.get("bad"):
        raise ScenarioError(scenario["name"], "workload", "bad")
    if "methods" in layers:
        raise RunError("unsupported", "no methods here")
    for layer in layers:
        yield layer, [{"layer": layer, "n": n} for n in range(2 if layer == "steps" else 1)]
        if scenario.get("fail_after") == layer:
            raise KeyError("boom")


def test_hello_then_records_numbered_per_layer_then_done():
    out = session(answer, run_line("r1", ["config", "steps"]), encode({"type": "shutdown"}))
    assert out[0] == {"type": "hello", "protocol": PROTOCOL_VERSION, **HELLO}
    assert [(m["type"], m.get("layer"), m.get("seq")) for m in out[1:]] == [
        ("record", "config", 0), ("record", "steps", 0), ("record", "steps", 1), ("done", None, None)]
    assert out[-1] == {"type": "done", "id": "r1", "records": 3}


def test_a_hello_field_given_wins():  # the wrong-version TEST DOUBLE announces another version
    sent = []
    serve({**HELLO, "protocol": 99}, answer, send=sent.append, lines=[])
    assert sent == [{"type": "hello", "protocol": 99, **HELLO}]


def test_each_way_a_run_ends_becomes_its_error_kind_and_serving_goes_on():
    out = session(answer, b"not json\n",
                  run_line("r1", ["methods"]),
                  run_line("r2", ["config"], {"name": "s", "bad": True}),
                  run_line("r3", ["config", "steps"], {"name": "s", "fail_after": "config"}),
                  encode({"type": "done", "id": "x", "records": 0}),
                  run_line("r4", ["config"]),
                  bad_request=(ScenarioError,))
    errors = [(m["id"], m["kind"], m["message"]) for m in out if m["type"] == "error"]
    assert errors[0][:2] == (None, "bad_request") and "expected a JSON object on one line" in errors[0][2]
    assert errors[1:4] == [("r1", "unsupported", "no methods here"),
                           ("r2", "bad_request", "s: workload: bad"),
                           ("r3", "internal", "KeyError: 'boom'")]
    assert errors[4][:2] == (None, "bad_request") and "expected a run or shutdown message, got 'done'" in errors[4][2]
    # r3's record sent before the failure stays sent, and the next run is served
    assert [m["type"] for m in out if m.get("id") == "r3"] == ["record", "error"]
    assert out[-1] == {"type": "done", "id": "r4", "records": 1}


def test_a_malformed_scenario_is_internal_unless_the_engine_names_it_a_bad_request(capsys):
    out = session(answer, run_line("r1", ["config"], {"name": "s", "bad": True}))
    assert out[-1]["kind"] == "internal" and out[-1]["message"] == "ScenarioError: s: workload: bad"
    assert "Traceback" in capsys.readouterr().err  # an internal failure leaves its traceback on stderr


def test_shutdown_ends_the_session_and_nothing_after_it_is_read():
    out = session(answer, encode({"type": "shutdown"}), run_line("r1", ["config"]))
    assert [m["type"] for m in out] == ["hello"]


def test_a_run_error_has_a_protocol_kind():
    with pytest.raises(ValueError, match="expected an error kind in"):
        RunError("fatal", "no such kind")


def test_each_message_is_one_flushed_protocol_line():
    class Out:
        def __init__(self):
            self.lines, self.flushed = [], 0

        def write(self, data):
            self.lines.append(data)

        def flush(self):
            self.flushed += 1

    out = Out()
    writer(out)({"type": "done", "id": "r", "records": 0})
    assert out.lines == [b'{"id":"r","records":0,"type":"done"}\n'] and out.flushed == 1
    assert json.loads(out.lines[0]) == {"id": "r", "records": 0, "type": "done"}


def test_a_runs_optional_field_reaches_only_a_run_that_names_it():
    seen = []

    def stops(scenario, layers, stop_after_step=None):
        seen.append(stop_after_step)
        yield "steps", [{"step": n} for n in range(5 if stop_after_step is None else stop_after_step + 1)]

    line = encode({"type": "run", "id": "r1", "scenario": {"name": "s"}, "layers": ["steps"], "stop_after_step": 1})
    out = session(stops, line, run_line("r2", ["steps"]))
    assert seen == [1, None]
    assert [m["records"] for m in out if m["type"] == "done"] == [2, 5]
    # an engine whose run names no such field is never given it: it sends everything
    assert [m["type"] for m in session(answer, line)].count("record") == 2
