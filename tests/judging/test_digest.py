"""The digest form of a production-scale layer (conformance/formats/digest.py) and its comparator
(conformance/judging/digest_compare.py): the first differing record found by digest is the one
the full form's comparison finds, and the report still shows it in full."""

import copy
import json
import sys
from dataclasses import replace

import pytest

from conformance.formats import digest
from conformance.formats.digest import DigestSink, check_form, sinks
from conformance.formats.protocol import encode
from conformance.formats.record_schema import check_record
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import dumps
from conformance.judging.compare import CONTEXT_FIELDS, compare_layer
from conformance.judging.digest_compare import compare_digest_layer, truncated
from conformance.judging.goldens import GOLDENS
from conformance.process.client import EngineFailure, EngineProcess
from conformance.process.launch import EngineSpec
from tests.helpers import GATE, REPO

# real records of the oracle, from a library golden (124 steps, 4 outputs)
PINS = load_pins()
GOLDEN = GOLDENS.load("kv_pressure", "0.27.1")
STEPS = GOLDEN.layers["steps"]
OUTPUTS = GOLDEN.layers["outputs"]


def form(layer: str, records: list[dict], expect: dict | None = None) -> dict:
    sink = DigestSink(layer, expect)
    for record in records:
        sink.append(copy.deepcopy(record))
    return sink.to_json()


def changed(records: list[dict], index: int, edit) -> list[dict]:
    out = copy.deepcopy(records)
    edit(out[index])
    return out


def test_the_digest_leaves_out_what_the_comparison_leaves_out():
    assert digest.STEP_CONTEXT == CONTEXT_FIELDS["steps"]
    record = STEPS[5]
    budget_only = dict(record, token_budget=record["token_budget"] - 1)
    assert digest.digest("steps", budget_only) == digest.digest("steps", record)
    # a field no table names is dropped by the record's check before it is digested, whatever
    # its name; informational fields are the schema's, where it declares them: a steps record
    # declares none, so a request whose id has the wording's suffix is digested like any other
    worded = dict(record, note_text="any wording")
    assert digest.digest("steps", check_record("steps", worded)) == digest.digest("steps", record)
    ghost = copy.deepcopy(record)
    ghost["requests"]["ghost_text"] = dict(next(iter(record["requests"].values())), tokens=4096)
    assert digest.digest("steps", ghost) != digest.digest("steps", record)
    decided = dict(record, total_num_scheduled_tokens=record["total_num_scheduled_tokens"] + 1)
    assert digest.digest("steps", decided) != digest.digest("steps", record)


@pytest.mark.parametrize("index", [0, 7, 60, 123])
def test_the_first_differing_digest_is_the_full_forms_first_divergence(index):
    def edit(record):
        record["waiting"] = record["waiting"] + ["r9"]

    theirs = changed(STEPS, index, edit)
    full = compare_layer("steps", STEPS, theirs)
    golden = form("steps", STEPS)
    c = compare_digest_layer("steps", golden, form("steps", theirs, expect=golden))
    assert not c.equal and c.index == full.index == index


def test_the_report_shows_the_differing_record_in_full_from_the_replayed_window():
    golden = form("steps", STEPS)
    theirs = form("steps", changed(STEPS, 60, lambda r: r.update(total_num_scheduled_tokens=1)), expect=golden)
    assert theirs["window"]["at"] == 60 and [r["step"] for r in theirs["window"]["records"]] == [58, 59, 60, 61, 62]
    blind = compare_digest_layer("steps", golden, theirs)
    assert blind.index == 60 and blind.first.path == "<digest>" and "live replay" in blind.explanation
    # the oracle's records there, as a live replay brings them (gate/replay.py)
    replayed = dict(golden, oracle_window={"from": 58, "at": 60, "records": STEPS[58:63], "seconds": 1.0})
    c = compare_digest_layer("steps", replayed, theirs)
    assert c.index == 60 and c.first.path == "total_num_scheduled_tokens"
    assert (c.first.expected, c.first.actual) == (STEPS[60]["total_num_scheduled_tokens"], 1)
    assert c.record == STEPS[60] and c.actual_record["total_num_scheduled_tokens"] == 1
    assert "root[60]" in c.explanation and "replayed live" in c.evidence  # numbered as the full form numbers it


def test_a_replayed_record_that_is_not_the_goldens_is_not_shown():
    golden = form("steps", STEPS)
    theirs = form("steps", changed(STEPS, 60, lambda r: r.update(total_num_scheduled_tokens=1)), expect=golden)
    forged = changed(STEPS, 60, lambda r: r.update(total_num_scheduled_tokens=1))[58:63]
    c = compare_digest_layer("steps", dict(golden, oracle_window={"from": 58, "at": 60, "records": forged}), theirs)
    assert c.index == 60 and c.first.path == "<digest>"


