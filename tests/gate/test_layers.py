"""A candidate is judged on the layers it declares (its hello) and the gate asks for (--layers);
the gate can require layers (--require-layers, by default every layer asked), so a port cannot
pass by serving less; every report says which layers were judged and which were not.

Engines are the TEST DOUBLE replaying the gate oracle's goldens (tests/doubles/double_engine.py
--replay): the oracle double serves every layer, the candidate double only config, steps and
outputs (a scheduler-only port that agrees with the oracle where it serves)."""

import html
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conformance import cli
from conformance.formats.pins import load_pins
from conformance.formats.protocol import LAYERS
from conformance.formats.scenario import load_scenario
from conformance.gate import run as gate_run
from conformance.gate.context import RunContext
from conformance.judging.verdict import CANDIDATE, ORACLE
from tests.helpers import DOUBLE, REPO, gate_engine

PINS = load_pins()
# config only; steps and outputs; the whole engine; methods
SCENARIOS = [load_scenario(REPO / "scenarios" / f"{name}.json")
             for name in ("dflash_27b_gate", "steady_decode", "engine_ngram", "method_matrix")]
SCHEDULER = "config,steps,outputs"


def double(*options: str) -> str:
    return shlex.join([sys.executable, str(DOUBLE), "--replay", PINS.oracle, *options])


ENGINES = [gate_engine(double("--serve", ",".join(LAYERS)), ORACLE),
           gate_engine("port=" + double("--serve", SCHEDULER), CANDIDATE)]


def gate(tmp_path, layers=None, required=None):
    out: list[str] = []
    context = RunContext(PINS, log=lambda m: None, out=out.append, reports=tmp_path, layers=layers,
                         require_layers=required)
    status = gate_run.gate(context, SCENARIOS, ENGINES)
    return status, "\n".join(out)


def test_a_scheduler_only_port_passes_on_the_layers_asked_and_every_report_says_what_was_not_judged(tmp_path):
    status, text = gate(tmp_path, layers=SCHEDULER.split(","))
    assert status == 0, text
    first = text.splitlines()[0]
    assert first.startswith("== vllm-parity gate: PASS (exit status 0)")
    # layers never asked are said to be not asked, whether or not the port serves them
    assert "judged on config, steps, outputs; methods, the engine layers not judged: not asked (--layers, LAYERS=)" in first
    assert "does not serve" not in first
    # per scenario: engine_ngram and method_matrix were judged on config alone
    assert any(line.startswith("   port: judged on config; the engine layers not judged") for line in text.splitlines())
    assert "engine_ngram" in text and "pass [config]" in text and "pass [config,steps,outputs]" not in text
    summary = (tmp_path / "summary.md").read_text()
    assert "## vllm-parity gate: PASS" in summary
    assert "Layers: judged on config, steps, outputs; methods, the engine layers not judged" in summary
    assert "| `port` | judged on config; methods not judged: not asked (--layers, LAYERS=)" in summary
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    layers = junit.find("properties/property[@name='layers']").get("value")
    assert layers.startswith("judged on config, steps, outputs; methods, the engine layers not judged")
    cases = {c.get("name"): c for c in junit.iter("testcase")}
    skipped = cases["ENG-SCHED-CORE / engine_ngram / port / engine_steps"].find("skipped")
    assert skipped is not None and "engine_steps not judged" in skipped.get("message")
    assert not list(junit.iter("failure")) and not list(junit.iter("error"))
    page = (tmp_path / "report.html").read_text()
    assert "Layers: judged on config, steps, outputs; methods, the engine layers not judged" in page
    assert "engine_outputs: not asked (--layers, LAYERS=)" in page  # the scenario's own table


