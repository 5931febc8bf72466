"""Sharding the gate: the plan and its shares, the results folders, and `parity merge`.

Engines here are the TEST DOUBLE (tests/doubles/double_engine.py), oracle included: the
mechanics of sharding do not depend on which engine answers. Their verdicts against the real
goldens are divergences and `unsupported` layers, which is what the comparison needs."""

import json
import os
import shlex
import sys
import xml.etree.ElementTree as ET

import pytest

from conformance import cli
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.gate import engines as gate_engines_mod, run as gate_run
from conformance.gate.context import RunContext
from conformance.gate.shards import COLD_START, ShardError, Unit, assign, parse_shard, plan, share_cost
from conformance.judging.goldens import GOLDENS
from conformance.judging.verdict import CANDIDATE, ORACLE
from conformance.report import ci
from conformance.report.view import gate_view
from tests.helpers import REPO, double_command, gate_engine

PINS = load_pins()
OTHER = PINS.candidates[0]  # a pin besides the gate oracle
SCENARIOS = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))]
CHEAP = [s for s in SCENARIOS if s.name in ("dflash_27b_gate", "steady_decode", "engine_ngram")]
REPORTS = ("junit.xml", "summary.md", "report.html", "annotation.md")


@pytest.fixture
def engines(tmp_path):
    record = tmp_path / "record.json"
    # a budget the oracle does not resolve (its golden's, 60 tokens more: the reservation left out)
    budget = GOLDENS.load("dflash_27b_gate", PINS.oracle).layers["config"][0]["max_num_scheduled_tokens"] + 60
    record.write_text(json.dumps({"max_num_scheduled_tokens": budget, "budget_log_lines": ["candidate line"]}))
    oracle = double_command("--steps", "3")
    return [gate_engine("TEST-DOUBLE-oracle=" + oracle, ORACLE),
            gate_engine("double-candidate=" + double_command("--record", str(record)), CANDIDATE)]


def run(collect, *args, **context):
    """`collect` (gate or merge) with a context of `context`'s fields; its status and its output."""
    lines = []
    status = collect(RunContext(PINS, log=lambda m: None, out=lines.append, **context), *args)
    return status, "\n".join(lines)


def merge(folders):
    return gate_run.merge(RunContext(PINS, log=lambda m: None), folders)


def test_shard_parsing():
    assert parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "3", "a/b", ""):
        with pytest.raises(ShardError, match="--shard"):
            parse_shard(bad)


def test_shares_are_deterministic_balanced_and_cover_the_plan():
    units = plan([("vllm-0.27.1", 2), ("vllm-0.28.0", 1), ("vllm-0.33.0", 1)], SCENARIOS, None)
    shares = assign(units, 3)
    # every runner computes the same shares from the same engines and scenario files
    again = plan([("vllm-0.27.1", 2), ("vllm-0.28.0", 1), ("vllm-0.33.0", 1)],
                 [load_scenario(s.source) for s in SCENARIOS], None)
    assert assign(again, 3) == shares
    assert sorted(u.key for s in shares for u in s) == sorted(u.key for u in units)  # each unit once
    costs = [share_cost(s) for s in shares]
    # balanced: no share exceeds the mean by more than the costliest unit plus a cold start
    assert max(costs) - sum(costs) / 3 <= max(u.cost for u in units) + COLD_START
    # an engine's units stay together: at most one extra cold start per cut (3 engines + 2 cuts)
    assert sum(len({u.engine for u in s}) for s in shares) <= 5
    assert all(s == sorted(s, key=units.index) for s in shares)  # plan order within a share


def test_one_shard_per_unit_at_most():
    units = plan([("a", 1)], CHEAP, ["config"])
    shares = assign(units, 5)
    assert [len(s) for s in shares].count(0) >= 2 and sum(len(s) for s in shares) == len(units)


