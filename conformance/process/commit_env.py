"""The environment of a pinned upstream commit (formats/pins.py CommitPin).

On CPU, vLLM's Python-only approach (its precompiled install reuses a nearby build's compiled
libraries under a commit's Python tree): the base release's CPU build, copied (hard links: no
second torch), with the commit's `vllm/` tree laid over its `vllm/` package. What the base build
made and git does not track stays (its compiled `*.so`, the generated `vllm/_version.py`); every
other file of the package is the commit's. Then, before the environment is used:
  - fidelity, file by file: the package's Python sources equal the commit's tree (the
    generated files aside); anything else refuses the build (`check_overlay`);
  - dependencies: the requirement lines the commit adds to requirements/common.txt and cpu.txt
    since the base tag, each checked against what the environment holds and installed by uv
    where it does not satisfy them; one uv cannot install is named, and refuses the build;
  - compiled inputs: files under csrc/ or cmake/, CMakeLists.txt, or setup.py's extension list
    changed between the base tag (v<base>) and the commit. The base build's kernels are then not
    the commit's: the environment records the files, and its worker refuses the engine layers
    (`unsupported`, naming them). The stand-in layers, pure Python, still run.
What was found is COMMIT.json in the environment: the goldens' provenance (environment.commit).

On a GPU the commit's own per-commit wheel, from the index its URL template names
(`commit-wheel-index`, vLLM's per-commit index by default), locked like a release's
(`parity envs --lock-gpu --pin SHA12`), installed from the lock: the whole engine is the commit's.

A source is a local repository (a path, or file://) read in place, or a git URL mirrored once
into the cache (sources/). Nothing runs through a shell.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from conformance.formats.errors import InputError
from conformance.formats.log import log
from conformance.formats.pins import CommitPin, Pins
from conformance.formats.settings import cache_root
from conformance.process.fidelity import EXCLUDED, Fidelity, SourceTree, compare_trees
from conformance.process.progress import duration, heartbeat

COMMIT_RECIPE = 1  # bump when the overlay steps change, so cached commit environments are rebuilt
COMPILED = ("csrc/", "cmake/", "CMakeLists.txt")
# setup.py decides what is compiled only through its extension list
EXTENSION_LINE = re.compile(r"(ext_modules|Extension\(|CMakeExtension|_build_custom_ops|_is_cpu\(\))")
REQUIREMENTS = ("requirements/common.txt", "requirements/cpu.txt")
# Made by the base build, tracked by no commit: kept under the overlay, left out of fidelity
GENERATED = ("vllm/_version.py",)
BUILT = (".so",)
COMMIT_FILE = "COMMIT.json"


class CommitError(InputError):
    """A commit's source, tree or environment is not what its pin says (exit 2, named)."""


def git(repo: Path, *args: str, binary: bool = False):
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise CommitError(f"git {' '.join(args)} in {repo}: {result.stderr.decode('utf-8', 'replace').strip()}")
    return result.stdout if binary else result.stdout.decode("utf-8", "replace")


