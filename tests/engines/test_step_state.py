"""The state each step record carries after its update (engines/PROTOCOL.md, `steps`): in the
goldens of every pin, in the reports, and in where a first divergence falls."""

import datetime as dt
import json

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import make_trace
from conformance.judging.compare import compare_layer
from conformance.judging.goldens import GOLDENS
from conformance.judging.requirement_rows import apply_gate
from conformance.judging import verdict as verdicts
from conformance.judging.verdict import Verdict
from conformance.process.client import EngineProcess
from conformance.process.envs import device_args
from conformance.process.launch import EngineSpec
from conformance.report.render_html import html_report
from conformance.report.render_text import render
from conformance.report.view import gate_view
from tests.helpers import REPO, trace_of


def judge(trace, golden, role):
    """verdict.judge of traces a test made as their JSON."""
    return verdicts.judge(trace_of(trace), trace_of(golden), role)

PINS = load_pins()
SCENARIOS = [load_scenario(p) for p in sorted(REPO.glob("scenarios/*.json"))]
STAND_IN = [s for s in SCENARIOS if s.workload is not None and s.engine is None and "steps" in s.layers
            and s.scale == "library"]  # a production golden holds digests (tests/gate/test_production_gate.py)
REQUEST_STATE = ("accepted_draft_tokens", "computed_tokens", "output_tokens", "kv_blocks")
STEP_STATE = ("kv_blocks", "waiting", "running")


def _golden_steps(scenario, release):
    path = GOLDENS.path(scenario.name, release)
    if not path.exists():
        return None
    steps = json.loads(path.read_text())["layers"].get("steps") or []
    return None if not steps or "refused" in steps[0] else steps


@pytest.mark.parametrize("release", PINS.releases)
@pytest.mark.parametrize("scenario", STAND_IN, ids=[s.name for s in STAND_IN])
def test_golden_state_is_consistent(scenario, release):
    """What every pin recorded obeys the arithmetic a port can check its own state against."""
    steps = _golden_steps(scenario, release)
    if steps is None:
        pytest.skip(f"{scenario.name}: no steps golden for {release}")
    outputs, finished = {}, set()
    tables: dict[str, list[int]] = {}  # each request's block table, from the block ids it was given
    # where a request holds blocks no record names, the tables cannot be checked against the
    # pool: a sliding-window group frees the blocks out of its window as a request goes on, and
    # an async KV load holds its blocks while the request waits unscheduled; a mamba group in
    # mode align frees the state blocks behind the last one as a request goes on
    untracked = bool({"sliding_window", "kv_connector", "mamba"} & set(scenario.features))
    for n, s in enumerate(steps):
        for rid in s["aborted"]:
            tables.pop(rid, None)
        for rid, r in s["requests"].items():
            given = (r["block_ids"] or [[]])[0]
            tables[rid] = list(given) if rid in s["new"] or rid in s["resumed"] else tables.get(rid, []) + given
        for rid in (set(s["preempted"]) - set(s["resumed"])) | set(s["finished"]):  # a reset's: below
            tables.pop(rid, None)
        for rid, r in s["requests"].items():
            assert set(REQUEST_STATE) <= set(r), (s["step"], rid)
            assert r["accepted_draft_tokens"] <= r["draft_tokens"]
            if rid in s["finished"]:
                assert r["kv_blocks"] == 0, (s["step"], rid)  # a finished request holds no blocks
            # one sampled token plus the accepted drafts, or none for a prefill chunk
            # a streaming session's chunk that ends folds its outputs into the prompt (0 outputs
            # while it waits for input), and the next chunk makes it new again
            # (engines/PROTOCOL.md, "Streaming input sessions")
            folded = "streaming_input" in scenario.features and (rid in s["new"] or r["output_tokens"] == 0)
            grew = r["output_tokens"] - (0 if folded else outputs.get(rid, 0))
            # a finished request, or a session's chunk that ended (it waits for input), is cut at
            # its max_tokens or stop, inside the accepted drafts
            ended = rid in s["finished"] or ("streaming_input" in scenario.features and rid in s["waiting"])
            assert grew in (0, 1 + r["accepted_draft_tokens"]) or ended, (s["step"], rid, grew)
            outputs[rid] = r["output_tokens"]
            if rid in tables and "iteration" not in s and not untracked:  # the blocks it was given are those it holds
                assert len(tables[rid]) == r["kv_blocks"], (s["step"], rid)  # (async: read a schedule later)
        finished |= set(s["finished"])
        assert not set(s["waiting"]) & set(s["running"]), s["step"]
        assert not (set(s["waiting"]) | set(s["running"])) & finished, s["step"]
        # under async scheduling the state is read after the next schedule(), which may resume it
        # and hand out blocks the next record names: the pool's counts are checked in step only
        asynchronous = "iteration" in s
        resumed_next = steps[n + 1]["resumed"] if asynchronous and n + 1 < len(steps) else []
        # a reset of the prefix cache with reset_running_requests preempts every running request
        # before the schedule(), which resumes them: preempted and resumed in one step
        # under async scheduling a schedule() may preempt a request the update of the step before
        # then finishes (vLLM's stopped_preempted_reqs): preempted after it finished
        gone = finished if asynchronous else set()
        assert set(s["preempted"]) <= set(s["waiting"]) | set(resumed_next) | set(s["resumed"]) | gone, s["step"]
        held = [b for table in tables.values() for b in table]
        if not {"sliding_window", "mamba"} & set(scenario.features):  # the null block is never handed out;
            assert 0 not in held, s["step"]  # a sliding-window or mamba group's table holds it in place of a freed block
        if not asynchronous and not untracked:
            # requests that share a prefix share its blocks: the pool's `used` counts each block once
            assert len(set(held)) == s["kv_blocks"]["used"], s["step"]
        assert s["kv_blocks"]["cached"] <= s["kv_blocks"]["free"] + s["kv_blocks"]["used"], s["step"]
    assert not steps[-1]["waiting"] and not steps[-1]["running"]
    assert steps[-1]["kv_blocks"]["used"] == 0  # every block back in the pool at the end