def test_three_shards_merged_give_what_one_run_gives(tmp_path, engines, monkeypatch):
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.delenv("BUILDKITE", raising=False)
    whole, whole_out = run(gate_run.gate, CHEAP, engines, reports=tmp_path / "one")
    once = summary.read_text()
    for i in (1, 2, 3):
        status, text = run(gate_run.gate, CHEAP, engines, shard=(i, 3), results=tmp_path / f"s{i}")
        assert status == 0 and f"shard {i}/3" in text
        assert (tmp_path / f"s{i}" / "manifest.json").exists() and (tmp_path / f"s{i}" / "verdicts.json").exists()
    merged, merged_out = run(gate_run.merge, [tmp_path / f"s{i}" for i in (3, 1, 2)], reports=tmp_path / "merged")
    assert whole == merged == 2  # the candidate's layers are unsupported: could not be compared
    assert merged_out == whole_out and merged_out.startswith("== vllm-parity gate: ERROR")
    for name in REPORTS:
        assert (tmp_path / "merged" / name).read_text() == (tmp_path / "one" / name).read_text(), name
    assert summary.read_text() == once + once  # appended by each, never overwritten
    names = [c.get("name") for c in ET.parse(tmp_path / "one" / "junit.xml").iter("testcase")]
    assert "ENG-SCHED-CORE / dflash_27b_gate / double-candidate / config" in names
    # the candidate serves config only: its steps are a required layer it does not serve
    errors = {c.get("name"): c.find("error") for c in ET.parse(tmp_path / "one" / "junit.xml").iter("testcase")}
    assert errors["ENG-SCHED-CORE / steady_decode / double-candidate / steps"].get("type") == "unsupported"
    # the oracle's and the candidate's blocks differ; the candidate's config is judged on
    # engine_ngram too (its engine layers, which it does not serve, are not)
    assert whole_out.count("budget log lines [") == 3


class Planned(BaseException):
    """Raised where the gate would start its share's engines: the plan is all this test needs."""


def test_envs_selects_the_pins_its_gate_share_runs_and_a_port_only_share_none(tmp_path, monkeypatch, capsys):
    """`parity envs --shard` and `parity gate --shard`, given the same options, cut one plan
    (plan.shard_plan): each shard's envs select exactly the pins of the engines its gate share
    runs. The port's share (the TEST DOUBLE lacking speculation and priorities, so the gate
    leaves its units on those scenarios out) builds no pin's environment."""
    from conformance.process.envs import env_cache_key

    ran = []

    def planned(context, engines, scenarios, units, features=None):
        ran.append(sorted({u.engine for u in units}))
        raise Planned

    monkeypatch.setattr(gate_run, "run_share", planned)
    port = "port=" + shlex.join([sys.executable, str(REPO / "tests" / "doubles" / "declared_engine.py")])
    options = ["--candidate", port, "--layers", "config,steps,outputs"]
    keys = []
    for i in (1, 2, 3):
        assert cli.main(["envs", "--key", "--shard", f"{i}/3", *options]) == 0
        keys.append(capsys.readouterr().out.strip())
        with pytest.raises(Planned):
            cli.main(["gate", "--shard", f"{i}/3", "--results", str(tmp_path / f"s{i}"), *options])
    oracle = f"vllm-{PINS.oracle}"
    assert ran == [[oracle], [oracle], ["port"]], ran
    assert keys == [env_cache_key([PINS.oracle], PINS)] * 2 + ["no-envs"], keys


def test_a_block_of_budget_log_lines_prints_once():
    from conformance.judging.compare import compare_layer
    from conformance.judging.requirement_rows import apply_gate
    from conformance.judging.verdict import Verdict
    from conformance.report.render_text import render_gate

    def diverged(scenario):
        return Verdict("port", scenario, "diverged", CANDIDATE, [compare_layer(
            "config", [{"max_num_scheduled_tokens": 4036}], [{"max_num_scheduled_tokens": 4096}])],
            expected_lines=["set to 4036"], actual_lines=["set to 4096"])

    text = render_gate(gate_view(apply_gate([diverged("a"), diverged("b")], {}, []), PINS.oracle))
    assert text.count("set to 4096") == 1 and "budget log lines: as block [1] above (a, port)" in text
    row = next(line for line in text.splitlines() if line.startswith("a "))  # the grid's row
    assert row.split() == ["a", "diverged", "config.max_num_scheduled_tokens"]


def test_the_matrix_of_the_built_in_scenarios_and_pins_fits_a_screen():
    from conformance.judging.requirement_rows import apply_gate
    from conformance.judging.verdict import STAND_IN, Verdict
    from conformance.report.render_text import render_gate

    verdicts = [Verdict(f"vllm-{r}", s.name, "pass" if r == PINS.oracle else "unsupported",
                        ORACLE if r == PINS.oracle else STAND_IN, message="no CPU engine")
                for r in (PINS.oracle, *PINS.candidates) for s in SCENARIOS]  # as the gate runs them
    lines = render_gate(gate_view(apply_gate(verdicts, {}, []), PINS.oracle)).splitlines()
    summary = next(i for i, line in enumerate(lines) if line.startswith(f"-- {len(verdicts)} verdicts"))
    # a screen of 50 lines: the fold names every scenario of the library (178 names take 39
    # lines at the report's width); the grid around it is a few lines
    assert summary < 50 and all(s.name in "".join(lines[:summary]) for s in SCENARIOS)
    first = next(line for line in lines if line.startswith(SCENARIOS[0].name))
    assert first.split()[-3:] == ["pass", "unsupported", "unsupported"]


