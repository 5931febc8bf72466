"""Every command line the docs show is run, narrowed where it would be slow (one small scenario,
a few examples, one pin, a bench's --quick case).

The command lines are collected from the pages tests/house/test_links.py reads (README.md, docs/*.md,
scenarios/README.md, engines/PROTOCOL.md; not docs/results/, dated records of runs made): each
line of a fenced `sh` block and each inline code span that is a make or parity command, as
shown (`.venv/bin/` and a trailing comment left out). Each must be a key of SHOWN, which says
what runs it: a Run of narrowed steps, Same (a mention or synopsis of what another shown line
runs), Elsewhere (another test of the suite that runs it; it must exist) or Skip (a mode no test
can run here, with its reason). A new doc line not in SHOWN, or an entry no page shows any more,
fails the first test. ci-examples/*.yml: every step of both examples runs, job by job, in
tests/house/test_ci_examples.py.

A `make` step is expanded by make itself (`make -n`): every parity command it prints runs in
this process, so the Makefile's own command line is what is tested; the main one is narrowed.
Pinned releases are served by the session's warm engines (tests/warm_engines.py warm_gate, and
the same lending for `parity goldens`, `run` and `fuzz`); goldens are written to a copy, never to
goldens/; a path under out/ is moved into the test's folder. A port is the C++ reference engine
(`make cpp`), which ports the gate oracle's release.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conformance import cli
from conformance.formats.pins import load_pins
from tests.helpers import CANDIDATE_PINS, DOC_PAGES, KIT_RELEASE, REPO

PAGES = [p for p in DOC_PAGES if "results" not in p.relative_to(REPO).parts]
PINS = load_pins()
PORT = REPO / "engines" / "cpp" / "build" / "reference_engine"
SMALL = "scenarios/steady_decode.json"
# the values a step's text names by {name}
PLACES = {"small": SMALL, "port": str(PORT), "oracle": PINS.oracle, "engine_scenario": "scenarios/engine_ngram.json",
          "gate": "scenarios/dflash_27b_gate.json", "production": "scenarios/prod_deep_midsize.json"}


# --- what the docs show ----------------------------------------------------------------------

FENCE = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
COMMAND = re.compile(r"(make|\.venv/bin/parity|parity)( |$)")


def shown_as(text: str) -> str:
    """A command as SHOWN keys it: `.venv/bin/` and a trailing ` # comment` left out, spaces
    collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"^\.venv/bin/", "", text.split(" #")[0].strip()))


def shown_commands(pages=PAGES) -> dict[str, list[str]]:
    """Every command line the pages show -> where ("page:line")."""
    found: dict[str, list[str]] = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(REPO) if page.is_relative_to(REPO) else page
        where = lambda offset: f"{name}:{text.count(chr(10), 0, offset) + 1}"  # noqa: E731
        for block in FENCE.finditer(text):
            if block[1] not in ("sh", "bash", "shell", "console"):
                continue
            for line in block[2].replace("\\\n", " ").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    found.setdefault(shown_as(line), []).append(where(block.start(2)))
        prose = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)  # code blocks hold no spans
        for span in SPAN.finditer(prose):
            if COMMAND.match(span[1].strip()):
                found.setdefault(shown_as(span[1]), []).append(where(span.start()))
    return found


