"""A pin's dependencies, resolved against its own metadata.

On CPU a pin's environment installs requirements-cpu.txt (the import set the suite's CPU path
needs), then vLLM itself with --no-deps: vLLM's wheel pins a CUDA torch and GPU kernels. So
nothing at install time compares what vLLM's metadata asks for with what was installed. This
module does, from the wheel the recipe installs (`Requires-Dist` in its METADATA, markers
evaluated for Linux x86_64 and this Python, no extras): every requirement is either pinned by
the recipe at a version inside its range, or named in requirements-cpu-left-out.toml with the
reason the CPU path does without it. Anything else is a conflict, named package by package.
A requirement's extras (`fastapi[standard]`) are not followed: the recipe pins the package.
"""

from __future__ import annotations

import re
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from conformance.formats.files import shown
from conformance.formats.pins import REPO_ROOT, Pins

LEFT_OUT = REPO_ROOT / "engines" / "vllm" / "requirements-cpu-left-out.toml"
# The platform every environment is built for (envs.py); markers are judged for it, not for
# whatever machine runs the check.
TARGET = {"python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
          "python_full_version": f"{sys.version_info.major}.{sys.version_info.minor}.0",
          "platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux",
          "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython",
          "extra": ""}


class DependencyError(ValueError):
    """A wheel's metadata, the CPU lock or the left-out list cannot be read."""


@dataclass(frozen=True)
class Conflict:
    """One requirement of the pin's metadata the CPU recipe does not meet."""

    package: str
    required: str  # as the metadata says it, e.g. "transformers<5.20.0,>=5.16.1"
    locked: str | None  # the version the recipe installs, None when it installs none
    why: str

    def describe(self) -> str:
        return f"{self.package}: {self.why}"


@dataclass(frozen=True)
class Metadata:
    """The distribution a wheel installs and what it requires."""

    name: str
    version: str
    requires: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.name}=={self.version}"