ENGINE = [s for s in SCENARIOS if s.engine is not None]


@pytest.mark.parametrize("scenario", ENGINE, ids=[s.name for s in ENGINE])
def test_engine_goldens_record_the_state(scenario):
    """engine_steps carry the same state; free blocks only where the scenario fixes the KV
    cache's size, since elsewhere the machine's memory sizes it."""
    fixed = scenario.engine_args.get("num_gpu_blocks_override") is not None
    checked = []
    for release in PINS.releases:  # the pins whose whole engine runs here (0.33.0's needs a GPU)
        path = GOLDENS.path(scenario.name, release)
        steps = json.loads(path.read_text())["layers"].get("engine_steps") if path.exists() else None
        if not steps or "refused" in steps[0]:
            continue
        outputs = {}
        for s in steps:
            assert set(s["kv_blocks"]) == ({"free", "used"} if fixed else {"used"}), (release, s["step"])
            assert isinstance(s["waiting"], list) and isinstance(s["running"], list)
            for rid, r in s["requests"].items():
                assert set(REQUEST_STATE) <= set(r), (release, s["step"], rid)
                grew = r["output_tokens"] - outputs.get(rid, 0)
                assert grew in (0, 1 + r["accepted_draft_tokens"]) or rid in s["finished"], (release, s["step"], rid)
                outputs[rid] = r["output_tokens"]
        assert not steps[-1]["running"] and steps[-1]["kv_blocks"]["used"] == 0, release
        checked.append(release)
    assert PINS.oracle in checked


# --- the reports: state oracle beside candidate, admissions marked --------------------------

def _step(step, r1_computed, waiting, running, new=(), resumed=(), free=10):
    return {"step": step, "total_num_scheduled_tokens": 17, "token_budget": 64,
            "requests": {"r1": {"tokens": 17, "draft_tokens": 16, "accepted_draft_tokens": 2,
                                "computed_tokens": r1_computed, "output_tokens": 3, "kv_blocks": 4}},
            "new": list(new), "resumed": list(resumed), "preempted": [], "finished": [],
            "kv_blocks": {"free": free, "used": 20 - free}, "waiting": list(waiting), "running": list(running)}


ORACLE_STEPS = [_step(0, 17, [], ["r1"], new=["r1"]), _step(1, 300, ["r2"], ["r1"], resumed=["r1"])]
CANDIDATE_STEPS = [ORACLE_STEPS[0], _step(1, 301, ["r2"], ["r1"], free=9)]


def test_a_decision_is_named_before_the_state_it_led_to():
    c = compare_layer("steps", ORACLE_STEPS, CANDIDATE_STEPS)
    assert c.index == 1
    assert [f.path for f in c.fields] == ["resumed", "requests.r1.computed_tokens", "kv_blocks.free",
                                          "kv_blocks.used"]
    same_decisions = [ORACLE_STEPS[0], dict(CANDIDATE_STEPS[1], resumed=["r1"])]
    assert compare_layer("steps", ORACLE_STEPS, same_decisions).first.path == "requests.r1.computed_tokens"
    # the drafts accepted come before the state they led to, the budget after both
    accepted = json.loads(json.dumps(same_decisions))
    accepted[1]["requests"]["r1"]["accepted_draft_tokens"] = 3
    accepted[1]["token_budget"] = 65
    paths = [f.path for f in compare_layer("steps", ORACLE_STEPS, accepted).fields]
    assert paths[0] == "requests.r1.accepted_draft_tokens" and paths[-1] == "token_budget"


