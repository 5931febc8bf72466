"""KV cache events and prefix-cache resets in the formats: the scenario's kv_events_config, the
workload's prefix_cache_resets and a request's kv_cache_report_mode, the features they need,
and the step records' kv_events and prefix_cache_reset (engines/PROTOCOL.md)."""

import json
import shutil

import pytest

from conformance.formats.features import needed
from conformance.formats.record_schema import RecordError, check_record
from conformance.formats.scenario import ScenarioError, load_scenario
from conformance.formats.workload import validate_workload
from tests.helpers import GATE

EVENTS = {"enable_kv_cache_events": True, "publisher": "null"}
ARGS = {"max_model_len": 200, "async_scheduling": False, "kv_events_config": EVENTS}


def workload(*requests, **top):
    return {"seed": 1, "vocab_size": 100, "max_steps": 50, "requests": list(requests), **top}


def req(rid, arrival=0, **extra):
    return {"id": rid, "arrival_step": arrival, "prompt_len": 10, "max_tokens": 4, **extra}


@pytest.mark.parametrize("raw, args, field, words", [
    (workload(req("a"), prefix_cache_resets={"step": 1}), ARGS, "workload.prefix_cache_resets", "must be an array"),
    (workload(req("a"), prefix_cache_resets=[{}]), ARGS, "workload.prefix_cache_resets[0].step", "is required"),
    (workload(req("a"), prefix_cache_resets=[{"step": 50}]), ARGS, "workload.prefix_cache_resets[0].step",
     "between 0 and 49"),
    (workload(req("a"), prefix_cache_resets=[{"step": 3}, {"step": 3}]), ARGS,
     "workload.prefix_cache_resets[1].step", "one reset a step, in step order"),
    (workload(req("a"), prefix_cache_resets=[{"step": 1, "reset_running_requests": 1}]), ARGS,
     "workload.prefix_cache_resets[0].reset_running_requests", "must be true or false"),
    (workload(req("a"), prefix_cache_resets=[{"step": 1, "now": True}]), ARGS,
     "workload.prefix_cache_resets[0].now", "unknown key"),
    # vLLM's batch-queue loop schedules nothing while idle: a request must follow the reset
    (workload(req("a", 2), prefix_cache_resets=[{"step": 3}]), dict(ARGS, async_scheduling=True),
     "workload.prefix_cache_resets[0].step", "at most the last arrival step (2)"),
    (workload(req("a", 2), prefix_cache_resets=[{"step": 3}]), dict(ARGS, async_scheduling=None),
     "workload.prefix_cache_resets[0].step", "at most the last arrival step (2)"),
    (workload(req("a", kv_cache_report_mode="all")), ARGS, "workload.requests[0].kv_cache_report_mode",
     "must be one of ['incremental', 'full']"),
    (workload(req("a", kv_cache_report_mode="full")), {"max_model_len": 200},
     "workload.requests[0].kv_cache_report_mode", "needs engine_args.kv_events_config"),
])
def test_bad_resets_and_report_modes_name_the_field(raw, args, field, words):
    with pytest.raises(ScenarioError) as err:
        validate_workload(raw, "s.json", args)
    assert err.value.field == field, err.value
    assert words in err.value.problem, err.value


def test_resets_and_report_modes_are_kept_as_sent():
    """Options only when true, a report mode only when "full" (vLLM's default left out)."""
    w = validate_workload(workload(req("a", kv_cache_report_mode="full"), req("b", kv_cache_report_mode="incremental"),
                                   prefix_cache_resets=[{"step": 0, "reset_running_requests": False},
                                                        {"step": 4, "reset_running_requests": True,
                                                         "reset_connector": True}]), "s", ARGS)
    assert w["prefix_cache_resets"] == [{"step": 0}, {"step": 4, "reset_running_requests": True,
                                                      "reset_connector": True}]
    assert w["requests"][0]["kv_cache_report_mode"] == "full" and "kv_cache_report_mode" not in w["requests"][1]
    # under async scheduling a reset at the last arrival's step is recorded by that schedule()
    validate_workload(workload(req("a", 3), prefix_cache_resets=[{"step": 3}]), "s", dict(ARGS, async_scheduling=True))


@pytest.mark.parametrize("args, work, expected", [
    (ARGS, workload(req("a")), ("kv_cache_events",)),
    (dict(ARGS, kv_events_config={"enable_kv_cache_events": False, "publisher": "null"}), workload(req("a")), ()),
    ({}, workload(req("a"), prefix_cache_resets=[{"step": 1}]), ("prefix_cache_resets",)),
    ({}, workload(req("a"), prefix_cache_resets=[]), ()),
])
def test_the_features_follow_the_config_and_the_workload(args, work, expected):
    assert needed(dict(args, enable_prefix_caching=False), work) == expected


