"""The CI examples (ci-examples/*.yml) read by a YAML parser and run here as their CI would run
them: each shard job in a fresh working folder of its own, its commands one by one, its
artifacts handed to the merge job through a store as the CI system's artifact steps hand them;
then the merge, whose exit status must be 0 (the reference engine gated on its declared layers,
its known difference waived). Each shard's `parity envs` must build only the pins its share of
the plan runs.

What this machine changes, and only that: the device is the CPU (no GPU here) and the pins'
environments come from this machine's cache; the CI system's own steps (checkout, Python,
the cache, artifacts) are simulated by `Job.action`.

Both examples run the same three shard gates: the same command line, candidate, layers and
library. A gate is deterministic on the same inputs (the premise `make test` checks on every
golden), so the example that runs a shard's gate second does not run it again: it checks that
its command line and environment are those of the run made, and takes that run's output and
results folder (`SHARD_GATES`). Every other command of both examples runs.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conformance.formats.pins import load_pins
from conformance.formats.settings import cache_root
from conformance.process.envs import env_cache_key
from tests.helpers import KIT_RELEASE, REPO

EXAMPLES = REPO / "ci-examples"
ENGINE = REPO / "engines" / "cpp" / "build" / "reference_engine"
LOCAL = {"VLLM_PARITY_DEVICE": "cpu", "VLLM_PARITY_CACHE": str(cache_root())}
ENVS_LINE = re.compile(r"\[envs\] the plan's share runs (.*?): building")
SHARD_LINE = re.compile(r"\[gate\] shard \d+/\d+: .*\(engines: (.*)\)")
# (argv, the plan's environment) -> the shard gate's finished run and its results folder
SHARD_GATES: dict[tuple, tuple[subprocess.CompletedProcess, Path]] = {}
PLAN_ENV = ("CANDIDATE", "LAYERS", "VLLM_PARITY_DEVICE", "VLLM_PARITY_CACHE")


def load(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))


class Job:
    """One CI job run here: a fresh working folder holding the checkout (every top-level entry
    of the repository but out/, linked), its environment, and the artifact store it shares
    with the other jobs of the run."""

    def __init__(self, folder: Path, store: Path, env: dict):
        folder.mkdir(parents=True)
        for entry in REPO.iterdir():
            if entry.name != "out":
                (folder / entry.name).symlink_to(entry)
        self.cwd, self.store = folder, store
        self.env = {**os.environ, **{k: str(v) for k, v in env.items()}, **LOCAL}
        self.logs: list[tuple[str, subprocess.CompletedProcess]] = []

    def run(self, command: str) -> subprocess.CompletedProcess:
        argv = shlex.split(command)
        shard_gate = argv[:3] == [".venv/bin/parity", "gate", "--shard"]
        key = (tuple(argv), tuple(self.env.get(name) for name in PLAN_ENV))
        if shard_gate and key in SHARD_GATES:  # the other example ran this very gate (above)
            done, results = SHARD_GATES[key]
            shutil.copytree(results, self.cwd / argv[argv.index("--results") + 1])
            self.logs.append((command, done))
            return done
        done = subprocess.run(["bash", "-e", "-c", command], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=1800)
        self.logs.append((command, done))
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if shard_gate:
            SHARD_GATES[key] = (done, self.cwd / argv[argv.index("--results") + 1])
        return done

    def upload(self, name: str, paths: list[Path]) -> None:
        for path in paths:
            target = self.store / name / path.relative_to(self.cwd)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)

    def stderr(self) -> str:
        return "".join(done.stderr for _, done in self.logs)


# --- GitHub Actions --------------------------------------------------------------------------

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def github_expand(text: str, context: dict) -> str:
    """A run line with its ${{ }} expressions replaced; an expression this runner does not
    know fails the test (it would mean the example relies on something not run here)."""
    def value(match):
        assert match[1] in context, f"unknown expression {match[0]} in {text!r}"
        return context[match[1]]
    return EXPRESSION.sub(value, str(text))


def github_job(doc: dict, name: str, folder: Path, store: Path, matrix: dict) -> Job:
    job_doc = doc["jobs"][name]
    context = {"github.workspace": str(folder), **{f"matrix.{k}": str(v) for k, v in matrix.items()}}
    env = {k: github_expand(v, context) for k, v in {**doc.get("env", {}), **job_doc.get("env", {})}.items()}
    context.update({f"env.{k}": v for k, v in {**env, **LOCAL}.items()})
    job = Job(folder, store, env)
    outputs = folder.parent / f"{folder.name}.output"
    job.env["GITHUB_OUTPUT"] = str(outputs)
    job.env["GITHUB_STEP_SUMMARY"] = str(folder.parent / f"{folder.name}.summary.md")
    job.cache_keys, job.context = [], context
    for step in job_doc["steps"]:
        if "if" in step and not github_if(step["if"], context):
            continue
        if "run" in step:
            outputs.write_text("", encoding="utf-8")
            job.run(github_expand(step["run"], context))
            for line in outputs.read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition("=")
                context[f"steps.{step['id']}.outputs.{key}"] = value
            continue
        action, given = step["uses"].split("@")[0], {k: github_expand(v, context) for k, v in step.get("with", {}).items()}
        if action == "actions/upload-artifact":  # the folder's contents, under the artifact's name
            root = folder / given["path"]
            for path in (p for p in root.rglob("*") if p.is_file()):
                target = store / given["name"] / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        elif action == "actions/download-artifact":  # each artifact into path/NAME
            for artifact in sorted(store.iterdir()):
                if fnmatch.fnmatchcase(artifact.name, given["pattern"]):
                    shutil.copytree(artifact, folder / given["path"] / artifact.name)
        elif action == "actions/cache":
            job.cache_keys.append(given["key"])  # this machine's cache stands in for the restore
        else:
            assert action in ("actions/checkout", "actions/setup-python"), action
    return job


def github_if(condition: str, context: dict) -> bool:
    """The `if:` forms the example uses: `${{ !cancelled() }}` (nothing is cancelled here) and
    `steps.ID.outputs.NAME != 'VALUE'`; any other fails the test."""
    condition = EXPRESSION.sub(lambda m: m[1], condition).strip()
    if condition == "!cancelled()":
        return True
    match = re.fullmatch(r"(\S+) (==|!=) '(.*)'", condition)
    assert match and match[1] in context, f"an if: this runner does not know: {condition!r}"
    return (context[match[1]] == match[3]) == (match[2] == "==")


def ported_release_is_the_oracle() -> None:
    """The examples gate the C++ reference engine, a port of vLLM 0.27.1 (KIT_RELEASE): green
    only while that release is the gate oracle."""
    oracle = load_pins().oracle
    if oracle != KIT_RELEASE:
        pytest.skip(f"needs the oracle pin {KIT_RELEASE}: the reference engine ports vLLM {KIT_RELEASE}, "
                    f"so against the oracle {oracle} it diverges (the drafting reservation) and the merge exits 1")


@pytest.mark.oracle
@pytest.mark.xdist_group("ci-examples")  # in one process: the second example reuses SHARD_GATES
def test_the_github_actions_example_goes_green_shard_by_shard(tmp_path, kit):
    ported_release_is_the_oracle()
    doc = load("github-actions.yml")
    store = tmp_path / "artifacts"
    shards = [github_job(doc, "shard", tmp_path / f"shard-{i}", store, {"shard": i})
              for i in doc["jobs"]["shard"]["strategy"]["matrix"]["shard"]]
    gate = github_job(doc, "gate", tmp_path / "gate", store, {})
    check_green(gate.logs[-1][1].stdout, (tmp_path / "gate.summary.md").read_text(encoding="utf-8"))
    shares = [check_builds_only_its_share(shard) for shard in shards]
    for shard, pins in zip(shards, shares):
        key = shard.context["steps.envs.outputs.key"]  # the plan's env key names the cache entry
        assert re.fullmatch(r"\+".join(f"vllm-{re.escape(p)}-cpu-[0-9a-f]{{12}}" for p in pins) or "no-envs", key), key
        assert shard.cache_keys == ([f"vllm-parity-{key}"] if pins else []), shard.cache_keys
    assert [] in shares and any(shares)  # a share of the port's work only builds nothing


# --- Buildkite -------------------------------------------------------------------------------

def buildkite_command(line: str, matrix: str | None) -> str:
    """A command as the agent's shell gets it: {{matrix}} filled in, $$ unescaped."""
    return line.replace("{{matrix}}", matrix or "").replace("$$", "$")


