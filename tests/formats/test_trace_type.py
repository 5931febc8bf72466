"""The Trace type (conformance/formats/trace.py): its JSON is the file format, unchanged (every
committed golden reads back and writes out byte for byte), and joining a unit's parts keeps
every part of each (Trace.joined, as the gate's assemble uses it)."""

import operator
from dataclasses import replace

import pytest

from conformance.formats.trace import Failure, Trace, TraceError, dumps, load_trace, loads_trace
from tests.helpers import REPO


def test_every_committed_golden_reads_and_writes_byte_for_byte():
    paths = sorted((REPO / "goldens").glob("*/vllm-*.json"))
    assert len(paths) > 300
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert dumps(loads_trace(text, path)) == text, path


def _part(**parts) -> Trace:
    return Trace(engine={"label": "k", "name": "port", "version": "1", "protocol": 3},
                 scenario={"name": "s", "sha256": "x"}, provenance={"harness": "0", "environment": {}},
                 **{"layers": {}, **parts})


def test_joined_keeps_every_part():
    """Two units of one engine on one scenario: the config piece, and the steps+outputs piece of
    a production run (its digests), which failed, with a layer not served."""
    config = _part(layers={"config": [{"a": 1}]}, capabilities=("config", "steps"), features=("f",))
    steps = _part(layers={}, digests={"steps": {"count": 0}}, failure=Failure("crash", "gone"),
                  not_served=("outputs",), capabilities=("config", "steps"), features=("f",))
    joined = Trace.joined([config, steps], "port 1")
    assert joined.label == "port 1" and config.label == "k"  # the parts are left as they were
    assert joined.layers == {"config": [{"a": 1}]} and joined.digests == {"steps": {"count": 0}}
    assert joined.failure == Failure("crash", "gone") and joined.not_served == ("outputs",)
    assert joined.capabilities == ("config", "steps") and joined.features == ("f",)
    assert joined.served(["config", "steps", "outputs"]) == ["config", "steps"]
    assert dumps(Trace.joined([config], "k")) == dumps(config)


def test_optional_parts_are_absent_from_the_json_unless_set():
    bare = _part()
    assert set(bare.to_json()) == {"schema", "engine", "scenario", "provenance", "layers"}
    assert bare.failure is None and bare.sent
    failed = replace(bare, failure=Failure("crash", "x"), unsupported_features=("lora",))
    assert failed.to_json()["failure"] == {"kind": "crash", "message": "x"} and not failed.sent
    assert loads_trace(dumps(failed), "t") == failed


def test_a_trace_is_read_by_its_attributes_never_by_its_json_keys():
    """No code reads a part of a trace by its JSON key (issue 44): the type has no such view."""
    trace = _part()
    with pytest.raises(TypeError):
        operator.getitem(trace, "layers")
    with pytest.raises(TypeError):
        dict(trace)
    assert not hasattr(trace, "get") and not hasattr(trace, "keys")
    assert trace.to_json()["layers"] is trace.layers


@pytest.mark.parametrize("edit, words", [
    ({"failure": "crash"}, "failure must be an object"),
    ({"failure": {"message": "x"}}, "failure must be an object"),
    ({"features": "vllm_log_lines"}, "features must be a list"),
    ({"not_served": [1]}, "not_served must be a list"),
])
def test_a_malformed_part_is_a_trace_error(edit, words):
    with pytest.raises(TraceError, match=words):
        Trace.from_json({**_part().to_json(), **edit}, "t.json")


def test_unknown_keys_ride_along_to_be_refused_by_a_golden_check(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(dumps({**_part().to_json(), "note": "hand-edited"}), encoding="utf-8")
    trace = load_trace(path)
    assert trace.extra == {"note": "hand-edited"} and dumps(trace) == path.read_text(encoding="utf-8")