def test_a_config_only_port_asked_for_config_is_not_said_to_lack_the_layers_never_asked(tmp_path):
    """LAYERS=config with a port declaring config alone: steps and outputs were never asked for."""
    engines = [ENGINES[0], gate_engine("port=" + double("--serve", "config"), CANDIDATE)]
    out: list[str] = []
    context = RunContext(PINS, log=lambda m: None, out=out.append, reports=tmp_path, layers=["config"])
    status = gate_run.gate(context, SCENARIOS[:2], engines)
    first = out[0].splitlines()[0]
    assert status == 0, out[0]
    assert first.endswith("judged on config; steps, outputs not judged: not asked (--layers, LAYERS=)"), first
    assert "does not serve" not in "\n".join(out)


def test_the_same_port_without_layers_fails_saying_which_required_layers_it_does_not_serve(tmp_path):
    status, text = gate(tmp_path)
    assert status == 2, text
    assert text.startswith("== vllm-parity gate: ERROR (exit status 2)")
    assert "methods, the engine layers not judged: required, but the engine does not serve them" in text.splitlines()[0]
    assert ("required layers engine_config, engine_steps, engine_outputs not judged: the engine does not serve "
            "them") in text
    assert "--layers config,steps,outputs" in text  # how to judge it on what it serves
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    cases = {c.get("name"): c for c in junit.iter("testcase")}
    error = cases["ENG-SCHED-CORE / engine_ngram / port / engine_steps"].find("error")
    assert error is not None and error.get("type") == "unsupported"
    assert "| method_matrix | `port` | candidate | unsupported |" in (tmp_path / "summary.md").read_text()


def test_required_layers_decide_what_a_port_must_serve(tmp_path):
    status, text = gate(tmp_path, required=SCHEDULER.split(","))  # judged on all it declares
    assert status == 0, text
    assert "methods, the engine layers not judged: the engine does not serve them" in text.splitlines()[0]
    status, text = gate(tmp_path, required=["config", "methods"])
    assert status == 2 and "required layer methods not judged" in text


def test_a_port_first_then_drift_only_when_asked(tmp_path):
    _, text = gate(tmp_path, layers=SCHEDULER.split(","))
    head = next(line for line in text.splitlines() if line.startswith("scenario"))
    assert head.split()[1:] == ["(candidate)", "(oracle)"]  # the candidate's column first
    assert "drift across pins and per-pin tables left out" in text and "-- drift across pins (from" not in text
    out: list[str] = []
    reports = tmp_path / "drift-reports"
    gate_run.gate(RunContext(PINS, log=lambda m: None, out=out.append, drift=True, reports=reports),
                  SCENARIOS[:1], ENGINES)
    tables = out[2]  # after the grid and the requirement rows
    assert tables.startswith("-- drift across pins (from the goldens)")
    # every report has them, rendered from the one view
    assert tables in (reports / "summary.md").read_text(encoding="utf-8")
    assert html.escape(tables) in (reports / "report.html").read_text(encoding="utf-8")


def test_require_layers_must_be_among_the_layers_asked(capsys):
    status = cli.main(["gate", "--layers", "config", "--require-layers", "config,steps",
                       "--scenario", str(REPO / "scenarios" / "dflash_27b_gate.json")])
    assert status == 2 and "steps not among --layers config" in capsys.readouterr().err
    assert cli.main(["gate", "--require-layers", "config,stepz"]) == 2
    assert "--require-layers: unknown layer(s) ['stepz']" in capsys.readouterr().err


def test_make_passes_layers_required_layers_and_drift():
    text = subprocess.run(["make", "-n", "parity", "LAYERS=config,steps,outputs", "REQUIRE_LAYERS=config",
                           "DRIFT=1", "CANDIDATE=./port"], cwd=REPO, capture_output=True, text=True).stdout
    line = next(x for x in text.splitlines() if "parity gate" in x)
    assert ("--candidate './port' --layers 'config,steps,outputs' --require-layers 'config' --drift"
            in line), line
    recipe = subprocess.run(["make", "-n", "gate", "LAYERS=config"], cwd=REPO, capture_output=True, text=True).stdout
    gate_line = recipe[recipe.index("parity gate"):].replace("\\\n", " ")  # the recipe, its lines joined
    assert "--reports out/gate" in gate_line and "--layers 'config'" in gate_line