def buildkite_job(doc: dict, step: dict, folder: Path, store: Path, matrix: str | None) -> Job:
    job = Job(folder, store, {**doc.get("env", {}), **step.get("env", {})})
    commands = step["command"] if isinstance(step["command"], list) else [step["command"]]
    for line in commands:
        line = buildkite_command(line, matrix)
        download = re.fullmatch(r'buildkite-agent artifact download "(.+)" (\S+)', line)
        if download:  # what earlier jobs uploaded, at the same paths
            for path in store.rglob("*"):
                relative = path.relative_to(store)
                if path.is_file() and fnmatch.fnmatch(str(Path(*relative.parts[1:])), download[1]):
                    target = folder / download[2] / Path(*relative.parts[1:])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
            continue
        job.run(line)
    pattern = step.get("artifact_paths", "")
    job.upload(folder.name, [p for p in folder.glob(pattern) if p.is_file()] if pattern else [])
    return job


@pytest.mark.oracle
@pytest.mark.xdist_group("ci-examples")
def test_the_buildkite_example_goes_green_shard_by_shard(tmp_path, kit):
    ported_release_is_the_oracle()
    doc = load("buildkite.yml")
    store = tmp_path / "artifacts"
    shard_step = next(s for s in doc["steps"] if "matrix" in s)
    merge_step = doc["steps"][-1]
    shards = [buildkite_job(doc, shard_step, tmp_path / f"shard-{m}", store, m) for m in shard_step["matrix"]]
    merge = buildkite_job(doc, merge_step, tmp_path / "merge", store, None)
    check_green(merge.logs[-1][1].stdout, (tmp_path / "merge" / "out" / "gate" / "annotation.md").read_text(encoding="utf-8"))
    shares = [check_builds_only_its_share(shard) for shard in shards]
    assert [] in shares and any(shares)  # a share of the port's work only builds nothing