def test_past_a_screen_identical_rows_fold_and_every_scenario_is_still_named():
    from conformance.judging.requirement_rows import apply_gate
    from conformance.judging.verdict import Verdict
    from conformance.report.render_text import MAX_ROWS, render_gate

    names = [f"s{i:02d}" for i in range(MAX_ROWS + 10)]
    verdicts = [Verdict("port", n, "unsupported" if n == "s07" else "pass", CANDIDATE) for n in names]
    lines = render_gate(gate_view(apply_gate(verdicts, {}, []), PINS.oracle)).splitlines()
    grid = next(i for i, line in enumerate(lines) if line.startswith("scenario"))  # below what to fix
    rows = [line.split() for line in lines[grid + 1:] if line.startswith("s")]
    assert rows[:2] == [["s00", f"+{len(names) - 2}", "pass"], ["s07", "unsupported"]]
    listed = next(line for line in lines if line.startswith(f"   s00 +{len(names) - 2}: "))
    assert "s01, s02" in listed and "s07" not in listed
    assert all(n in "\n".join(lines) for n in names) and len(lines) < 40


def test_a_whole_run_keeps_its_results_and_they_merge_to_the_same_report(tmp_path, engines):
    status, text = run(gate_run.gate, CHEAP[:1], engines, results=tmp_path / "r")
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    verdicts = json.loads((tmp_path / "r" / "verdicts.json").read_text())
    assert manifest["index"] == manifest["count"] == 1 and len(verdicts) == manifest["planned"] == 2
    # judged once: each unit's entry is the gate's verdict on its engine and scenario
    assert [(v["engine"], v["kind"], v["first"]) for v in verdicts] == [
        ("TEST-DOUBLE-oracle", "diverged", "config.max_num_scheduled_tokens"),
        ("double-candidate", "diverged", "config.max_num_scheduled_tokens")]
    assert status == 1 and run(gate_run.merge, [tmp_path / "r"]) == (status, text)


def test_merge_refuses_a_missing_a_duplicate_or_a_foreign_shard(tmp_path, engines):
    for i in (1, 2):
        run(gate_run.gate, CHEAP, engines, shard=(i, 2), results=tmp_path / f"s{i}")
    with pytest.raises(ShardError, match=r"shard 2/2 missing"):
        merge([tmp_path / "s1"])
    with pytest.raises(ShardError, match=r"shard 1/2 given twice"):
        merge([tmp_path / "s1", tmp_path / "s1"])
    manifest = json.loads((tmp_path / "s2" / "manifest.json").read_text())
    for key, value, words in (("oracle", OTHER, "oracle"), ("scenario_set", "0" * 64, "scenario set"),
                              ("tool", {"version": "9.9", "sources": "x"}, "tool version")):
        (tmp_path / "s2" / "manifest.json").write_text(json.dumps(dict(manifest, **{key: value})))
        with pytest.raises(ShardError, match=f"not shards of one gate run: they differ in {words}"):
            merge([tmp_path / "s1", tmp_path / "s2"])
    with pytest.raises(ShardError, match="no manifest.json"):
        merge([tmp_path])


