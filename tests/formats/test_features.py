"""Features a port can declare (conformance/formats/features.py): what each scenario needs, what a
hello declares, the `unsupported` verdict that names the feature, --require-features, the
per-feature table in every report, selfcheck and fuzz within the declared features.

The gate runs here have TEST DOUBLE engines on both sides (tests/doubles/declared_engine.py),
which replay the real oracle's goldens: the candidate declares every feature but speculative
decoding and priorities, as the issue's "done when" asks; they are judged against the committed
goldens, as the real oracle and a port would be."""

from __future__ import annotations

import json
import shlex
import sys
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import REPO, gate_engine, trace_of
from conformance.formats import protocol
from conformance.formats.features import FEATURES, SPEC, decided_by_config, needed, not_declared, parse_required
from conformance.formats.scenario import load_scenario
from conformance.judging.verdict import CANDIDATE, ORACLE, Verdict, exit_status

DOUBLE = REPO / "tests" / "doubles" / "declared_engine.py"
SCENARIOS = sorted((REPO / "scenarios").glob("*.json"))
# what the TEST DOUBLE lacks: speculative decoding and priorities
LACKS = {name for name in FEATURES if name.startswith(SPEC)} | {"parallel_drafting", "priority_policy",
                                                                   "request_priorities"}
BASE = {"enable_prefix_caching": False, "enable_chunked_prefill": True, "async_scheduling": False}


# ---- what a scenario needs, from hand-built scenario parts ----

@pytest.mark.parametrize("args, workload, matrix, config, expected", [
    ({}, None, None, None, ("prefix_caching",)),  # vLLM's default: prefix caching on
    (BASE, None, None, None, ()),
    (dict(BASE, speculative_config={"method": "dflash"}), None, None, None, ("spec:dflash",)),
    (dict(BASE, speculative_config={"method": "draft_model", "parallel_drafting": True}), None, None, None,
     ("spec:draft_model", "parallel_drafting")),
    (BASE, None, {"rows": [{"speculative_config": {"method": "mtp"}},
                           {"speculative_config": {"method": "draft_model", "parallel_drafting": True}}]},
     None, ("spec:draft_model", "spec:mtp", "parallel_drafting")),
    (dict(BASE, scheduling_policy="priority"), None, None, None, ("priority_policy",)),
    (dict(BASE, scheduling_policy="fcfs"), None, None, None, ()),
    (BASE, {"requests": [{"id": "a"}, {"id": "b", "priority": -3}]}, None, None, ("request_priorities",)),
    (BASE, {"requests": [{"id": "a", "priority": 0}]}, None, None, ()),
    (dict(BASE, enable_chunked_prefill=False), None, None, None, ("chunked_prefill_off",)),
    (dict(BASE, long_prefill_token_threshold=0), None, None, None, ()),
    (dict(BASE, long_prefill_token_threshold=5), None, None, None, ("long_prefill_threshold",)),
    (dict(BASE, max_num_scheduled_tokens=10), None, None, None, ("max_num_scheduled_tokens",)),
    (BASE, {"requests": [{"id": "a"}, {"id": "b", "abort_step": 4}]}, None, None, ("aborts",)),
    (BASE, {"prefixes": [{"name": "sys", "len": 64}], "requests": [{"id": "a", "prefix": "sys"}]}, None, None,
     ("shared_prefixes",)),
    (BASE, {"requests": [{"id": "t1"}, {"id": "t2", "continues": "t1"}]}, None, None, ("shared_prefixes",)),
    (BASE, {"requests": [{"id": "a", "min_tokens": 0}, {"id": "b", "min_tokens": 3}]}, None, None, ("min_tokens",)),
    (BASE, {"requests": [{"id": "a", "min_tokens": 0}]}, None, None, ()),
    (BASE, {"requests": [{"id": "a", "eos_token_id": 0}]}, None, None, ("eos",)),
    (BASE, {"requests": [{"id": "a", "stop_token_ids": [3]}]}, None, None, ("stop_token_ids",)),
    (BASE, {"requests": [{"id": "a", "stop_token_ids": []}]}, None, None, ()),
    (BASE, {"requests": [{"id": "a", "repetition_detection": {"max_pattern_size": 2, "min_count": 2}}]}, None, None,
     ("repetition_detection",)),
    (BASE, {"requests": [{"id": "a", "repetition_detection": {"max_pattern_size": 0}}]}, None, None, ()),
    (dict(BASE, async_scheduling=True), None, None, None, ("async_scheduling",)),
    (dict(BASE, enable_lora=True), None, None, None, ("lora",)),
    (dict(BASE, enable_lora=False), None, None, None, ()),
    (BASE, {"requests": [{"id": "a"}, {"id": "b", "lora": {"id": 1, "name": "x"}}]}, None, None, ("lora",)),
    # left to vLLM's default (null): the oracle's config record decides, as each release resolves it
    (dict(BASE, async_scheduling=None), None, None, {"async_scheduling_gpu": True}, ("async_scheduling",)),
    (dict(BASE, async_scheduling=None), None, None, {"async_scheduling_gpu": False}, ()),
    (dict(BASE, async_scheduling=None), None, None, None, ()),
    (dict(BASE, async_scheduling=True), None, None, {"async_scheduling_gpu": False}, ()),
    (dict(BASE, async_scheduling=True), None, None, {"refused": {"type": "ValueError"}}, ("async_scheduling",)),
])
def test_a_scenarios_features_are_derived_from_its_parts(args, workload, matrix, config, expected):
    assert needed(args, workload, matrix, config) == expected