def check_green(report: str, summary: str) -> None:
    """The merge passed with the reference engine's known differences waived, and says so."""
    assert report.startswith("== vllm-parity gate: PASS (exit status 0)"), report[:500]
    waivers = load_waivers()
    counts = next(line for line in report.splitlines() if re.match(r"-- \d+ verdicts; ", line))
    # what a port lacks it declares: unsupported, not diverged (the reference engine lacks nothing)
    waived = f", {len(waivers)} waived" if waivers else ""
    assert re.search(rf"; candidate: \d+ pass{waived}(, \d+ unsupported)?; oracle self-check: \d+ pass$", counts), counts
    for waiver in waivers:
        for text in (report, summary):
            assert waiver["owner"] in text and str(waiver["expires"]) in text and waiver["reason"] in text


def load_waivers() -> list[dict]:
    import tomllib

    return tomllib.loads((EXAMPLES / "waivers.toml").read_text(encoding="utf-8")).get("waiver", [])


def check_builds_only_its_share(shard: Job) -> list[str]:
    """The pins `parity envs` built are those of the engines the shard's gate ran, no more."""
    log = shard.stderr()
    built = ENVS_LINE.search(log)[1]
    engines = SHARD_LINE.search(log)[1].split(", ")
    pins = [e.removeprefix("vllm-") for e in engines if e.startswith("vllm-")]
    assert (built.split(", ") if built != "no pin" else []) == pins, (built, engines)
    return pins


# --- what the examples say, read as YAML -----------------------------------------------------

def test_the_examples_merge_with_the_declared_layers_and_the_waiver_after_every_shard():
    gh = load("github-actions.yml")
    gate = gh["jobs"]["gate"]
    assert gate["if"] == "${{ !cancelled() }}" and gate["needs"] == "shard"
    assert not any("always()" in str(s.get("if", "")) for job in gh["jobs"].values() for s in job["steps"])
    assert gh["env"]["LAYERS"] == "config,steps,outputs" and gh["env"]["WAIVERS"] == "ci-examples/waivers.toml"
    cache = next(s for s in gh["jobs"]["shard"]["steps"] if s.get("uses", "").startswith("actions/cache@"))
    assert "steps.envs.outputs.key" in cache["with"]["key"]  # keyed by the env key
    bk = load("buildkite.yml")
    merge = bk["steps"][-1]
    assert merge["agents"]["queue"] and "parity merge" in " ".join(merge["command"])
    assert "--waivers" in " ".join(merge["command"])
    shard = next(s for s in bk["steps"] if "matrix" in s)
    plugin = next(p for p in shard["plugins"] if next(iter(p)).startswith("cache#"))
    assert "{{matrix}}" in next(iter(plugin.values()))["key-extra"]


@pytest.fixture
def kit():
    if not ENGINE.exists():
        pytest.skip("the C++ reference engine is not built (`make cpp`)")


def test_parity_envs_selects_the_pins_of_a_share_and_prints_their_cache_key(capsys, kit):
    from conformance.cli import main

    plan = ["--candidate", f"port={ENGINE}", "--layers", "config,steps,outputs"]
    keys = []
    for shard in ("1/3", "2/3", "3/3"):
        assert main(["envs", "--key", "--shard", shard, *plan]) == 0
        keys.append(capsys.readouterr().out.strip())
    assert keys[-1] == "no-envs"  # the last share holds only the port's work
    pins = load_pins()
    assert keys[:-1] == [env_cache_key([pins.oracle], pins)] * 2, keys  # the oracle's work: its env only
    assert main(["envs", "--key", "--pin", pins.oracle, "--shard", "1/3", *plan]) == 2
    assert "give either --pin or the gate's plan options" in capsys.readouterr().err
