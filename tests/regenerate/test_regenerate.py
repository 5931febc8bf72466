"""The golden front door (conformance/regenerate/): `make goldens` calls `parity goldens`, which
regenerates goldens from the oracle's runs or a gate's results folder, and the goldens suite
goes through the same code once per golden. The oracle's runs are replayed here by a TEST
DOUBLE session from the committed goldens: real oracle traces, with no engine started."""

import subprocess
from dataclasses import replace

import pytest

from conformance import cli
from conformance.formats.engine_ref import EngineRef
from conformance.formats.pins import load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import Failure, Trace
from conformance.gate.context import RunContext
from conformance.gate.plan import plan_run
from conformance.gate.results import write_results
from conformance.judging.goldens import GOLDENS, ORACLE_RUNS, GoldenStore
from conformance.judging.verdict import ORACLE
from conformance.process.launch import EngineSpec
from conformance.regenerate import lifecycle
from tests.helpers import GATE, REPO, trace_of

PINS = load_pins()
COMMITTED = GoldenStore()  # goldens/ itself, whatever GOLDENS is pointed at in a test
LIBRARY = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))]
CHOSEN = [load_scenario(GATE), load_scenario(REPO / "scenarios" / "steady_decode.json")]


class ReplaySession:
    """TEST DOUBLE of EngineSession: each unit answered with the pin's committed golden of its
    scenario (an oracle trace, restricted to the layers asked); what was asked is kept."""

    asked: list = []

    def __init__(self, spec, progress=None, **options):
        self.spec = spec

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def trace(self, scenario, layers=None, repeat=1, until=None, timeout=None):
        ReplaySession.asked.append((self.spec.release, scenario.name, list(layers), repeat))
        golden = COMMITTED.load(scenario.name, self.spec.release)
        return replace(golden, layers={k: v for k, v in golden.layers.items() if k in layers})


@pytest.fixture
def replayed(monkeypatch):
    """The front door's oracle runs replayed (no engine, no environment built)."""
    ReplaySession.asked = []
    monkeypatch.setattr(lifecycle, "EngineSession", ReplaySession)
    monkeypatch.setattr(lifecycle, "prepare_engine", lambda ref, pins, log: EngineSpec(ref.label, ("TEST-DOUBLE",),
                                                                                     ref.release))
    return ReplaySession