def test_text_report_shows_the_state_beside_the_decision():
    c = compare_layer("steps", ORACLE_STEPS, CANDIDATE_STEPS)
    text = render([Verdict("port", "s", "diverged", "candidate", [c])], "0.27.1")
    assert "computed tokens / output tokens / KV blocks" in text
    # the resumed request is marked on the side that resumed it; its state after the update
    row = next(line for line in text.splitlines() if line.startswith("   ! r1 "))
    assert row.split() == ["!", "r1", "resumed", *"17 / 16 / 2 -> 300 / 3 / 4".split(),
                           *"17 / 16 / 2 -> 301 / 3 / 4".split()]
    assert "   ! KV blocks free / used  10 / 10  9 / 11" in text
    assert "     waiting (in order)     r2       r2" in text
    assert "     running (in order)     r1       r1" in text


def test_html_report_shows_the_state_beside_the_decision():
    c = compare_layer("steps", ORACLE_STEPS, CANDIDATE_STEPS)
    v = Verdict("port", "kv_pressure", "diverged", "candidate", [c])
    result = apply_gate([v], {"kv_pressure": ("ENG-SCHED-CORE",)}, [], dt.date(2026, 12, 1))
    golden = trace_of({"layers": {"steps": ORACLE_STEPS}})
    page = html_report(gate_view(result, "0.27.1", traces={
        ("port", "kv_pressure"): (trace_of({"layers": {"steps": CANDIDATE_STEPS}}), golden)}))
    table = page[page.index("<table class='per-request'>"):]
    table = table[:table.index("</table>")]
    for name in REQUEST_STATE + ("admitted",):
        assert f"<th>{name}</th>" in table
    assert "<td>resumed</td>" in table and "<td class='diff'></td>" in table  # only the oracle resumed it
    assert "<td class='diff'>301</td>" in table
    assert "free 10, used 10" in table and "free 9, used 11" in table
    assert "<td><i>waiting</i></td>" in table and "<td><i>running</i></td>" in table


# --- a port that counts verify steps differently: reported at the step its drafts differ ---

STEP_IDENTITIES = ("aborted", "emitted", "num_common_prefix_blocks")


def _without_state(steps: list[dict]) -> list[dict]:
    """The records as protocol 1 had them: decisions only, no state after the update."""
    out = []
    for s in steps:
        s = {k: v for k, v in s.items() if k not in STEP_STATE + STEP_IDENTITIES}
        s["requests"] = {rid: {k: v for k, v in r.items() if k in ("tokens", "draft_tokens")}
                         for rid, r in s["requests"].items()}
        out.append(s)
    return out


def _without_next_drafts(steps: list[dict]) -> list[dict]:
    """The records as protocol 2 had them for drafts: no next_draft_token_ids."""
    return [dict(s, requests={rid: {k: v for k, v in r.items() if k != "next_draft_token_ids"}
                              for rid, r in s["requests"].items()}) for s in steps]