def test_a_candidate_is_asked_only_for_the_layers_it_declares():
    """No `unsupported` round trip: the port's traces hold no failure, only what it serves."""
    from conformance.gate.execute import run_share
    from conformance.gate.shards import plan

    units = plan([("port", 1)], SCENARIOS, None)
    traces = run_share(RunContext(PINS, log=lambda m: None), ENGINES[1:], SCENARIOS, units)
    assert not any(t.failure is not None for t in traces.values())
    engine = next(t for key, t in traces.items() if key == "port / engine_ngram / engine")
    assert engine.layers == {} and list(engine.not_served) == ["engine_config", "engine_steps", "engine_outputs"]
    assert list(engine.capabilities) == SCHEDULER.split(",")


def test_selfcheck_exercises_every_layer_the_engine_declares(capsys):
    status = cli.main(["selfcheck", "--engine", double("--serve", "config,steps,outputs,methods")])
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err
    assert "layers ['config', 'steps', 'outputs', 'methods']" in captured.err
    assert "steady_decode: layers ['config', 'steps', 'outputs']" in captured.err
    assert "method_matrix: layers ['config', 'methods']" in captured.err
    assert "kv_pressure_no_spec: layers ['config', 'steps', 'outputs']" in captured.err  # no speculation
    assert "engine_ngram: layers ['config']" in captured.err  # it does not declare the engine layers


def test_selfcheck_fails_a_declared_layer_the_engine_does_not_serve(capsys):
    # declares methods, but without --replay the double serves no methods records
    status = cli.main(["selfcheck", "--engine", shlex.join([sys.executable, str(DOUBLE), "--serve", "config,methods"])])
    out = capsys.readouterr().out
    assert status == 1 and "method_matrix: the declared layer methods was asked for and sent no record" in out


def test_selfcheck_names_a_declared_layer_no_scenario_given_has(capsys):
    status = cli.main(["selfcheck", "--engine", double("--serve", "config,steps,outputs"),
                       "--scenario", str(REPO / "scenarios" / "dflash_27b_gate.json")])
    out = capsys.readouterr().out
    assert status == 1 and "no scenario given has the declared layer(s) ['steps', 'outputs']" in out


@pytest.mark.oracle
def test_the_real_oracle_judges_a_scheduler_only_port_by_its_layers(tmp_path, capsys, warm_gate, warm_sessions):
    """`parity gate` end to end with the gate oracle (the pinned one, the tests' warm engine: no
    cold start of its own): with the layers the port serves it passes, and its reports say what
    was not judged; without them it fails, saying which required layers it does not serve."""
    oracle = warm_sessions(PINS.oracle).start()
    port = double("--serve", SCHEDULER)
    scenarios = [arg for s in SCENARIOS for arg in ("--scenario", str(s.source))]
    status = cli.main(["gate", "--candidate", f"port={port}", "--layers", SCHEDULER, "--waivers", "/dev/null",
                       "--reports", str(tmp_path / "with"), *scenarios])
    out, err = capsys.readouterr()
    assert status == 0, out
    assert "[gate] cold starts: 1 for 2 engines" in err  # the port's; the oracle was warm
    assert warm_sessions(PINS.oracle).start() is oracle and oracle.alive  # left warm by the gate
    assert ("judged on config, steps, outputs; methods, the engine layers not judged: not asked (--layers, "
            "LAYERS=)") in out.splitlines()[0]
    for name in ("summary.md", "junit.xml", "report.html"):
        assert "methods, the engine layers not judged" in (tmp_path / "with" / name).read_text(), name
    status = cli.main(["gate", "--candidate", f"port={port}", "--waivers", "/dev/null",
                       "--scenario", str(REPO / "scenarios" / "method_matrix.json")])
    out = capsys.readouterr().out
    assert status == 2, out  # every layer is required: methods too
    assert "required layer methods not judged: the engine does not serve it" in out
    assert "--layers config (in make: LAYERS=config)" in out  # what it served in this run