def test_a_budget_only_difference_is_found_by_the_context_runs():
    golden = form("steps", STEPS)
    theirs = form("steps", changed(STEPS, 30, lambda r: r.update(token_budget=r["token_budget"] - 1)), expect=golden)
    assert theirs["records"] == golden["records"] and "context_window" in theirs
    c = compare_digest_layer("steps", golden, theirs)
    assert c.index == 30
    # the digests agree, so the field named is the budget, with both values, never two equal digests
    budget = STEPS[30]["token_budget"]
    assert (c.first.path, c.first.expected, c.first.actual) == ("token_budget", budget, budget - 1), c.first
    assert "differs in a budget it repeats" in c.explanation


def test_a_shorter_run_differs_where_it_ends():
    golden = form("steps", STEPS)
    theirs = form("steps", STEPS[:100], expect=golden)
    c = compare_digest_layer("steps", golden, theirs)
    assert c.index == 100 and c.first.path == "<record count>" and "oracle has 24 more" in c.explanation
    assert truncated(golden, 100)["records"] == theirs["records"]


def test_an_output_difference_names_what_the_form_keeps_in_the_clear():
    golden = form("outputs", OUTPUTS)
    shorter = changed(OUTPUTS, 2, lambda r: r.update(output_token_ids=r["output_token_ids"][:-1]))
    c = compare_digest_layer("outputs", golden, form("outputs", shorter, expect=golden))
    assert c.index == 2 and c.first.path == "output_len"
    assert c.first.expected == len(OUTPUTS[2]["output_token_ids"])


def test_a_record_not_as_its_table_declares_ends_the_layer():
    bad = changed(STEPS, 3, lambda r: r.update(total_num_scheduled_tokens="many"))
    out = form("steps", bad)
    assert out["count"] == 3 and "record #3" in out["problem"] and "total_num_scheduled_tokens" in out["problem"]


def test_two_runs_compare_by_their_digests_windows_aside():
    golden = form("steps", STEPS)
    a, b = DigestSink("steps", golden), DigestSink("steps")
    for record in STEPS:
        a.append(copy.deepcopy(record))
        b.append(copy.deepcopy(record))
    assert a == b
    b.append(copy.deepcopy(STEPS[-1]))
    assert a != b


def test_the_checkpoints_are_whole_records_and_bounded(monkeypatch):
    monkeypatch.setattr(digest, "CHECKPOINT_EVERY", 50)
    out = form("steps", STEPS)
    assert sorted(out["checkpoints"], key=int) == ["0", "50", "100", "123"]
    assert out["checkpoints"]["50"] == STEPS[50] and check_form("steps", out, strict=True) is None
    monkeypatch.setattr(digest, "CHECKPOINT_BYTES", 1)
    assert form("steps", STEPS)["checkpoints"] == {}


def test_the_summary_counts_what_the_records_exercise():
    summary = form("steps", STEPS)["summary"]
    assert summary["steps"] == len(STEPS)
    assert summary["preemptions"] == sum(len(r["preempted"]) for r in STEPS) > 0
    assert summary["max_running"] == max(len(r["running"]) for r in STEPS)


@pytest.mark.parametrize("edit, words", [
    (lambda f: f.update(form="digest/0"), "form: expected 'digest/1'"),
    (lambda f: f.update(count=f["count"] + 1), "count"),
    (lambda f: f["records"].__setitem__(4, "ZZ" * 16), "records[4]: expected 32 lowercase hex"),
    (lambda f: f["context"].append([0, {}]), "context[1]"),
    (lambda f: f["checkpoints"].__setitem__("999", STEPS[0]), "key '999' is not a record in range"),
    (lambda f: f["checkpoints"].__setitem__("0", STEPS[1]), "checkpoints[0]: its digest is not the record's"),
    (lambda f: f.update(window={"from": 0, "at": 9, "records": []}), "window: expected {from, at, records}"),
])
def test_a_bad_form_is_named(edit, words):
    out = form("steps", STEPS)
    edit(out)
    assert words in check_form("steps", out)


def test_only_steps_and_outputs_are_kept_in_the_digest_form():
    assert sorted(sinks(["config", "steps", "outputs"])) == ["outputs", "steps"]


# the harness's reader, end to end with a real (scripted TEST DOUBLE) process
SCRIPTED = REPO / "tests" / "doubles" / "scripted_engine.py"
PRODUCTION = load_scenario(REPO / "scenarios" / "prod_deep_midsize.json")


def scripted_run(tmp_path, scenario, records: list[dict], **limits):
    lines = [encode({"type": "record", "id": "run-1", "layer": "steps", "seq": i, "data": r})
             for i, r in enumerate(records)]
    lines.append(encode({"type": "done", "id": "run-1", "records": len(records)}))
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"lines": [line.rstrip(b"\n").hex() for line in lines], "end": "silent",
                                "status": 0}), encoding="utf-8")
    with EngineProcess(EngineSpec("scripted", (sys.executable, "-S", str(SCRIPTED), str(path))), **limits) as proc:
        return proc.run(scenario, ["steps"])