def test_prefix_caching_off_is_asked_only_of_an_engine_that_declares_prefix_caching():
    """A foreign engine that always caches declares `prefix_caching` without `prefix_caching_off`:
    the scenarios with caching off (those not needing `prefix_caching`) are not run on it. One
    without prefix caching never caches: it runs them."""
    caching_off, caching_on = ("chunked_prefill_off",), ("prefix_caching", "chunked_prefill_off")
    always = frozenset({"prefix_caching", "chunked_prefill_off"})
    assert not_declared(caching_off, always) == ("prefix_caching_off",)
    assert not_declared(caching_on, always) == ()
    assert not_declared(caching_off, always | {"prefix_caching_off"}) == ()
    assert not_declared(caching_off, frozenset({"chunked_prefill_off"})) == ()
    assert not_declared((), frozenset()) == () and not_declared(caching_off, None) == ()


def test_feature_names_name_capabilities_never_behaviours():
    """As test262's features.txt does (a flag per capability an implementation may lack, e.g.
    `tail-call-optimization`, `Atomics.waitAsync`), each name says what an engine can do, never
    how it differs: a behaviour that differs from vLLM is a divergence, not a feature."""
    for name, meaning in FEATURES.items():
        assert not any(word in name for word in ("bug", "wrong", "differ", "no_", "not_", "without")), name
        assert meaning and not meaning.lower().startswith(("no ", "does not")), name


def test_only_async_left_to_the_default_is_decided_by_the_oracles_config_record():
    assert decided_by_config(dict(BASE, async_scheduling=None))
    assert not decided_by_config(BASE) and not decided_by_config({})


def test_the_oracles_golden_decides_async_scheduling_left_to_the_default():
    from conformance.judging.goldens import Golden
    from conformance.judging.judging import scenario_features

    class Store:
        def __init__(self, config):
            self.asked, self.config = [], config

        def lookup(self, name, release):
            self.asked.append((name, release))
            return Golden(REPO / "x", trace_of({"layers": {"config": [self.config]}}))

    scenario = SimpleNamespace(name="async_default", engine_args=dict(BASE, async_scheduling=None),
                               workload=None, method_matrix=None)
    on, off = Store({"async_scheduling_gpu": True}), Store({"async_scheduling_gpu": False})
    assert scenario_features(scenario, "0.28.0", on) == ("async_scheduling",)
    assert scenario_features(scenario, "0.27.1", off) == ()
    assert on.asked == [("async_default", "0.28.0")]
    pinned = SimpleNamespace(name="sync", engine_args=BASE, workload=None, method_matrix=None)
    assert scenario_features(pinned, "0.28.0", off) == () and len(off.asked) == 1  # no golden read