def written(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.json"))}


def test_every_door_writes_the_same_goldens_from_the_same_traces(replayed, tmp_path, monkeypatch):
    """`parity goldens` (what `make goldens` runs), the goldens suite's call (parity/test_goldens.py)
    and `parity goldens --from-results` of a gate's results folder: byte-identical goldens, each
    the oracle's trace as committed."""
    oracle = PINS.oracle
    names = [s.name for s in CHOSEN]
    committed = {f"{n}/vllm-{oracle}.json": COMMITTED.path(n, oracle).read_bytes() for n in names}

    monkeypatch.setattr(GOLDENS, "root", tmp_path / "parity-goldens")
    argv = ["goldens", "--engine", oracle] + [a for s in CHOSEN for a in ("--scenario", str(s.source))]
    assert cli.main(argv) == 0
    assert written(GOLDENS.root) == committed
    # the double run, on every layer of each scenario
    assert replayed.asked == [(oracle, s.name, s.layers, ORACLE_RUNS) for s in CHOSEN]

    monkeypatch.setattr(GOLDENS, "root", tmp_path / "suite")
    for scenario in CHOSEN:  # the goldens suite's one call per golden, --snapshot-update
        outcome = GOLDENS.regenerate(lifecycle.golden_trace(replayed(EngineSpec("x", (), oracle)), scenario),
                                     oracle, write=True)
        assert outcome.written
    assert written(GOLDENS.root) == committed

    monkeypatch.setattr(GOLDENS, "root", tmp_path / "from-results")
    results = tmp_path / "results"
    context = RunContext(PINS, log=lambda m: None)
    manifest = plan_run(context, CHOSEN, [EngineRef.pin(oracle).with_role(ORACLE)])
    unit_traces = [replayed(EngineSpec(f"vllm-{oracle}", (), oracle)).trace(
        next(s for s in CHOSEN if s.name == u.scenario), list(u.layers), ORACLE_RUNS) for u in manifest.units]
    assert len(manifest.units) > len(CHOSEN)  # a scenario's layers in units of their own, put together again
    write_results(results, manifest, 1, [(u, t, {}) for u, t in zip(manifest.units, unit_traces)])
    assert cli.main(["goldens", "--from-results", str(results)]) == 0
    assert written(GOLDENS.root) == committed


def test_layers_select_scenarios_never_cut_a_golden(replayed, capsys):
    """`make goldens LAYERS=methods` (parity goldens --layers): the goldens of the scenarios with
    that layer, each run on all of its layers; nothing else runs."""
    assert cli.main(["goldens", "--check", "--engine", PINS.oracle, "--layers", "methods"]) == 0
    with_methods = [s for s in LIBRARY if "methods" in s.layers]
    assert with_methods and len(with_methods) < len(LIBRARY)
    assert replayed.asked == [(PINS.oracle, s.name, s.layers, ORACLE_RUNS) for s in with_methods]
    assert f"[goldens] 0 would change, 0 orphaned" in capsys.readouterr().err


def test_make_goldens_calls_parity_goldens_with_its_narrowing_options():
    """PINS=, LAYERS= and SCENARIOS= reach `parity goldens` (make swallows a bare -k)."""
    done = subprocess.run(["make", "-n", "goldens", "PINS=0.27.1,0.28.0", "LAYERS=engine",
                           "SCENARIOS=steady_decode,kv_pressure", "RESULTS=out/results"], cwd=REPO,
                          capture_output=True, text=True, encoding="utf-8", stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert (".venv/bin/parity goldens --engine '0.27.1' --engine '0.28.0' --layers 'engine' "
            "--scenario 'scenarios/steady_decode.json' --scenario 'scenarios/kv_pressure.json' "
            "--from-results 'out/results' --scale 'library'") in done.stdout
    assert "pytest" not in done.stdout.split("goldens:")[-1]


@pytest.mark.parametrize("scale, given", [(None, "library"), ("all", "all"), ("production", "production")])
def test_make_goldens_writes_the_librarys_goldens_unless_a_scale_is_asked(scale, given):
    """A production scenario costs minutes of oracle CPU per pin, so `make goldens` (the bump's
    next step) leaves them out, as `make parity` and `make goldens-check` do, unless SCALE= asks."""
    done = subprocess.run(["make", "-n", "goldens", *([f"SCALE={scale}"] if scale else [])], cwd=REPO,
                          capture_output=True, text=True, encoding="utf-8", stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert f".venv/bin/parity goldens --scale '{given}'" in " ".join(done.stdout.split()), done.stdout


def test_a_pin_that_cannot_serve_the_layers_here_is_not_a_failure(monkeypatch, capsys):
    """0.33.0 on CPU has no engine build: `parity goldens` says so and still exits 0; any other
    failure stays a failure (exit 2)."""
    def runs(kind):
        def fake(selection, scenarios, pins, log, write):
            yield "0.33.0", Trace(engine={"label": "vllm-0.33.0"}, scenario={"name": GATE.stem, "sha256": "x"},
                                  provenance={}, layers={}, failure=Failure(kind, "no CPU build"))
        return fake

    argv = ["goldens", "--check", "--engine", "0.33.0", "--scenario", str(GATE)]
    monkeypatch.setattr("conformance.regenerate.command.oracle_runs", runs("unsupported"))
    assert cli.main(argv) == 0
    assert "1 unsupported here, 0 failed" in capsys.readouterr().err
    monkeypatch.setattr("conformance.regenerate.command.oracle_runs", runs("crash"))
    assert cli.main(argv) == 2
    assert "0 unsupported here, 1 failed" in capsys.readouterr().err


def test_results_of_a_gate_on_some_layers_give_no_golden(tmp_path, capsys):
    results = tmp_path / "results"
    context = RunContext(PINS, log=lambda m: None, layers=["config"])
    manifest = plan_run(context, CHOSEN[:1], [EngineRef.pin(PINS.oracle).with_role(ORACLE)])
    trace = COMMITTED.load(CHOSEN[0].name, PINS.oracle)
    write_results(results, manifest, 1, [(u, replace(trace, layers={"config": trace.layers["config"]}), {})
                                         for u in manifest.units])
    assert cli.main(["goldens", "--from-results", str(results)]) == 2
    assert "the gate ran only --layers config; a golden holds every layer" in capsys.readouterr().err


def test_one_golden_lifecycle_entry_point():
    """Outside the store, goldens are regenerated through GoldenStore.regenerate only: nothing
    else asks the store to update or write one (conformance/, parity/)."""
    import ast

    found = []
    for root in ("conformance", "parity"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.relative_to(REPO).as_posix() == "conformance/judging/goldens.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Attribute) and node.attr in ("update", "write")
                        and getattr(node.value, "id", "") in ("GOLDENS", "store")):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value.id}.{node.attr}")
    assert found == [], "a golden lifecycle besides GoldenStore.regenerate:\n" + "\n".join(found)


def test_a_refused_golden_closes_the_runs_before_the_error_goes_on():
    """`parity goldens` hung after refusing a golden: the refusal left the oracle's session
    open inside the suspended generator, closed only by garbage collection at exit, where it
    started a thread in a finalizing interpreter. The runs are closed as the error leaves."""
    from conformance.judging.goldens import GoldenRefused

    closed = []

    def runs():
        try:
            yield "0.27.1", trace_of({"scenario": {"name": "first"}})
            yield "0.27.1", trace_of({"scenario": {"name": "second"}})
        finally:
            closed.append(True)

    class Refusing:
        def regenerate(self, trace, release, write, say):
            raise GoldenRefused(f"refusing to write {trace.scenario_name}")

    pending = runs()  # held here, so only regenerate can close it (as the CLI's frame held it)
    with pytest.raises(GoldenRefused, match="refusing to write first"):
        lifecycle.regenerate(pending, True, print, Refusing())
    assert closed == [True]