def _scenario(tmp_path, name="kv_events_prefix_hits", args=None, engine=None, top=None):
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    raw = json.loads((GATE.parent / f"{name}.json").read_text(encoding="utf-8"))
    raw["engine_args"].update(args or {})
    raw.update(top or {})
    if engine is not None:
        raw["engine"] = engine
    (tmp_path / "s.json").write_text(json.dumps(raw), encoding="utf-8")
    return tmp_path / "s.json"


@pytest.mark.parametrize("args, engine, field, words", [
    ({"kv_events_config": {"enable_kv_cache_events": True, "publisher": "zmq"}}, None,
     "engine_args.kv_events_config.publisher", "must be 'null'"),
    ({"kv_events_config": {"enable_kv_cache_events": True}}, None,
     "engine_args.kv_events_config.publisher", "is required"),
    ({"kv_events_config": {"enable_kv_cache_events": "yes", "publisher": "null"}}, None,
     "engine_args.kv_events_config.enable_kv_cache_events", "must be bool"),
    ({"kv_events_config": {"enable_kv_cache_events": True, "publisher": "null", "endpoint": "tcp://*:5557"}},
     None, "engine_args.kv_events_config.endpoint", "unknown key"),
    ({"kv_events_config": "on"}, None, "engine_args.kv_events_config", "must be dict"),
])
def test_a_kv_events_scenario_is_checked_field_by_field(tmp_path, args, engine, field, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_scenario(tmp_path, args=args, engine=engine))
    assert f"{field}:" in str(err.value) and words in str(err.value), str(err.value)


def test_the_engine_layers_refuse_events_and_resets(tmp_path):
    raw = json.loads((GATE.parent / "engine_ngram.json").read_text(encoding="utf-8"))
    shutil.copytree(GATE.parent / "models", tmp_path / "models")
    for change, field in ((lambda r: r["engine_args"].update(kv_events_config=EVENTS), "engine_args.kv_events_config"),
                          (lambda r: r["workload"].update(prefix_cache_resets=[{"step": 1}]),
                           "workload.prefix_cache_resets")):
        data = json.loads(json.dumps(raw))
        change(data)
        (tmp_path / "s.json").write_text(json.dumps(data), encoding="utf-8")
        with pytest.raises(ScenarioError) as err:
            load_scenario(tmp_path / "s.json")
        assert err.value.field == field and "is not run by the engine layers" in err.value.problem


STORED = {"type": "BlockStored", "block_hashes": [0, 1], "parent_block_hash": None, "token_ids": [5] * 32,
          "block_size": 16, "lora_id": 1, "lora_name": "alpha", "medium": "GPU", "group_idx": 0,
          "extra_keys": [["alpha"], ["alpha"]], "kv_cache_spec_kind": "full_attention",
          "kv_cache_spec_sliding_window": None}


def _step(**fields):
    base = {"step": 0, "total_num_scheduled_tokens": 0, "token_budget": 8, "requests": {}, "new": [], "resumed": [],
            "preempted": [], "finished": [], "waiting": [], "running": [], "aborted": [], "emitted": [],
            "num_common_prefix_blocks": [], "kv_blocks": {"free": 1, "used": 0, "cached": 0}}
    return dict(base, **fields)


def test_the_events_are_checked_by_their_type():
    events = [STORED, {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 0},
              {"type": "AllBlocksCleared"}]
    record = check_record("steps", _step(kv_events=events, prefix_cache_reset=None), strict=True)
    assert record["kv_events"] == events and record["prefix_cache_reset"] is None
    assert check_record("steps", _step(prefix_cache_reset=False))["prefix_cache_reset"] is False


@pytest.mark.parametrize("event, path, words", [
    ({"type": "BlockEvicted"}, "kv_events[0]", "whose type is one of BlockStored, BlockRemoved, AllBlocksCleared"),
    (dict(STORED, block_hashes=["ab12"]), "kv_events[0].block_hashes[0]", "int >= 0"),
    (dict(STORED, parent_block_hash=-1), "kv_events[0].parent_block_hash", "int >= 0 or null"),
    (dict(STORED, extra_keys=[[["a", [["b"]]]]]), "kv_events[0].extra_keys[0][0][1][0]", "an extra key"),
    (dict(STORED, extra_keys=[[1.5]]), "kv_events[0].extra_keys[0][0]", "an extra key"),
    ({k: v for k, v in STORED.items() if k != "token_ids"}, "kv_events[0].token_ids", "list of int >= 0"),
    ({"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}, "kv_events[0].group_idx", "int >= 0 or null"),
])
def test_a_bad_event_names_its_field(event, path, words):
    with pytest.raises(RecordError) as err:
        check_record("steps", _step(kv_events=[event]))
    assert err.value.path == path and words in str(err.value), str(err.value)


def test_a_reset_result_is_a_bool_or_null():
    with pytest.raises(RecordError) as err:
        check_record("steps", _step(prefix_cache_reset="yes"))
    assert err.value.path == "prefix_cache_reset"