@pytest.mark.parametrize("name, expected", [
    ("kv_pressure_no_spec", ()), ("budget_batched_at_max_num_seqs", ()),
    ("no_chunked_prefill", ("prefix_caching", "chunked_prefill_off")),
    ("abort_states", ("prefix_caching", "aborts", "shared_prefixes")),
    ("prefix_multi_turn", ("prefix_caching", "shared_prefixes")),
    ("priority_kv_pressure", ("spec:dflash", "priority_policy")),
    ("prefix_caching_resume", ("prefix_caching", "chunked_prefill_off", "long_prefill_threshold")),
    ("engine_pard", ("spec:draft_model", "parallel_drafting")),
    ("sliding_window_prefix_hits", ("prefix_caching", "shared_prefixes", "sliding_window")),
    ("sliding_window_kv_pressure", ("prefix_caching", "sliding_window")),
    ("kv_connector_failures", ("prefix_caching", "shared_prefixes", "kv_connector")),
    ("grammar_eagle3", ("spec:eagle3", "eos", "structured_outputs")),
    ("grammar_mixed", ("spec:dflash", "eos", "structured_outputs")),
    ("grammar_eagle3_async", ("spec:eagle3", "eos", "structured_outputs", "async_scheduling")),
    ("grammar_dflash_async", ("spec:dflash", "eos", "structured_outputs")),  # async: the oracle's config decides
    ("grammar_kv_pressure_async", ("spec:eagle3", "eos", "structured_outputs", "async_scheduling")),
    ("grammar_full_bitmask", ("spec:eagle3", "eos", "structured_outputs")),
    ("grammar_many_requests", ("eos", "structured_outputs")),
    ("grammar_many_requests_drafts", ("spec:eagle3", "eos", "structured_outputs")),
    ("grammar_ignore_eos", ("eos", "structured_outputs")),
    ("grammar_reasoning", ("eos", "structured_outputs", "reasoning")),
    ("grammar_reasoning_eagle3", ("spec:eagle3", "eos", "structured_outputs", "reasoning")),
    ("grammar_reasoning_dflash", ("spec:dflash", "eos", "structured_outputs", "reasoning")),
    ("grammar_reasoning_constrained", ("spec:eagle3", "eos", "structured_outputs", "reasoning")),
    ("sliding_window_eagle3_hits", ("spec:eagle3", "prefix_caching", "shared_prefixes", "sliding_window")),
    ("stop_eos", ("prefix_caching", "stop_token_ids", "eos")),
    ("stop_min_tokens", ("prefix_caching", "min_tokens", "stop_token_ids", "eos")),
    ("stop_repetition", ("prefix_caching", "min_tokens", "stop_token_ids", "repetition_detection")),
    ("stop_dflash", ("spec:dflash", "prefix_caching", "min_tokens", "stop_token_ids", "eos", "repetition_detection")),
    ("mamba_align_prefix_hits", ("prefix_caching", "shared_prefixes", "mamba")),
    ("mamba_no_prefix_caching", ("mamba",)),
    ("mamba_eagle3_align", ("spec:eagle3", "prefix_caching", "shared_prefixes", "mamba")),
    ("mamba_all_eagle3", ("spec:eagle3", "prefix_caching", "shared_prefixes", "mamba")),
    ("lora_prefix_caching", ("prefix_caching", "shared_prefixes", "lora")),
    ("lora_async_in_flight", ("prefix_caching", "lora", "async_scheduling")),
    ("streaming_session_drafts", ("spec:dflash", "prefix_caching", "streaming_input")),
    ("streaming_session_preemption", ("prefix_caching", "shared_prefixes", "streaming_input")),
    ("streaming_session_batch_queue", ("prefix_caching", "streaming_input", "async_scheduling")),
    ("streaming_session_stops", ("prefix_caching", "stop_token_ids", "streaming_input")),
    ("kv_events_prefix_hits", ("prefix_caching", "shared_prefixes", "lora", "kv_cache_events")),
    ("prefix_cache_reset_connector", ("prefix_caching", "shared_prefixes", "kv_connector", "prefix_cache_resets")),
    ("prefix_cache_reset_async_scheduling",
     ("prefix_caching", "shared_prefixes", "kv_cache_events", "prefix_cache_resets", "async_scheduling")),
    ("encoder_budget_binding", ("prefix_caching", "long_prefill_threshold", "encoder_inputs")),
    ("encoder_preemption", ("priority_policy", "request_priorities", "prefix_caching", "long_prefill_threshold",
                            "encoder_inputs")),
    ("method_matrix", ("spec:dflash", "spec:draft_model", "spec:dspark", "spec:eagle3", "spec:mtp",
                       "spec:ngram", "parallel_drafting")),
])
def test_library_scenarios_know_their_features(name, expected):
    assert load_scenario(REPO / "scenarios" / f"{name}.json").features == expected