def test_merge_on_the_command_line(tmp_path, engines, capsys):
    for i in (1, 2):
        run(gate_run.gate, CHEAP, engines, shard=(i, 2), results=tmp_path / f"s{i}")
    assert cli.main(["merge", str(tmp_path / "s1")]) == 2
    assert "parity merge: error: shard 2/2 missing" in capsys.readouterr().err
    assert cli.main(["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--reports", str(tmp_path / "r")]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("== vllm-parity gate: ERROR") and "[gate]" not in out and "[merge]" not in out
    assert "[merge] 2 shards" in err and (tmp_path / "r" / "annotation.md").exists()
    assert cli.main(["gate", "--shard", "3/2"]) == 2
    assert "I must be between 1 and N" in capsys.readouterr().err


def test_a_candidate_is_named_by_its_hello_and_its_command_shown_once(tmp_path, engines):
    unnamed = [gate_engine(engines[0].text, ORACLE), gate_engine(engines[1].text, CANDIDATE)]
    _, text = run(gate_run.gate, CHEAP[:1], unnamed)
    # both doubles say "double 0.0-test": the second is told apart by its arguments
    second = next(line for line in text.splitlines() if line.startswith("   double 0.0-test ("))  # under the grid
    assert "--record" in second and ": command " in second
    assert text.count(engines[1].command) == 1


def test_named_candidates_on_the_command_line(monkeypatch):
    found = gate_engines_mod.gate_engines(PINS, [f"port={double_command('--steps', '1')}", OTHER], log=lambda m: None)
    assert [(e.key, e.role, e.name) for e in found] == [
        (f"vllm-{PINS.oracle}", ORACLE, None), ("port", CANDIDATE, "port"), (f"vllm-{OTHER}", CANDIDATE, None)]
    assert found[1].command == double_command("--steps", "1") and found[2].command is None
    with pytest.raises(ValueError, match="same name"):
        gate_engines_mod.gate_engines(PINS, [OTHER, f"vllm=={OTHER}"], log=lambda m: None)


def test_buildkite_annotation_goes_through_the_agent_when_it_exists(tmp_path, engines, monkeypatch):
    """A TEST DOUBLE buildkite-agent records its argument list and its input."""
    agent = tmp_path / "bin" / "buildkite-agent"
    agent.parent.mkdir()
    agent.write_text(f"#!{sys.executable}\nimport json, sys\n"
                     f"open({str(tmp_path / 'called.json')!r}, 'w').write(json.dumps([sys.argv[1:], sys.stdin.read()]))\n")
    agent.chmod(0o755)
    monkeypatch.setenv("PATH", f"{agent.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("BUILDKITE", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    run(gate_run.gate, CHEAP[:1], engines, reports=tmp_path / "r")
    argv, text = json.loads((tmp_path / "called.json").read_text())
    assert argv == ["annotate", "--style", "error", "--context", "vllm-parity"]
    assert text == (tmp_path / "r" / "annotation.md").read_text() and "| dflash_27b_gate |" in text
    agent.unlink()
    logged = []
    ci.ci_summaries(_view_of(), tmp_path / "r2", log=logged.append)
    assert any("buildkite-agent is not on PATH" in line for line in logged)


def _view_of():
    from conformance.judging.requirement_rows import apply_gate
    from conformance.judging.verdict import Verdict

    return gate_view(apply_gate([Verdict("x", "s", "pass", ORACLE)], {}, []), "0.27.1")


def test_progress_goes_to_stderr_only(tmp_path, engines, capsys):
    status = gate_run.gate(RunContext(PINS, log=lambda m: print(m, file=sys.stderr)), CHEAP[:1], engines)
    out, err = capsys.readouterr()
    assert "[gate]" not in out and out.startswith("== vllm-parity gate")
    assert "[gate] engine 1/2: TEST-DOUBLE-oracle (oracle)" in err and "left]" in err and status == 1


# ---- a run's units side by side (gate/execute.py side_by_side_pieces) ----

def _units(engine: str, count: int, cost: float) -> list[Unit]:
    return [Unit(engine, f"s{i}", "steps", ("steps", "outputs"), cost) for i in range(count)]


def test_an_engine_holding_one_core_while_the_other_waits_is_split_in_two():
    """The oracle runs each unit twice: beside a candidate, or alone with the stand-ins read
    from their goldens, it is cut with the plan's balanced cut, one more cold start."""
    from conformance.gate.execute import segments, side_by_side_pieces

    oracle, candidate = _units("vllm-0.27.1", 90, 2.0), _units("port", 90, 1.0)
    pieces = side_by_side_pieces(oracle + candidate, 2)
    assert [[key for key, _ in segments(p)] for p in pieces] == [["vllm-0.27.1"], ["vllm-0.27.1", "port"]]
    assert [u for p in pieces for u in p] == oracle + candidate  # plan order, every unit once
    assert max(map(share_cost, pieces)) < share_cost(oracle) - COLD_START
    recorded = _units("vllm-0.28.0+goldens", 90, 0.0)  # read from goldens: no process, no core
    pieces = side_by_side_pieces(oracle + recorded, 2)
    assert len(pieces) == 2 and [key for key, _ in segments(pieces[0])] == ["vllm-0.27.1"]


@pytest.mark.parametrize("plan", [
    [("vllm-0.27.1", 3, 2.0), ("port", 3, 1.0)],  # a cut would not pay for its cold start
    [("vllm-0.27.1", 90, 2.0), ("vllm-0.28.0", 90, 1.0), ("vllm-0.33.0", 90, 1.0)],  # more engines than cores
])
def test_engines_stay_whole_where_a_cut_does_not_pay(plan):
    from conformance.gate.execute import side_by_side_pieces

    units = [u for engine, count, cost in plan for u in _units(engine, count, cost)]
    pieces = side_by_side_pieces(units, 2)
    assert [{u.engine for u in p} for p in pieces] == [{engine} for engine, _, _ in plan]
    assert side_by_side_pieces(units, 1) == pieces  # one at a time: by engine too