def local_repo(source: str, base: str, log=log, want: str | None = None) -> Path:
    """The repository a source names: a local one in place, a URL's mirror in the cache
    (fetched again when it lacks `want`); CommitError unless it has the base's tag v<base>."""
    local = CommitPin("0" * 40, base, source).source_path()
    if local is not None:
        if not local.exists():
            raise CommitError(f"the source {source} does not exist ({local})")
        repo = local
    else:
        repo = cache_root() / "sources" / (hashlib.sha256(source.encode()).hexdigest()[:16] + ".git")
        if not repo.exists():
            with heartbeat(log, f"[envs] mirroring {source} into {repo}"):
                subprocess.run(["git", "clone", "--mirror", "--quiet", source, str(repo)], check=False,
                               stdin=subprocess.DEVNULL, capture_output=True)
        if want is not None and not _has(repo, want):
            subprocess.run(["git", "-C", str(repo), "fetch", "--quiet", "--tags", "origin"],
                           stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if not _has(repo, f"v{base}"):
        raise CommitError(f"{source} has no tag v{base} (the base release), so the files changed since "
                          "the base cannot be told")
    return repo


def source_repo(pin: CommitPin, log=log) -> Path:
    """The repository holding the pin's commit and its base's tag."""
    repo = local_repo(pin.source, pin.base, log, want=pin.commit)
    if not _has(repo, pin.commit):
        raise CommitError(f"{pin.label}: {pin.source} has no commit {pin.commit}")
    return repo


def _has(repo: Path, rev: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, stdin=subprocess.DEVNULL).returncode == 0


def extract_tree(repo: Path, commit: str, into: Path) -> Path:
    """The commit's `vllm/` tree written under `into` (git archive, read as data: no link or
    path leaves `into`). Returns `into`."""
    archive = git(repo, "archive", "--format=tar", commit, "vllm/", binary=True)
    with tarfile.TarFile(fileobj=io.BytesIO(archive)) as tar:  # an uncompressed tar, binary
        tar.extractall(into, filter="data")
    return into


def tree_id(repo: Path, commit: str) -> str:
    """The git tree of the commit's vllm/: what the overlay is, by content."""
    return git(repo, "rev-parse", f"{commit}:vllm").strip()


def compiled_inputs_changed(repo: Path, base: str, commit: str) -> list[str]:
    """Compiled inputs changed between v<base> and the commit (setup.py where its extension
    list changed), in path order."""
    changed = git(repo, "diff", "--name-only", f"v{base}", commit, "--", *COMPILED).split()
    setup = git(repo, "diff", "-U0", f"v{base}", commit, "--", "setup.py")
    if any(line[:1] in "+-" and not line.startswith(("+++", "---")) and EXTENSION_LINE.search(line)
           for line in setup.splitlines()):
        changed.append("setup.py (its extension list)")
    return sorted(changed)


def changed_files(repo: Path, commit: str) -> list[str]:
    """The files a commit changes against its first parent (all of them for a root commit)."""
    parents = git(repo, "rev-list", "--parents", "-n", "1", commit).split()[1:]
    if not parents:
        return git(repo, "ls-tree", "-r", "--name-only", commit).split()
    return git(repo, "diff", "--name-only", parents[0], commit).split()


def requirement_changes(repo: Path, base: str, commit: str) -> list[Requirement]:
    """The requirement lines of REQUIREMENTS the commit has and v<base> has not."""
    def lines(rev: str) -> set[str]:
        out = set()
        for name in REQUIREMENTS:
            try:
                text = git(repo, "show", f"{rev}:{name}")
            except CommitError:
                continue
            out |= {line.split("#")[0].strip() for line in text.splitlines()}
        return {line for line in out if line and not line.startswith("-")}
    added = sorted(lines(commit) - lines(f"v{base}"))
    out = []
    for line in added:
        try:
            out.append(Requirement(line))
        except InvalidRequirement as exc:
            raise CommitError(f"{commit[:12]}: requirement {line!r} cannot be read: {exc}") from None
    return out


def unsatisfied(requirements: list[Requirement], freeze: str) -> list[str]:
    """The requirements the environment's packages (uv's freeze) do not satisfy, each with what
    it holds: 'numba>=0.70 (the environment has numba 0.65.0)'."""
    held = {}
    for line in freeze.splitlines():
        name, _, version = line.partition("==")
        if version:
            held[canonicalize_name(name)] = version.strip()
    out = []
    for req in requirements:
        if req.marker is not None and not req.marker.evaluate():
            continue
        have = held.get(canonicalize_name(req.name))
        if have is None or (req.specifier and not req.specifier.contains(have, prereleases=True)):
            out.append(f"{req} (the environment has {req.name} {have or 'not installed'})")
    return out


class _Package(SourceTree):
    """A package's compared files, the base build's generated files left out."""

    def names(self) -> set[str]:
        return {n for n in super().names() if n not in GENERATED}


def check_overlay(site: Path, tree: Path, label: str) -> Fidelity:
    """The environment's `vllm/` Python sources (under `site`) against the commit's tree (under
    `tree`), file by file: equal, or CommitError naming each file that differs."""
    fidelity = compare_trees(_Package(site), _Package(tree), f"the environment of {label}",
                             f"{label}'s tree", release=label, allowlist=())
    if not fidelity.equal:
        raise CommitError(f"refusing the overlay of {label}: {fidelity.explain()}")
    return fidelity


def overlay(site: Path, tree: Path) -> int:
    """Replace the package `site/vllm` by the commit's tree, keeping what the base build made
    (GENERATED, BUILT, and the GPU kernel packages a build vendors: fidelity's EXCLUDED). Files are unlinked, never written in place: the copy's files are hard
    links to the base environment's. Returns the number of files laid."""
    package = site / "vllm"
    for path in sorted(package.rglob("*"), reverse=True):
        rel = path.relative_to(site).as_posix()
        if path.is_dir() and not path.is_symlink():
            if path.name == "__pycache__":
                shutil.rmtree(path)
            continue
        if rel not in GENERATED and not rel.endswith(BUILT) and not rel.startswith(EXCLUDED):
            path.unlink()
    count = 0
    for src in sorted((tree / "vllm").rglob("*")):
        if src.is_dir():
            continue
        dest = site / src.relative_to(tree)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.unlink()
        shutil.copyfile(src, dest)
        count += 1
    return count


def build_cpu(pin: CommitPin, base_python: Path, final: Path, tools, environ: dict, worker: Path, log=log) -> None:
    """Build the commit's CPU environment in `final` from the base release's (`base_python`);
    `tools`: envs.build_tools() (uv, find-links), `environ`: uv's, `worker`: the worker script."""
    started = time.monotonic()
    repo = source_repo(pin, log)
    base_env = base_python.parent.parent
    tmp = final.with_name(final.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"[envs] building {pin.label} (cpu): vllm {pin.base}'s build with the commit's vllm/ laid over it, in {final}")
    with heartbeat(log, f"[envs] {pin.label}: phase 1/4: copy vllm {pin.base}'s environment (hard links)"):
        subprocess.run(["cp", "-al", str(base_env), str(tmp)], check=True, stdin=subprocess.DEVNULL)
        # written below, never through the base's inode; the base's fidelity record (its rebuild
        # against the official wheel) no longer describes the package: the overlay's does
        for name in ("READY", COMMIT_FILE, "FIDELITY.json"):
            (tmp / name).unlink(missing_ok=True)
    site = next(tmp.glob("lib/python*/site-packages"))
    with tempfile.TemporaryDirectory(prefix="vllm-commit-") as scratch:
        with heartbeat(log, f"[envs] {pin.label}: phase 2/4: lay the commit's vllm/ tree over the package, "
                            "check it file by file"):
            tree = extract_tree(repo, pin.commit, Path(scratch))
            laid = overlay(site, tree)
            fidelity = check_overlay(site, tree, pin.label)
        freeze = (base_env / "READY").read_text(encoding="utf-8")
        missing = unsatisfied(requirement_changes(repo, pin.base, pin.commit), freeze)
        if missing:
            with heartbeat(log, f"[envs] {pin.label}: phase 3/4: uv pip install the commit's changed "
                                f"requirements: {', '.join(missing)}"):
                wanted = [m.split(" (")[0] for m in missing]
                result = subprocess.run([tools.uv, "pip", "install", "--no-progress", "--python",
                                         str(tmp / "bin" / "python"), *tools.find_links, *wanted],
                                        capture_output=True, text=True, encoding="utf-8", env=environ,
                                        stdin=subprocess.DEVNULL)
            if result.returncode != 0:
                raise CommitError(f"{pin.label}: the commit's requirements cannot be installed over vllm "
                                  f"{pin.base}'s environment: {', '.join(missing)}:\n{result.stderr[-2000:]}")
    compiled = compiled_inputs_changed(repo, pin.base, pin.commit)
    record = {"commit": pin.commit, "pin": pin.name, "base": pin.base,
              "overlay": {"files": laid, "tree": tree_id(repo, pin.commit),
                          "compared_files": fidelity.compared, "equal": fidelity.equal},
              "compiled_inputs_changed": compiled, "dependencies": missing}
    (tmp / COMMIT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    with heartbeat(log, f"[envs] {pin.label}: phase 4/4: import check (the worker, on the commit's tree)"):
        _import_check(final / "bin" / "python", pin, worker)
    freeze = subprocess.run([tools.uv, "pip", "freeze", "--python", str(final / "bin" / "python")],
                            env=environ, capture_output=True, check=True, text=True, encoding="utf-8").stdout
    (final / "READY").write_text(freeze, encoding="utf-8")
    said = f"; compiled inputs changed since v{pin.base}: {', '.join(compiled)}" if compiled else ""
    log(f"[envs] {pin.label} ready ({laid} files laid, {fidelity.compared} sources equal to the commit's)"
        f"{said}, built in {duration(time.monotonic() - started)}")


def _import_check(python: Path, pin: CommitPin, worker: Path) -> None:
    """The worker starts on the commit's tree and says hello (vLLM imported, its scheduler too)."""
    result = subprocess.run([str(python), str(worker), "--release", pin.name, "--device", "cpu"],
                            input=b"", capture_output=True, timeout=600)
    if b'"hello"' not in result.stdout:
        raise CommitError(f"{pin.label}: the worker does not start on the commit's tree:\n"
                       f"{result.stdout.decode('utf-8', 'replace')[-1500:]}{result.stderr.decode('utf-8', 'replace')[-3000:]}")


def write_wheel_record(env: Path, pin: CommitPin, lock: str) -> None:
    """COMMIT.json of a commit's per-commit wheel environment (a GPU's): the commit, its base,
    the wheel's version from the lock; no overlay, its compiled code is the commit's own."""
    version = next((line.split("==", 1)[1].split()[0] for line in lock.splitlines() if line.startswith("vllm==")), None)
    if version is None:
        raise CommitError(f"{pin.label}: its GPU lock pins no vllm")
    check_gpu_lock(pin, version)
    record = {"commit": pin.commit, "pin": pin.name, "base": pin.base, "wheel": f"vllm=={version}",
              "overlay": None, "compiled_inputs_changed": [], "dependencies": []}
    (env / COMMIT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_record(env: Path) -> dict | None:
    path = env / COMMIT_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def no_engine_reason(record: dict | None) -> str | None:
    """Why a commit environment's worker refuses the engine layers: its compiled inputs changed."""
    if not record or not record.get("compiled_inputs_changed"):
        return None
    files = record["compiled_inputs_changed"]
    shown = ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
    return (f"vllm@{record['pin']} changes compiled inputs since v{record['base']} ({shown}): vllm "
            f"{record['base']}'s CPU build does not run its kernels; a GPU runner with the commit's "
            "per-commit wheel serves its engine layers")


# --- GPU: the per-commit wheel --------------------------------------------------------------


def index_url(pin: CommitPin, pins: Pins) -> str:
    return pins.commit_index.format(commit=pin.commit)


def gpu_index_args(pin: CommitPin, pins: Pins) -> list[str]:
    """The per-commit index, searched before the default one (uv's first-index strategy: vllm
    comes from the commit's index, never a release of the default index)."""
    return ["--extra-index-url", index_url(pin, pins)]


def check_gpu_lock(pin: CommitPin, vllm_version: str) -> None:
    """A per-commit wheel's version names its commit (vLLM's `+g<sha>` local version)."""
    local = vllm_version.partition("+")[2]
    if not any(part.startswith("g") and pin.commit.startswith(part[1:]) and len(part) > 7
               for part in re.split(r"[.]", local)):
        raise CommitError(f"{pin.label}: the per-commit index gave vllm {vllm_version}, whose version names "
                          f"no commit {pin.commit[:9]} (+g<sha>): not the commit's wheel")