def test_every_library_feature_is_in_the_vocabulary():
    assert {f for path in SCENARIOS for f in load_scenario(path).features} <= set(FEATURES)


def test_required_features_are_names_of_the_vocabulary_or_all():
    assert parse_required("priority_policy, spec:dflash") == ["spec:dflash", "priority_policy"]
    assert parse_required("all") == list(FEATURES)
    with pytest.raises(ValueError, match="unknown \\['spec:dflsh'\\].*known: spec:dflash"):
        parse_required("spec:dflsh")


# ---- what a hello declares ----

def hello(**fields) -> bytes:
    message = {"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "engine": "port", "version": "1",
               "capabilities": ["config"], **fields}
    return json.dumps(message).encode() + b"\n"


def test_a_hello_without_features_has_every_feature():
    from conformance.formats.features import declared

    assert declared(protocol.decode(hello())) is None
    assert not_declared(("spec:dflash",), None) == ()
    assert declared(protocol.decode(hello(features=[]))) == frozenset()
    assert not_declared(("spec:dflash", "prefix_caching"), frozenset({"prefix_caching"})) == ("spec:dflash",)


@pytest.mark.parametrize("features, error, words", [
    (["prefix_caching", "spec:dflsh", "priority"], protocol.ProtocolError,
     "got unknown 'priority', 'spec:dflsh'; known: spec:dflash"),
    (None, protocol.ProtocolError, "expected hello.features of type list (optional: absent, or of that type)"),
    ("prefix_caching", protocol.ProtocolError, "hello.features of type list"),
    ([7], protocol.ProtocolError, "hello.features to hold strings, got 7"),
    (["prefix_caching"] * 257, protocol.LimitExceeded, "at most 256 names, got 257"),
    (["x" * 65], protocol.LimitExceeded, "at most 64 characters in hello.features, got one of 65"),
])
def test_a_hello_declaring_what_is_not_a_feature_is_a_protocol_error_naming_it(features, error, words):
    with pytest.raises(error) as caught:
        protocol.decode(hello(features=features))
    assert words in str(caught.value)


# ---- verdicts and exit status ----

def test_scenarios_declined_for_features_not_required_do_not_fail_the_gate():
    passed = Verdict("port", "core_one", "pass", CANDIDATE)
    declined = Verdict("port", "spec_one", "unsupported", CANDIDATE, missing_features=("spec:dflash",))
    required = Verdict("port", "spec_one", "unsupported", CANDIDATE, missing_features=("spec:dflash",),
                       required_features=("spec:dflash",))
    oracle = Verdict("vllm", "spec_one", "pass", ORACLE)
    assert declined.declined and not required.declined
    assert exit_status([passed, declined, oracle]) == 0
    assert exit_status([passed, required, oracle]) == 2
    assert exit_status([declined, oracle]) == 2  # a candidate that ran nothing cannot pass
    assert exit_status([passed, declined, Verdict("port", "x", "diverged", CANDIDATE)]) == 1
    # a layer the engine does not serve stays a failure, as before
    assert exit_status([passed, Verdict("port", "x", "unsupported", CANDIDATE)]) == 2


def test_a_golden_is_never_a_run_that_was_not_sent():
    from conformance.formats.trace import TraceError, make_trace
    from conformance.judging.goldens import checked_golden

    scenario = load_scenario(REPO / "scenarios" / "steady_decode.json")
    trace = make_trace("x", {"engine": "vllm"}, scenario, {}, unsupported_features=["spec:dflash"])
    with pytest.raises(TraceError, match="a golden must come from a run the engine was sent.*spec:dflash"):
        checked_golden(trace, "the oracle's trace")