@pytest.mark.oracle
def test_miscounted_verify_steps_are_reported_at_the_step_whose_drafts_differ():
    """The TEST DOUBLE (tests/doubles/miscount_worker.py) is the oracle's own scheduler with the
    stand-in's verify steps counted on every sampling step, so it indexes the acceptance pattern
    by the calls that drafted, not by the verify steps. Its first wrong drafts are recorded at
    the step that made them (`next_draft_token_ids`); without that field the difference showed
    one step later, and with decisions only (protocol 1) dozens of steps later."""
    from conformance.process.envs import ensure_env

    python = ensure_env(PINS.oracle, log=lambda m: None, pins=PINS)
    argv = (str(python), str(REPO / "tests" / "doubles" / "miscount_worker.py"), "--release", PINS.oracle,
            *device_args())
    # scenario -> first divergent step: with the drafts made, without them, decisions only
    wanted = {"kv_pressure": (0, 1, 53), "priority_kv_pressure": (0, 1, 8)}
    with EngineProcess(EngineSpec("miscounted-verify-steps", argv)) as proc:
        assert proc.hello["engine"] == "vllm+double:miscounted-verify-steps"
        found = {}
        for name in wanted:
            scenario = next(s for s in STAND_IN if s.name == name)
            golden = GOLDENS.load(name, PINS.oracle)
            trace = make_trace("miscounted", proc.hello, scenario, proc.run(scenario, scenario.layers))
            verdict = judge(trace, golden, "candidate")
            assert verdict.kind == "diverged"
            by_layer = {c.layer: c for c in verdict.comparisons}
            steps = by_layer["steps"]
            assert by_layer["outputs"].equal  # accepted drafts are the target's own tokens: outputs stay equal
            assert ".next_draft_token_ids" in steps.first.path, steps.first.path
            # every decision and the state are equal there: only the drafts it made differ
            assert _without_next_drafts([steps.record]) == _without_next_drafts([steps.actual_record])
            later = compare_layer("steps", _without_next_drafts(golden.layers["steps"]),
                                  _without_next_drafts(trace.layers["steps"]))
            old = compare_layer("steps", _without_state(golden.layers["steps"]),
                                _without_state(trace.layers["steps"]))
            found[name] = (steps.index, later.index, old.index)
            text = render([verdict], PINS.oracle)
            assert f"layer steps: first divergence at step {steps.index}, field {steps.first.path}" in text
        assert found == wanted


def test_a_golden_of_another_protocol_version_is_invalid_with_the_reason():
    """Protocol 2 added the state to every step record: a golden written under protocol 1 would
    differ at step 0 on fields it never had. It is named stale instead."""
    scenario = {"name": "kv_pressure", "sha256": "0" * 64}
    golden = {"engine": {"protocol": 1}, "scenario": scenario, "layers": {"steps": _without_state(ORACLE_STEPS)}}
    trace = {"engine": {"label": "port", "protocol": 2}, "scenario": scenario, "layers": {"steps": ORACLE_STEPS}}
    verdict = judge(trace, golden, "candidate")
    assert verdict.kind == "invalid_golden"
    assert "written under protocol 1, the run speaks protocol 2" in verdict.message
    assert "make goldens" in verdict.message
    assert judge(trace, dict(golden, engine={"protocol": 2}, layers={"steps": ORACLE_STEPS}), "candidate").kind == "pass"


def test_protocol_md_worked_values_are_the_stand_ins():
    """engines/PROTOCOL.md states the stand-in's recipe with worked values a port checks its own
    implementation against; they are the stand-in's, so the document cannot drift from it."""
    from conformance.formats.workload import (draft, expected_output, prefix_tokens, prompt_tokens,
                                              request_prompts, target_next, validate_workload, verify)

    doc = " ".join((REPO / "engines" / "PROTOCOL.md").read_text().split())
    t = prompt_tokens(7, "r0", 4, 1000)
    drafts = draft(7, t, 4, 2, 1000)
    chat = {"seed": 7, "vocab_size": 1000, "max_steps": 10, "requests": [
        {"id": "r0", "arrival_step": 0, "prompt_len": 4, "max_tokens": 3},
        {"id": "r1", "arrival_step": 0, "prompt_len": 2, "max_tokens": 1, "continues": "r0"}]}
    continued = request_prompts(validate_workload(chat, "chat", {"max_model_len": 100}), 100)["r1"]
    for text in (f"`target_next(0, [], 151936)` = {target_next(0, [], 151936)}",
                 f"`target_next(7, [1, 2, 3], 1000)` = {target_next(7, [1, 2, 3], 1000)}",
                 f"`prompt_tokens(7, \"r0\", 4, 1000)` = `{t}`",
                 f"`draft(7, t, 4, 2, 1000)` = `{drafts}`",
                 f"`verify(7, t, that, 1000)` = `{verify(7, t, drafts, 1000)}`",
                 f"`verify(7, t, [-1, -1], 1000)` = `{verify(7, t, [-1, -1], 1000)}`",
                 f"`prefix_tokens(7, \"sys\", 4, 1000)` = `{prefix_tokens(7, 'sys', 4, 1000)}`",
                 f"`expected_output(7, t, 3, [], 100, 1000)` = `{expected_output(7, t, 3, [], 100, 1000)}`",
                 f"`expected_output(7, t, 5, [524], 100, 1000)` = `{expected_output(7, t, 5, [524], 100, 1000)}`",
                 f"with `prompt_len` 2 has the prompt `{continued}`"):
        assert text in doc, text
    assert verify(7, t, drafts, 1000)[-1] != drafts[2]  # the worked draft's third token is wrong
    assert "its hash recipe is written there" not in doc  # the recipe is in the document itself