def wheel_metadata(wheel: Path) -> Metadata:
    """The METADATA of a wheel (or of an installed `*.dist-info` folder)."""
    try:
        if Path(wheel).is_dir():
            text = (Path(wheel) / "METADATA").read_text(encoding="utf-8")
        else:
            with zipfile.ZipFile(wheel) as archive:
                name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
                text = archive.read(name).decode("utf-8")
    except (OSError, StopIteration, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise DependencyError(f"{wheel}: no readable METADATA: {exc!r}") from None
    message = Parser().parsestr(text)
    return Metadata(message["Name"], message["Version"], tuple(message.get_all("Requires-Dist") or ()))


def recipe_versions(pins: Pins, engine: bool) -> dict[str, str]:
    """What the CPU recipe installs, by canonical name: requirements-cpu.txt, the whole
    engine's extras where a rebuild is installed, and the CPU build of torch."""
    lines = [(pins.cpu_requirements, line) for line in pins.cpu_requirements.read_text(encoding="utf-8").splitlines()]
    lines += [("[tool.vllm-parity] engine-requirements", line) for line in pins.engine_requirements] if engine else []
    versions = {}
    for source, line in lines:
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            req = Requirement(text)
            (spec,) = req.specifier
        except (InvalidRequirement, ValueError):
            raise DependencyError(f"{shown(source)}: expected NAME==VERSION, got {text!r}") from None
        if spec.operator != "==":
            raise DependencyError(f"{shown(source)}: expected NAME==VERSION, got {text!r}")
        versions[canonicalize_name(req.name)] = spec.version
    versions["torch"] = f"{pins.cpu_torch}+cpu"  # the CPU build: from the machine's wheels or the CPU index
    return versions


def left_out(engine: bool, path: Path = LEFT_OUT) -> dict[str, str]:
    """Requirements the recipe does without, by canonical name, with the reason: the
    `official-wheel-on-cpu` ones (whatever version the recipe has) count only where the official
    wheel is installed."""
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DependencyError(f"{shown(path)}: cannot read the left-out list: {exc}") from None
    unknown = set(table) - {"left-out", "official-wheel-on-cpu"}
    if unknown:
        raise DependencyError(f"{shown(path)}: unknown table(s) {sorted(unknown)}")
    sections = ["left-out"] + ([] if engine else ["official-wheel-on-cpu"])
    out = {}
    for section in sections:
        for name, reason in table.get(section, {}).items():
            if not isinstance(reason, str) or not reason.strip():
                raise DependencyError(f"{shown(path)}: [{section}] {name} needs its reason as a string")
            out[canonicalize_name(name)] = reason
    return out


def conflicts(metadata: Metadata, pins: Pins, engine: bool) -> list[Conflict]:
    """Every requirement of `metadata` that the CPU recipe does not meet (engine: the rebuild,
    which runs the whole engine, is installed; else the official wheel, whose scheduler runs)."""
    versions, without = recipe_versions(pins, engine), left_out(engine)
    # the official wheel's engine does not run here: its torch and GPU kernels do not apply
    not_applying = set(without) - set(left_out(True))
    found = []
    for text in metadata.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise DependencyError(f"{metadata.label}: unreadable Requires-Dist {text!r}: {exc}") from None
        if req.marker is not None and not req.marker.evaluate(TARGET):
            continue
        name = canonicalize_name(req.name)
        spec = f"{req.name}{req.specifier}"
        if name in not_applying:
            continue
        if name in versions:
            if not _inside(versions[name], req):
                found.append(Conflict(name, spec, versions[name], (
                    f"{metadata.label} requires {spec}; the CPU recipe installs {name}=={versions[name]} "
                    f"({shown(pins.cpu_requirements) if name != 'torch' else 'cpu-torch in pyproject.toml'})")))
        elif name not in without:
            found.append(Conflict(name, spec, None, (
                f"{metadata.label} requires {spec}; neither {shown(pins.cpu_requirements)} pins it nor "
                f"{shown(LEFT_OUT)} says why the CPU path does without it")))
    return found


def _inside(version: str, req: Requirement) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


_MISSING = re.compile(r"No module named '([A-Za-z0-9_.]+)'")


def missing_module(output: str, site_packages: Path) -> str:
    """What a failed import check or warm-up says about a module the CPU path imports and the
    recipe left out: the module, where vLLM imports it, and the requirement of the installed
    vLLM's metadata that provides it ("" when the output names no missing module)."""
    missing = _MISSING.search(output)
    if missing is None:
        return ""
    module = missing[1]
    dist = next(iter(sorted(site_packages.glob("vllm*.dist-info"))), None)
    metadata = wheel_metadata(dist) if dist is not None else None
    req = _providing(module, metadata) if metadata is not None else None
    where = _importer(output)
    if req is None:
        return f"the CPU path imports {module}{where}, which no requirement of vLLM's metadata provides"
    return (f"{req.name}: {metadata.label} imports {module}{where} on the CPU path, and {req} (its Requires-Dist) "
            f"is left out of requirements-cpu.txt: pin it there (and take it off {shown(LEFT_OUT)})")


def _providing(module: str, metadata: Metadata) -> Requirement | None:
    """The requirement whose distribution provides top-level `module` (by name: a distribution
    `compressed-tensors` provides `compressed_tensors`)."""
    top = canonicalize_name(module.split(".")[0])
    for text in metadata.requires:
        req = Requirement(text)
        if canonicalize_name(req.name) == top and (req.marker is None or req.marker.evaluate(TARGET)):
            return Requirement(f"{req.name}{req.specifier}")
    return None


def _importer(stderr: str) -> str:
    """` (imported by vllm/x/y.py)`: the last frame of vLLM's own code in the traceback."""
    frames = re.findall(r'File "[^"]*?/site-packages/(vllm/[^"]+)"', stderr)
    return f" (imported by {frames[-1]})" if frames else ""