# ---- the gate, the TEST DOUBLE of "done when" ----

def double(*options: str) -> str:
    return shlex.join([sys.executable, str(DOUBLE), *options])


@pytest.fixture
def features_gate(monkeypatch, capsys):
    """`parity gate` in this process: the oracle a TEST DOUBLE replaying the oracle's goldens (its
    hello says nothing of features), the candidate the declared TEST DOUBLE (`options`)."""
    from conformance import cli
    from conformance.gate import plan as gate_plan

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(*argv: str, options: tuple[str, ...] = (), command: str = "gate"):
        oracle, candidate = double("--no-features", "--engine", "oracle-double"), double(*options)
        engines = [gate_engine("TEST-DOUBLE-oracle=" + oracle, ORACLE),
                   gate_engine("TEST-DOUBLE-port=" + candidate, CANDIDATE)]
        monkeypatch.setattr(gate_plan, "gate_engines", lambda pins, candidates, log, stand_ins=None: engines)
        capsys.readouterr()
        status = cli.main([command, "--waivers", "/dev/null", *argv] if command == "gate" else [command, *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_a_port_without_speculation_or_priority_gets_unsupported_naming_the_feature_and_exits_0(
        features_gate, tmp_path):
    """The issue's "done when": on the whole library, a TEST DOUBLE that declares every feature but
    speculation and priorities passes the scenarios it runs, gets `unsupported` naming exactly the
    features it lacks on the rest (never sent them: the double fails any such run), and exits 0."""
    reports, results = tmp_path / "reports", tmp_path / "results"
    status, out, err = features_gate("--jobs", "2", "--reports", str(reports), "--results", str(results),
                                     "--require-features", "none")
    assert status == 0, out + err
    assert "features required: none (--require-features none" in out.splitlines()[0]
    verdicts = json.loads((results / "verdicts.json").read_text(encoding="utf-8"))
    mine = {}
    for v in verdicts:
        if v["engine"] == "TEST-DOUBLE-port":
            mine.setdefault(v["scenario"], set()).add((v["kind"], v["first"]))
    manifest = json.loads((results / "manifest.json").read_text(encoding="utf-8"))
    needs = {s["name"]: s["features"] for s in manifest["scenarios"]}
    assert set(needs) == {s.name for s in (load_scenario(p) for p in SCENARIOS) if s.scale == "library"}  # the default scale
    declined = 0
    for name, kinds in mine.items():
        lacking = [f for f in needs[name] if f in LACKS]
        if not lacking:
            assert kinds == {("pass", "")}, (name, kinds)
            continue
        declined += 1
        [(kind, first)] = kinds
        assert kind == "unsupported", (name, kinds)
        assert first.startswith(f"not run: it needs the feature{'s' if len(lacking) > 1 else ''} "
                                f"{', '.join(lacking)}, which the engine does not declare"), (name, first)
    assert 0 < declined < len(mine)
    # the orthogonal library (tests/formats/test_library.py): at least 12 stand-in scenarios it passes
    stand_in = {s.name for s in map(load_scenario, SCENARIOS)
                if s.workload is not None and s.engine is None and s.scale == "library"}
    assert len([name for name in stand_in if mine[name] == {("pass", "")}]) >= 12
    # the grid names the feature; the terminal's per-feature table counts it
    # (the grid folds scenarios with the same verdicts into a row named by the first of them)
    priority_names = {name for name, features in needs.items() if "priority_policy" in features}
    assert any(line.split()[0] in priority_names and "unsupported priority_policy" in line
               for line in out.splitlines() if line.split()), out
    table = out[out.index("-- by feature"):out.index("-- by engine-matrix row")].splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in table if line.startswith("   ") and line.split()}
    core = sum(1 for features in needs.values() if not features)
    priority = sum(1 for features in needs.values() if "priority_policy" in features)
    dflash = sum(1 for features in needs.values() if "spec:dflash" in features)
    assert priority >= 2 and dflash >= 20
    assert rows["core"] == [f"{core}/{core}"] * 2
    assert rows["priority_policy"] == [str(priority), "not", "declared", f"{priority}/{priority}"]
    off = [name for name, features in needs.items() if "chunked_prefill_off" in features]
    ran = sum(1 for name in off if mine[name] == {("pass", "")})
    assert 0 < ran < len(off)  # some need a feature the port lacks besides
    assert rows["chunked_prefill_off"] == [f"{ran}/{ran},", str(len(off) - ran), "not", "run",
                                           f"{len(off)}/{len(off)}"]
    assert "-- details of" not in out  # nothing failed; scenarios not run are not failures
    # junit: each such scenario a skipped case naming the feature; the table as properties
    root = ET.parse(reports / "junit.xml").getroot()
    cases = [c for c in root.iter("testcase") if "/ priority_victim_same_arrival / TEST-DOUBLE-port /" in c.get("name")]
    assert cases and all(c.find("skipped") is not None and "priority_policy" in c.find("skipped").get("message")
                         for c in cases)
    assert not [c for c in root.iter("testcase") if c.find("error") is not None or c.find("failure") is not None]
    properties = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert properties["feature spec:dflash"] == (f"TEST-DOUBLE-port: {dflash} not declared; "
                                                 f"TEST-DOUBLE-oracle: {dflash}/{dflash}")
    summary = (reports / "summary.md").read_text(encoding="utf-8")
    assert f"| `priority_policy` | {priority} not declared | {priority}/{priority} |" in summary
    page = (reports / "report.html").read_text(encoding="utf-8")
    assert f"<td>{dflash} not declared</td><td>{dflash}/{dflash}</td>" in page


def test_a_required_feature_the_port_does_not_declare_fails_the_gate_and_the_merge(features_gate, tmp_path):
    names = ["budget_batched_at_max_num_seqs", "kv_pressure_no_spec", "priority_victim_same_arrival",
             "dflash_27b_gate"]
    scenarios = [arg for name in names for arg in ("--scenario", str(REPO / "scenarios" / f"{name}.json"))]
    status, out, err = features_gate(*scenarios, "--require-features", "priority_policy", "--jobs", "1")
    assert status == 2, out + err
    assert "priority_policy (required) 1 not declared" in " ".join(out.split())
    assert ("the gate requires priority_policy (--require-features, REQUIRE_FEATURES=): a port cannot pass "
            "by declaring less") in out
    assert "on dflash_27b_gate" not in out  # declined, not required (explicitly): no details
    # the same through shards and a merge: the manifest carries the required features
    folders = []
    for index in (1, 2):
        folder = tmp_path / f"shard-{index}"
        status, out, err = features_gate(*scenarios, "--require-features", "priority_policy", "--jobs", "1",
                                         "--shard", f"{index}/2", "--results", str(folder))
        assert status == 0, out + err
        folders.append(str(folder))
    status, out, err = features_gate(*folders, "--waivers", "/dev/null", command="merge")
    assert status == 2, out + err
    assert "the gate requires priority_policy" in out
    status, out, err = features_gate(*scenarios, "--jobs", "1", "--require-features", "none")
    assert status == 0, out + err
    # by default the gate configuration's features are required: dflash_27b_gate needs spec:dflash
    status, out, err = features_gate(*scenarios, "--jobs", "1")
    assert status == 2, out + err
    assert "the gate requires spec:dflash" in out


def test_a_port_that_declares_no_feature_runs_core_scenarios_only_and_cannot_pass_on_nothing(features_gate):
    gate = str(REPO / "scenarios" / "dflash_27b_gate.json")
    core = str(REPO / "scenarios" / "budget_batched_at_max_num_seqs.json")
    status, out, err = features_gate("--scenario", gate, "--scenario", core, "--require-features", "none",
                                     options=("--features", ""))
    assert status == 0, out + err
    assert "TEST-DOUBLE-port judged on 1 of 2 scenarios: 1 need features it does not declare" in out.splitlines()[0]
    status, out, err = features_gate("--scenario", gate, "--require-features", "none", options=("--features", ""))
    assert status == 2, out + err
    assert "a candidate ran no scenario" in err


def test_a_port_declaring_nothing_fails_the_default_gate_saying_what_it_was_not_judged_on(features_gate, tmp_path):
    """Issue 40's wrong PASS: on the whole library, a candidate declaring no feature is judged on the
    scenarios that need none. By default its PASS requires the gate configuration's features
    (dflash_27b_gate*: spec:dflash, async_scheduling), so it fails, and the first line of every
    report says on how many scenarios it was judged and why not the rest; with --require-features
    none it passes, its first line saying so. Never "every layer of every scenario judged"."""
    reports = tmp_path / "reports"
    status, out, err = features_gate("--jobs", "2", "--reports", str(reports), options=("--features", ""))
    assert status == 2, out + err
    first = out.splitlines()[0]
    from conformance.formats.pins import load_pins
    from conformance.judging.judging import scenario_features

    library = [s for s in map(load_scenario, SCENARIOS) if s.scale == "library"]
    needs = {s.name: scenario_features(s, load_pins().oracle) for s in library}  # as the gate resolves them
    core = sum(1 for features in needs.values() if not features)
    gate_features = ("spec:dflash", "async_scheduling")
    required = sum(1 for features in needs.values() if set(features) & set(gate_features))
    assert first.startswith("== vllm-parity gate: ERROR (exit status 2)"), first
    judged = (f"TEST-DOUBLE-port judged on {core} of {len(needs)} scenarios: {len(needs) - core} need features "
              f"it does not declare ({required} of them the required spec:dflash, async_scheduling)")
    assert judged in first, first
    assert f"TEST-DOUBLE-oracle on all {len(needs)}" in first
    assert ("features required: spec:dflash, async_scheduling (by default, those of the gate configuration's "
            "scenarios dflash_27b_gate*; --require-features none opts out)") in first
    assert "every layer of every scenario" not in out
    # the same in every report
    summary = (reports / "summary.md").read_text(encoding="utf-8")
    assert judged.replace("_", "\\_") in summary.splitlines()[2] or judged in summary.splitlines()[2], summary[:800]
    root = ET.parse(reports / "junit.xml").getroot()
    assert judged in {p.get("name"): p.get("value") for p in root.iter("property")}["judged"]
    page = (reports / "report.html").read_text(encoding="utf-8")
    assert judged in page and "Every verdict passed" not in page
    # opted out: it passes, judged on the core scenarios alone, and the first line says so
    status, out, err = features_gate("--jobs", "2", "--reports", str(reports), "--require-features", "none",
                                     options=("--features", ""))
    assert status == 0, out + err
    first = out.splitlines()[0]
    assert first.startswith("== vllm-parity gate: PASS (exit status 0)"), first
    assert (f"TEST-DOUBLE-port judged on {core} of {len(needs)} scenarios: {len(needs) - core} need features it "
            "does not declare (without vLLM's log lines: its hello does not declare vllm_log_lines);") in first
    assert "features required: none (--require-features none" in first
    assert "every layer of every scenario" not in out
    page = (reports / "report.html").read_text(encoding="utf-8")
    assert f"judged on {core} of {len(needs)} scenarios" in page and "Every verdict passed" not in page


def test_a_port_declaring_an_unknown_feature_is_a_protocol_failure_naming_it(features_gate):
    status, out, err = features_gate("--scenario", str(REPO / "scenarios" / "kv_pressure_no_spec.json"),
                                     options=("--features", "prefix_caching,spec:dflsh"))
    assert status == 2, out + err
    assert "protocol" in out and "got unknown 'spec:dflsh'" in out


def test_the_per_feature_table_escapes_the_engines_words_in_every_sink():
    from conformance.judging.requirement_rows import apply_gate
    from conformance.report.render_ci import junit, markdown
    from conformance.report.render_html import html_report
    from conformance.report.render_text import render_gate
    from conformance.report.view import gate_view

    label = "port <script>x</script> | `y` \x1b[2J\u202e"
    verdicts = [Verdict(label, "steady_decode", "unsupported", CANDIDATE, missing_features=("spec:dflash",),
                        message="not run"),
                Verdict(label, "kv_pressure_no_spec", "pass", CANDIDATE)]
    view = gate_view(apply_gate(verdicts, {}, []), "0.27.1",
                     features={"steady_decode": ("spec:dflash",), "kv_pressure_no_spec": ()})
    assert [(r.label, r.cells[label].text) for r in view.features] == [("core", "1/1"),
                                                                       ("spec:dflash", "1 not declared")]
    text = render_gate(view)
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2J\\u202e" in text
    tree = ET.fromstring(junit(view).split("\n", 1)[1])
    assert any(p.get("name") == "feature spec:dflash" and "\\x1b" in p.get("value") for p in tree.iter("property"))
    md = markdown(view)
    header = next(line for line in md.splitlines() if line.startswith("| feature |"))
    # a code span (fenced past its own backtick), its `|` escaped for the table, its controls visible
    assert header == "| feature | ``port <script>x</script> \\| `y` \\x1b[2J\\u202e`` |", header
    assert "\x1b" not in md
    page = html_report(view)
    assert "<script>x" not in page and "&lt;script&gt;x&lt;/script&gt;" in page


# ---- selfcheck and fuzz, within the declared features ----

def test_selfcheck_leaves_out_the_scenarios_needing_features_the_engine_does_not_declare(capsys):
    from conformance import cli

    status = cli.main(["selfcheck", "--engine", double("--serve", "config,steps,outputs")])
    out, err = capsys.readouterr()
    assert status == 0, out + err
    assert "[selfcheck] steady_decode: left out, it needs spec:dflash, which the hello does not declare" in err
    assert "protocol self-check: passed" in out


def test_selfcheck_leaves_out_a_scenario_whose_oracle_resolved_async_on_for_an_engine_without_it(capsys):
    """kv_pressure_no_spec_async leaves async scheduling to vLLM's default: the scenario alone
    needs nothing, but the oracle's config record resolves it on (on GPU), so the gate judges it
    as needing async_scheduling; selfcheck must decide it the same way, not send it."""
    from conformance import cli

    without_async = ",".join(name for name in FEATURES if not name.startswith(SPEC)
                             and name not in LACKS and name != "async_scheduling")
    scenarios = [str(REPO / "scenarios" / f"{name}.json") for name in ("kv_pressure_no_spec_async", "core_admission")]
    status = cli.main(["selfcheck", "--engine", double("--features", without_async, "--serve", "config,steps,outputs"),
                       *[arg for path in scenarios for arg in ("--scenario", path)]])
    out, err = capsys.readouterr()
    assert status == 0, out + err
    assert ("[selfcheck] kv_pressure_no_spec_async: left out, it needs async_scheduling, which the hello "
            "does not declare") in err
    assert "protocol self-check: passed" in out


def test_selfcheck_names_an_unknown_feature_at_the_handshake(capsys):
    from conformance import cli

    status = cli.main(["selfcheck", "--engine", double("--features", "prefix_caching,prefx_caching")])
    out, err = capsys.readouterr()
    assert status == 1, out + err
    assert "FAIL handshake:" in out and "got unknown 'prefx_caching'" in out


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_generates_only_scenarios_within_the_declared_features(data):
    from conformance.fuzz.strategies import for_layers

    allowed = frozenset(FEATURES) - LACKS - {"prefix_caching"}
    for layers in (["config", "steps", "outputs"], ["engine_steps"]):
        raw = data.draw(for_layers(layers, allowed))
        assert set(needed(raw["engine_args"], raw["workload"])) <= allowed, raw


def test_a_fuzz_search_asks_only_for_scenarios_within_the_candidates_features():
    from conformance.fuzz.search import Search
    from conformance.fuzz.strategies import within

    class RecordingPair:
        """TEST DOUBLE of fuzz.search.Pair: no engine; every example passes; what it was asked is kept."""
        layers = ["config", "steps"]

        def __init__(self):
            self.seen = []

        def judge(self, scenario, timeout=None):
            self.seen.append(scenario.features)
            return Verdict("double", scenario.name, "pass", CANDIDATE), trace_of({})

    allowed = frozenset({"chunked_prefill_off", "spec:ngram"})
    pair = RecordingPair()
    Search(pair, 3, lambda message: None, examples=60, features=allowed).run()
    assert len(pair.seen) == 60 and all(set(f) <= allowed for f in pair.seen), pair.seen
    assert {"spec:ngram"} in [set(f) for f in pair.seen]  # the declared method is still generated
    assert within({"engine_args": {"enable_prefix_caching": True}}, allowed) is False