def test_a_production_run_is_received_in_the_digest_form_within_its_own_limits(tmp_path):
    assert PRODUCTION.scale == "production"
    got = scripted_run(tmp_path, PRODUCTION, STEPS[:40], max_run_records=10, max_run_bytes=10_000)
    sink = got["steps"]
    assert isinstance(sink, DigestSink) and sink.to_json()["records"] == form("steps", STEPS[:40])["records"]
    # its own declared scale: steps up to max_steps, an output per request, the config record
    most_bytes, most_records = EngineProcess(EngineSpec("x", ("x",)), max_run_records=10).limits(PRODUCTION)
    assert most_records == PRODUCTION.workload["max_steps"] + len(PRODUCTION.workload["requests"]) + 1
    assert most_bytes == 1024 ** 3
    # the same records for a library scenario: held whole, and past the limits given
    with pytest.raises(EngineFailure, match="more than 10 records"):
        scripted_run(tmp_path, load_scenario(GATE), STEPS[:40], max_run_records=10)


def test_a_golden_in_the_digest_form_is_written_and_read_back(tmp_path):
    from conformance.judging.goldens import NEW, GoldenStore

    steps = DigestSink("steps")
    for record in STEPS:
        steps.append(copy.deepcopy(record))
    trace = replace(GOLDEN, scenario={"name": "s", "sha256": "x"}, layers={"config": GOLDEN.layers["config"]},
                    digests={"steps": steps.to_json()})
    store = GoldenStore(tmp_path)
    update = store.update(trace, "0.27.1")
    assert update.action == NEW and store.write(update)
    assert store.load("s", "0.27.1").digests["steps"]["records"] == steps.to_json()["records"]
    bad = replace(trace, digests={"steps": dict(steps.to_json(), count=1)})
    store.path("s", "0.27.1").write_text(dumps(bad), encoding="utf-8")
    assert store.lookup("s", "0.27.1").kind == "invalid_golden"


PRODUCTION_NAMES = ("prod_dflash_k16", "prod_dflash_k16_async", "prod_prefix_cache", "prod_kv_storm")


@pytest.mark.parametrize("name", PRODUCTION_NAMES)
def test_a_production_scenario_has_production_shapes(name):
    s = load_scenario(REPO / "scenarios" / f"{name}.json")
    prompts = [r["prompt_len"] for r in s.workload["requests"]]
    arrivals = {r["arrival_step"] for r in s.workload["requests"]}
    assert s.scale == "production" and s.engine_args["max_num_seqs"] >= 128
    assert s.engine_args["max_num_batched_tokens"] >= 8192
    assert len(prompts) >= 500 and len(arrivals) >= 100 and max(arrivals) >= 1000
    assert min(prompts) < 100 and max(prompts) >= 8192 and sorted(prompts)[len(prompts) // 2] < 2000  # long-tailed


def test_the_storm_is_a_storm():
    """prod_kv_storm's golden (the oracle's own summary): many preemptions, many in one step,
    and resumptions reordering the waiting queue."""
    summary = GOLDENS.load("prod_kv_storm", "0.27.1").digests["steps"]["summary"]
    assert summary["preemptions"] >= 300 and summary["steps_with_3plus_preemptions"] >= 20
    assert summary["max_preempted_in_one_step"] >= 8 and summary["requeued_ahead_of_waiting"] > 0


def test_the_prefix_cache_scenario_shares_prefixes_across_requests():
    """prod_prefix_cache: requests start with shared system prompts, so admissions hit blocks
    that other requests cached (not only a preempted request's own)."""
    s = load_scenario(REPO / "scenarios" / "prod_prefix_cache.json")
    prefixes = {p["name"]: p["len"] for p in s.workload["prefixes"]}
    users = [r["prefix"] for r in s.workload["requests"] if "prefix" in r]
    assert s.engine_args["enable_prefix_caching"] is True and s.engine_args.get("speculative_config") is None
    assert len(prefixes) >= 5 and len(users) >= len(s.workload["requests"]) // 3
    assert all(users.count(name) >= 2 for name in prefixes) and max(prefixes.values()) >= 2048


def test_the_gate_config_at_production_scale_runs_async_as_deployed_and_generates_what_sync_does():
    """prod_dflash_k16_async leaves async scheduling to vLLM's default: the oracle resolves it on
    under the GPU rule and drives its AsyncScheduler through the batch-queue loop; the tokens
    generated are the synchronous twin's, request by request (equal output digests)."""
    for release in PINS.releases:
        golden = GOLDENS.load("prod_dflash_k16_async", release)
        config = golden.layers["config"][0]
        assert (config["async_scheduling_gpu"], config["scheduler_class"], config["batch_queue_size"]) == \
            (True, "AsyncScheduler", 2), release
        sync = GOLDENS.load("prod_dflash_k16", release)
        assert golden.digests["outputs"]["records"] == sync.digests["outputs"]["records"], release
        assert golden.digests["steps"]["records"] != sync.digests["steps"]["records"], release