# --- what runs each ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """`parity ARGS` run in this process, or `make TARGET VARS`: every parity command `make -n`
    prints for it run in this process, the main one (not `envs`) without `drop` (options and
    their values) and with `add`; or `sh` run as a command (`make bench BENCH_QUICK=1`)."""

    parity: str = ""
    make: str = ""
    sh: str = ""
    add: str = ""
    drop: tuple[str, ...] = ()
    status: int = 0


@dataclass(frozen=True)
class Run:
    steps: tuple[Step, ...]
    goldens: bool = False  # writes goldens: to a copy of the scenarios' goldens
    pins: bool = False  # runs pins other than the oracle (their warm sessions)
    port: bool = False  # runs the C++ reference engine (`make cpp`)


@dataclass(frozen=True)
class Same:
    """A mention, or a synopsis, of what another shown line runs."""

    shown: str


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class Elsewhere:
    """Run, as shown or narrowed, by another test of the suite ("tests/FILE.py::test_name")."""

    test: str


def run(*steps: Step, **options) -> Run:
    return Run(tuple(steps), **options)


P = lambda text, status=0, **kw: Step(parity=text, status=status, **kw)  # noqa: E731
M = lambda text, status=0, **kw: Step(make=text, status=status, **kw)  # noqa: E731
GATE_SMALL = P("gate --scenario {small}")
SHARDS = tuple(P(f"gate --shard {i}/3 --results out/results/shard-{i} --candidate 'port={{port}}' --scenario {{small}}")
               for i in (1, 2, 3))
RUN_PORT = P("run --engine {port} --scenario {small} --out trace.json")
RESULTS = P("gate --results out/results --scenario {small}")
RUN_PORT_SHOWN = "parity run --engine './build/port-engine --parity' --scenario scenarios/steady_decode.json --out trace.json"
RUN_PIN_SHOWN = "parity run --engine 0.28.0 --scenario my/scenario.json --out trace.json"
MERGE_SHOWN = "parity merge out/results/shard-* --reports out/gate"
COMMITS = "tests/bisect/test_commit_pins.py::"
LOCK_GPU = ("resolves each pin's GPU set from the package index with uv (network) and rewrites "
            "engines/vllm/requirements-gpu-*.txt")
BISECT_SHOWN = ("parity bisect --from aa8f6dc6e67f --to cb6196a6fcf4 --scenario scenarios/dflash_27b_gate.json "
                "--scenario scenarios/dflash_27b_gate_async.json --scenario scenarios/prefix_eviction.json")
BUMP = "tests/bump/test_bump.py::test_a_bump_makes_the_release_the_oracle_and_writes_the_pull_request"
BUMP_REFUSED = "tests/bump/test_bump.py::test_a_refused_release_names_every_problem_and_changes_nothing"
COVERAGE = ("measures every library scenario under coverage.py on each pin it names: minutes, and it "
            "has no narrower form; its parts are tested in tests/adequacy/test_adequacy.py")
MUTANTS = ("--sample", "--kv-sample", "--engine-sample")
TRACES = "adequacy --catalog traces --trace-scenario core_admission --pin {oracle} --trace-sample 2 --seed 13"

SHOWN: dict[str, Run | Same | Skip | Elsewhere] = {
    # README.md
    "make parity": run(M("parity", add="--scenario {small}")),
    "make test": Skip("the command that runs this test"),
    "make parity CANDIDATE='./build/port-engine --parity'": run(M("parity CANDIDATE={port}", add="--scenario {small}"),
                                                                 port=True),
    "make parity CANDIDATE='./build/port-engine --parity' LAYERS=config,steps,outputs": Same(
        "make parity CANDIDATE=./port LAYERS=config,steps,outputs"),
    "make gate": run(M("gate", add="--scenario {small}")),
    "make goldens": run(M("goldens", add="--scenario {small} --engine {oracle}"), goldens=True),
    "make goldens-check": run(M("goldens-check")),
    "make adequacy": run(M("adequacy", add="--no-coverage --catalog kv --kv-sample 1 --no-engine-tier", drop=MUTANTS)),
    "make bench": run(Step(sh="make --no-print-directory bench BENCH_QUICK=1")),
    "make bench BENCH_QUICK=1": Same("make bench"),
    "make report-check": Skip("installs chromium with apt-get (root only), then gates a mutant on every default "
                              "scenario; tests/report/test_report_html.py checks a report without it"),
    "make cpp": run(Step(sh="make --no-print-directory cpp")),
    "make duplicates": Skip("needs the developers' `duplicates` command, which `make setup` does not install, "
                            "and takes up to 120 s"),
    "make fuzz CANDIDATE='...'": run(M("fuzz CANDIDATE={port}", drop=("--budget",),
                                       add="--examples 3 --seed 1 --out out/fuzz"), port=True),
    "make fuzz": Same("make fuzz CANDIDATE='...'"),
    "make": Skip("the tool's name in prose, not a command line"),
    "parity": Same("parity --help"),
    "parity --help": run(P("--help")),
    "parity gate": Same("make parity"),
    "parity goldens": Same("make goldens"),
    # docs/adequacy.md
    "parity adequacy --sample 100 --seed 13": run(P("adequacy --sample 1 --seed 13 --no-coverage --catalog scheduler "
                                                    "--no-engine-tier")),
    "parity adequacy --no-mutants --pin 0.33.0": Skip(COVERAGE),
    "parity adequacy --no-coverage --catalog kv --kv-sample 150": run(P("adequacy --no-coverage --catalog kv "
                                                                        "--kv-sample 1 --no-engine-tier")),
    "parity adequacy --no-coverage --catalog engine": Elsewhere(  # minutes for a sample of one
        "tests/adequacy/test_adequacy.py::test_a_fixed_sample_of_engine_path_mutants_is_caught"),
    "make adequacy ADEQUACY_SAMPLE= KV_SAMPLE=": Same("make adequacy"),
    "parity adequacy": Same("make adequacy"),
    "parity adequacy [--sample N] [--no-mutants]": Same("parity adequacy --sample 100 --seed 13"),
    "parity fuzz": Same("parity fuzz --candidate CMD [--against 0.28.0] [--budget 10m | --examples N] [--seed S] "
                        "[--layers steps,outputs | config,steps,outputs | engine_steps,engine_outputs] "
                        "[--guide behaviours | coverage] [--out DIR] [--findings K]"),
    # docs/architecture.md
    "parity compare": Same(RUN_PORT_SHOWN),
    "parity docs": Same("parity docs [--check]"),
    "parity fuzz --guide coverage": run(P("fuzz --candidate {port} --examples 2 --seed 1 --guide coverage "
                                          "--out out/fuzz"), port=True),
    "parity merge": Same(MERGE_SHOWN),
    "parity run": Same(RUN_PIN_SHOWN),
    # docs/porting.md
    "parity selfcheck --engine './build/port-engine --parity'": run(P("selfcheck --engine {port}"), port=True),
    "make parity CANDIDATE=./port": run(M("parity CANDIDATE={port}", add="--scenario {small} --scenario "
                                          "{engine_scenario}", status=2), port=True),  # the engine layers required
    "make parity CANDIDATE=./port LAYERS=config,steps,outputs": run(
        M("parity CANDIDATE={port} LAYERS=config,steps,outputs", add="--scenario {small} --scenario {engine_scenario}"),
        port=True),
    "make gate CANDIDATE=./port REQUIRE_LAYERS=config,steps,outputs": run(
        M("gate CANDIDATE={port} REQUIRE_LAYERS=config,steps,outputs", add="--scenario {small} --scenario "
          "{engine_scenario}"), port=True),
    "make gate CANDIDATE=./port REQUIRE_FEATURES=priority_policy,prefix_caching": run(
        M("gate CANDIDATE={port} REQUIRE_FEATURES=priority_policy,prefix_caching", add="--scenario {small}"), port=True),
    "make parity CANDIDATE=engines/cpp/build/reference_engine LAYERS=config,steps,outputs": run(
        M("parity CANDIDATE=engines/cpp/build/reference_engine LAYERS=config,steps,outputs", add="--scenario {small}"),
        port=True),
    "make parity CANDIDATE='engines/cpp/build/reference_engine --no-draft-reservation'": run(
        M("parity CANDIDATE='engines/cpp/build/reference_engine --no-draft-reservation'",
          add="--scenario scenarios/prefill_budget_binds.json", status=1), port=True),  # the diverging port shown
    "make fuzz CANDIDATE='./build/port-engine --parity'": Same("make fuzz CANDIDATE='...'"),
    "parity fuzz --candidate CMD [--against 0.28.0] [--budget 10m | --examples N] [--seed S] [--layers steps,outputs "
    "| config,steps,outputs | engine_steps,engine_outputs] [--guide behaviours | coverage] [--out DIR] "
    "[--findings K]": run(P("fuzz --candidate {port} --against {oracle} --examples 3 --seed 1 --layers "
                            "config,steps,outputs --guide behaviours --out out/fuzz --findings 1"), port=True),
    "parity fuzz --candidate CMD --replay out/fuzz/fuzz_steps_finished.json": run(
        P("fuzz --candidate {port} --replay {small}"), port=True),
    "parity selfcheck --engine './build/port-engine --parity' --scenario scenarios/steady_decode.json": run(
        P("selfcheck --engine {port} --scenario {small}"), port=True),
    "parity gate --candidate './build/port-engine --parity' --scenario scenarios/steady_decode.json": run(
        P("gate --candidate {port} --scenario {small}"), port=True),
    RUN_PORT_SHOWN: run(
        RUN_PORT, P("compare --trace trace.json"), port=True),
    "parity compare --trace trace.json": Same(RUN_PORT_SHOWN),
    "parity compare --golden": Same(RUN_PIN_SHOWN),
    # finding, shrinking and confirming the mutant takes minutes: that test runs the same mutant through
    # the same search, shrinking and confirmation (the fuzz entries here run `parity fuzz` itself)
    "parity fuzz --candidate 0.27.1+mutant:ignore-max-num-seqs --examples 300 --seed 1": Elsewhere(
        "tests/fuzz/test_fuzz_search.py::test_finds_and_shrinks_a_mutant"),
    "make goldens SCENARIOS=NAME": run(M("goldens SCENARIOS=steady_decode", add="--engine {oracle}"), goldens=True),
    "parity run --engine 0.27.1": Same(RUN_PIN_SHOWN),
    "parity selfcheck": Same("parity selfcheck --engine './build/port-engine --parity'"),
    # docs/release-gate.md
    RUN_PIN_SHOWN: run(
        P("run --engine 0.28.0 --scenario {gate} --out trace.json"), P("compare --trace trace.json", status=1),
        P("compare --trace trace.json --golden goldens/dflash_27b_gate/vllm-0.33.0.json", status=1), pins=True),
    "parity compare --trace trace.json --golden goldens/dflash_27b_gate/vllm-0.33.0.json": Same(RUN_PIN_SHOWN),
    "parity gate [--candidate [NAME=]CMD ...]": run(P("gate --candidate port={port} --scenario {small}"), port=True),
    "parity gate --shard 2/3 --results DIR": Same(MERGE_SHOWN),
    "parity merge DIR...": Same(MERGE_SHOWN),
    "parity goldens [--check]": Same("parity goldens --check"),
    "parity envs": run(P("envs")),
    "parity selfcheck --engine CMD": Same("parity selfcheck --engine './build/port-engine --parity'"),
    "parity drift": run(P("drift")),
    "parity docs [--check]": run(P("docs --check")),
    "parity comparable A.json B.json": run(RUN_PORT, P("comparable trace.json trace.json")),
    **{f"parity gate --shard {i}/3 --results out/results/shard-{i} --candidate 'port=./build/port-engine --parity'":
       Same(MERGE_SHOWN) for i in (1, 2, 3)},
    MERGE_SHOWN: run(
        *SHARDS, P("merge out/results/shard-1 out/results/shard-2 out/results/shard-3 --reports out/gate"),
        P("merge out/results/shard-1 out/results/shard-2 out/results/shard-3 --drift"), port=True),
    "parity envs --key --shard 1/3 --candidate 'port=./build/port-engine --parity' --layers config,steps,outputs": run(
        P("envs --key --shard 1/3 --candidate 'port={port}' --layers config,steps,outputs"), port=True),
    "parity envs --shard 1/3 --candidate 'port=./build/port-engine --parity' --layers config,steps,outputs": run(
        P("envs --shard 1/3 --candidate 'port={port}' --layers config,steps,outputs"), port=True),
    "make goldens RESULTS=out/results": run(RESULTS, M("goldens RESULTS=out/results", add="--scenario {small}"),
                                            goldens=True),
    "make goldens PINS=0.33.0 LAYERS=engine": Skip("on a GPU runner only: 0.33.0's engine goldens, which no CPU "
                                                   "build runs (tests/process/test_gpu_simulation.py refuses it on CPU)"),
    # the bump takes wheels from the package index: run on a copy of the checkout there
    "parity bump X [--pr-text FILE]": Elsewhere(BUMP),
    "parity bump": Elsewhere(BUMP),
    "parity bump 0.32.0": Elsewhere(BUMP_REFUSED),
    "make bump PIN=X": Elsewhere("tests/formats/test_errors.py::test_make_bump_hands_pin_to_parity_as_one_word"),
    # docs/adequacy.md: the trace catalog (the whole library: 34 min)
    "parity adequacy --catalog traces": Same("parity adequacy --catalog traces --trace-scenario core_admission --pin "
                                             "0.27.1 --trace-sample 2 --seed 13"),
    "parity adequacy --catalog traces --trace-scenario core_admission --pin 0.27.1 --trace-sample 2 --seed 13": run(
        P(TRACES)),
    "python benchmarks/gpu_precision.py --device cuda --json figures.json": Skip("needs a CUDA GPU"),
    "python benchmarks/gpu_precision.py --device cpu --quick": Elsewhere(
        "tests/benchmarks/test_gpu_precision.py::test_the_precision_measure_runs_on_cpu_and_sees_bfloat16"),
    "make envs": Same("parity envs"),
    "make setup": run(Step(sh="make --no-print-directory setup")),
    "make goldens-check SCALE=production": run(M("goldens-check SCALE=production",
                                                 add="--scenario {production} --engine {oracle}")),
    "make parity CANDIDATE=... DRIFT=1": run(M("parity CANDIDATE={port} DRIFT=1", add="--scenario {small}"), port=True),
    "make parity DRIFT=1": run(M("parity DRIFT=1", add="--scenario {small}")),
    "make parity SCALE=production": Elsewhere(
        "tests/gate/test_production_gate.py::test_make_parity_scale_production_passes_the_oracle_on_every_production_scenario"),
    "parity envs --key": run(P("envs --key")),
    "parity envs --lock-gpu": Skip(LOCK_GPU),
    "parity fuzz --replay": Same("parity fuzz --candidate CMD --replay out/fuzz/fuzz_steps_finished.json"),
    "parity gate --drift": run(P("gate --drift --scenario {small}")),
    "parity gate --layers config,steps": run(P("gate --layers config,steps --scenario {small}")),
    "parity gate --results DIR": Same("make goldens RESULTS=out/results"),
    "parity gate --shard": Same(MERGE_SHOWN),
    "parity gate > report.txt": Same("make parity"),
    "parity goldens --check": run(P("goldens --check --scenario {small} --engine {oracle}")),
    "parity goldens --check --scale production": Same("make goldens-check SCALE=production"),
    "parity goldens --engine X": run(P("goldens --engine {oracle} --scenario {small}"), goldens=True),
    "parity goldens --from-results DIR": Same("make goldens RESULTS=out/results"),
    "parity merge --drift": Same(MERGE_SHOWN),
    # declared commits and the port queue (tests/bisect/test_commit_pins.py builds the fixture's commit environments)
    "make commit-fixture": Elsewhere(COMMITS + "test_the_fixture_is_reproducible_and_its_commits_are_the_declared_ones"),
    "make bisect FROM=A TO=B": Same(BISECT_SHOWN),
    "make bisect FROM=A TO=B [SCENARIOS=X,Y]": Same(BISECT_SHOWN),
    "parity bisect": Same(BISECT_SHOWN),
    "parity bisect --from A --to B": Same(BISECT_SHOWN),
    "parity bisect --from A --to B [--scenario scenarios/X.json ... | --rows ROW,ROW] [--layers config,steps] "
    "[--markdown out/bisect/port-queue.md]": Same(BISECT_SHOWN),
    BISECT_SHOWN: Elsewhere(COMMITS + "test_bisect_names_the_reservation_commit_for_the_dflash_gate"),
    "VLLM_PARITY_ORACLE=aa8f6dc6e67f make parity": Elsewhere(
        COMMITS + "test_the_oracle_setting_makes_a_commit_the_oracle_after_its_base"),
    "VLLM_PARITY_ORACLE=aa8f6dc6e67f make goldens PINS=aa8f6dc6e67f": Elsewhere(
        COMMITS + "test_a_commit_pin_at_the_base_commit_reproduces_the_releases_goldens_exactly"),
    "VLLM_PARITY_ORACLE=aa8f6dc6e67f make goldens-check": Elsewhere(
        COMMITS + "test_a_commit_pin_at_the_base_commit_reproduces_the_releases_goldens_exactly"),
    "parity bump 5559679229ab": Elsewhere(COMMITS + "test_a_bump_makes_a_declared_commit_the_oracle_after_its_base"),
    "parity envs --lock-gpu --pin <sha12>": Skip(LOCK_GPU),
    "make parity > report.txt": Same("make parity"),
    # engines/PROTOCOL.md
    "parity selfcheck --engine '<command line>'": Same("parity selfcheck --engine './build/port-engine --parity'"),
}


def test_every_command_line_the_docs_show_is_run_or_skipped_with_its_reason():
    shown = shown_commands()
    assert len(shown) > 50 and "make parity" in shown and "parity gate --drift" in shown, sorted(shown)
    unknown = {c: where for c, where in shown.items() if c not in SHOWN}
    assert not unknown, ("command lines the docs show that no test runs: add each to SHOWN in "
                         f"tests/house/test_doc_commands.py, narrowed where slow: {unknown}")
    stale = sorted(set(SHOWN) - set(shown))
    assert not stale, f"SHOWN entries no page shows any more: {stale}"
    for command, entry in SHOWN.items():
        if isinstance(entry, Same):
            assert isinstance(SHOWN.get(entry.shown), (Run, Elsewhere)), f"{command!r}: Same({entry.shown!r}) names no run"
        if isinstance(entry, Skip):
            assert len(entry.reason) > 10, command
        if isinstance(entry, Elsewhere):
            path, _, name = entry.test.partition("::")
            assert re.search(rf"^def {name}\(", (REPO / path).read_text(encoding="utf-8"), re.M), \
                f"{command!r}: {entry.test} is no test"


def test_a_new_doc_line_is_collected(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `make parity LAYERS=config` or `parity nothing`, not `parser` nor `makefile`.\n"
                    "```sh\n.venv/bin/parity gate \\\n    --drift   # a comment\n# only a comment\n```\n"
                    "```json\n{\"make\": 1}\n```\n", encoding="utf-8")
    found = shown_commands([page])
    assert found == {"make parity LAYERS=config": [f"{page}:1"], "parity nothing": [f"{page}:1"],
                     "parity gate --drift": [f"{page}:3"]}


RUNS = sorted(c for c, e in SHOWN.items() if isinstance(e, Run))


def _param(command: str):
    entry = SHOWN[command]
    marks = []
    if entry.pins:  # warms every pin: where the other pins' tests run (conftest.py)
        marks.append(pytest.mark.xdist_group(CANDIDATE_PINS))
    if any(s.sh.startswith("make --no-print-directory bench") for s in entry.steps):
        marks.append(pytest.mark.xdist_group("make bench"))  # its own processes: beside the others
    return pytest.param(command, marks=marks, id=command[:80])


@pytest.mark.oracle
@pytest.mark.parametrize("command", [_param(c) for c in RUNS])
def test_the_documented_command_runs(command, tmp_path, monkeypatch, warm_gate, warm_sessions, capsys):
    entry = SHOWN[command]
    if entry.port:
        if not PORT.exists():
            pytest.skip("the C++ reference engine is not built (`make cpp`)")
        if PINS.oracle != KIT_RELEASE:
            pytest.skip(f"the reference engine ports vLLM {KIT_RELEASE}, not the oracle {PINS.oracle}")
    _served_warm(monkeypatch, warm_sessions)
    if entry.goldens:
        _goldens_copy(tmp_path, monkeypatch)
    monkeypatch.chdir(REPO)
    for step in entry.steps:
        if step.sh:
            done = subprocess.run(shlex.split(step.sh), cwd=REPO, capture_output=True, text=True, encoding="utf-8",
                                  stdin=subprocess.DEVNULL, timeout=1200)
            assert done.returncode == step.status, f"{step.sh}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            continue
        argvs = [shlex.split(step.parity.format(**PLACES))] if step.parity else _made(step)
        for argv in argvs:
            argv = [_moved(a, tmp_path) for a in argv]
            status = _status(argv)
            out, err = capsys.readouterr()
            expected = step.status if argv[0] != "envs" else 0
            assert status == expected, f"parity {shlex.join(argv)}: exit {status}, expected {expected}\n{out[-3000:]}\n{err[-3000:]}"
            assert "Traceback" not in err, err[-3000:]


def _status(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exit_:  # --help
        return exit_.code or 0


def _made(step: Step) -> list[list[str]]:
    """The parity commands `make -n TARGET VARS` prints, the main one narrowed. A pytest run
    (make goldens-check's) must be a suite `make test` collects: not run again here."""
    words = shlex.split(step.make.format(**PLACES))
    done = subprocess.run(["make", "-n", "--no-print-directory", *words], cwd=REPO, capture_output=True, text=True,
                          encoding="utf-8", stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    commands: list[list[str]] = []
    for line in done.stdout.replace("\\\n", " ").splitlines():
        tokens = _command(line.strip())
        if tokens and tokens not in commands:
            commands.append(tokens)
    suites = [c for c in commands if c[0] == ".venv/bin/python"]
    for suite in suites:
        assert suite[1:4] == ["-m", "pytest", "-q"] and set(suite[4:]) <= set(_testpaths()), suite
    parity = [c[1:] for c in commands if c[0] == ".venv/bin/parity"]
    assert parity or suites, f"make -n {step.make} printed no parity command:\n{done.stdout}"
    narrowed = []
    for argv in parity:
        if argv[0] != "envs":
            argv = _dropped(argv, step.drop) + shlex.split(step.add.format(**PLACES))
        narrowed.append(argv)
    return narrowed


def _command(line: str) -> list[str]:
    """A shell line's first command, as words: up to its first ; && || or |."""
    if not line.startswith((".venv/bin/parity ", ".venv/bin/python ")):
        return []
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if word in (";", "&&", "||", "|", "&"):
            break
        words.append(word)
    return words


def _testpaths() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]["testpaths"]


def _dropped(argv: list[str], options: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in options:
            skip = True
        else:
            out.append(word)
    return out


def _moved(word: str, tmp_path: Path) -> str:
    """A path under out/ (or trace.json) in the test's own folder."""
    if word.startswith("out/") or word == "trace.json":
        return str(tmp_path / word)
    return word


def _served_warm(monkeypatch, warm_sessions) -> None:
    """`parity goldens`, `parity run` and `parity fuzz` start their engines as the gate does: a
    pin by the warm session warm_gate lends the gate (a worker of its own, one under coverage.py
    say, starts as it would)."""
    from conformance.commands import run
    from conformance.fuzz import search
    from conformance.gate.context import ENGINE_SESSIONS
    from conformance.process.session import EngineSession
    from conformance.regenerate import lifecycle

    lend = ENGINE_SESSIONS.get()  # warm_gate's

    class Lending(EngineSession):
        """A class still: the fuzzer maps EngineSession.start and .close over its sessions, and
        each must be the session's own (a lent one's leaves the warm engine running)."""

        def __new__(cls, spec, **options):
            if spec.release is not None and spec.argv != warm_sessions(spec.release).spec.argv:
                return EngineSession(spec, **options)
            return lend(spec, **options)

        def start(self, *args, **kwargs):
            return self.start(*args, **kwargs)  # never a Lending: the session's own

        def close(self):
            return self.close()

    for module in (lifecycle, run, search):
        monkeypatch.setattr(module, "EngineSession", Lending)


def _goldens_copy(tmp_path: Path, monkeypatch) -> None:
    """goldens/ as the run writes it: a copy of the goldens of the scenarios the runs name."""
    from conformance.judging import goldens

    root = tmp_path / "goldens"
    for name in ("steady_decode", "prod_deep_midsize", "dflash_27b_gate"):
        shutil.copytree(REPO / "goldens" / name, root / name)
    monkeypatch.setattr(goldens.GOLDENS, "root", root)
