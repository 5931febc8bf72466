"""Running a pin's oracle under coverage.py, and reading what it measured.

coverage.py is installed with the pin environment's own python into a folder of the cache
(`pip install --target`), beside the environment and never into it: the environments' recipe
(and so their cache keys) stays as it is. It is put on the worker's PYTHONPATH only for these
runs, and the worker is started as `python -m coverage run ... worker.py`, so the measured
process is the worker itself, serving the protocol as it always does.

The measured files are the scheduling code a port mirrors (vllm/v1/core/sched/), the budget
resolution in vllm/config/ (scheduler.py, speculative.py, vllm.py) and what the scheduler calls
to decide (the KV cache manager, its coordinator, the single-type managers, the block pool
and its free queue);
which functions of them count is decided by conformance/adequacy/scope.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from conformance.formats.errors import ParityError
from conformance.formats.pins import pin_label
from conformance.formats.log import log
from conformance.formats.settings import cache_root
from conformance.process.envs import WORKER, device_args
from conformance.process.launch import EngineSpec

COVERAGE = "coverage==7.17.3"  # exact pin, installed per pin python, never into the pin env
MEASURED = ("*/vllm/v1/core/sched/*.py", "*/vllm/config/scheduler.py",
            "*/vllm/config/speculative.py", "*/vllm/config/vllm.py",
            # what the scheduler calls to decide: KV cache allocation and the block pool
            "*/vllm/v1/core/kv_cache_manager.py", "*/vllm/v1/core/block_pool.py",
            "*/vllm/v1/core/kv_cache_coordinator.py", "*/vllm/v1/core/single_type_kv_cache_manager.py",
            # the block pool's free queue, the block itself and the prefix hashes
            # (adequacy_scope.toml names the functions that count)
            "*/vllm/v1/core/kv_cache_utils.py",
            # the structured output manager's decisions on a request's grammar
            "*/vllm/v1/structured_output/__init__.py",
            # the encoder cache manager's decisions on a request's multimodal items
            "*/vllm/v1/core/encoder_cache_manager.py")


class CoverageError(ParityError, RuntimeError):
    """coverage.py could not be installed or could not report; the message says which step."""


def ensure_coverage(python: Path, log=log) -> Path:
    """The folder holding coverage.py for this pin python, installed on first use."""
    version = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, check=True, encoding="utf-8", errors="replace").stdout.strip()
    final = cache_root() / "adequacy" / f"{COVERAGE.replace('==', '-')}-py{version}"
    if (final / "READY").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    log(f"[adequacy] installing {COVERAGE} for python {version} into {final}")
    argv = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
            "--quiet", "--target", str(tmp), COVERAGE]
    result = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, encoding="utf-8", errors="replace")
    if result.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CoverageError(f"installing {COVERAGE} failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}")
    (tmp / "READY").write_text(COVERAGE + "\n", encoding="utf-8")
    if not (final / "READY").exists():  # another run may have finished first
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def write_rcfile(folder: Path, patterns=MEASURED) -> Path:
    """coverage.py's settings: line and branch coverage of the measured files only."""
    rc = folder / "coveragerc"
    rc.write_text("[run]\nbranch = True\ninclude =\n" + "".join(f"    {p}\n" for p in patterns), encoding="utf-8")
    return rc


def measured_worker(release: str, python: Path, coverage_dir: Path, rcfile: Path,
                    data_file: Path) -> EngineSpec:
    """The pin's worker, started under coverage.py: an argv list (env sets PYTHONPATH for this
    process alone; nothing goes through a shell)."""
    env = shutil.which("env") or "/usr/bin/env"
    argv = (env, f"PYTHONPATH={coverage_dir}", str(python), "-m", "coverage", "run",
            f"--rcfile={rcfile}", f"--data-file={data_file}", str(WORKER), "--release", release, *device_args())
    return EngineSpec(f"{pin_label(release)}+coverage", argv)


def json_report(python: Path, coverage_dir: Path, rcfile: Path, data_file: Path) -> dict:
    """coverage.py's JSON report (per file, per function: executed and missing lines and
    branches), written by the pin's python, which can parse the pin's sources."""
    out = data_file.with_suffix(".json")
    argv = [str(python), "-m", "coverage", "json", f"--rcfile={rcfile}", f"--data-file={data_file}",
            "-o", str(out), "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(coverage_dir))
    result = subprocess.run(argv, capture_output=True, env=env, stdin=subprocess.DEVNULL,
                            encoding="utf-8", errors="replace")
    if result.returncode != 0 or not out.exists():
        raise CoverageError(f"coverage json failed for {data_file}:\n{result.stdout[-1500:]}{result.stderr[-1500:]}")
    return json.loads(out.read_text(encoding="utf-8"))


GUIDED_WORKER = WORKER.parent / "coverage_worker.py"


def guided_worker(release: str, python: Path, coverage_dir: Path, arcs_file: Path,
                  patterns=MEASURED) -> EngineSpec:
    """The pin's worker under coverage.py (engines/vllm/coverage_worker.py), appending after
    each run the branch arcs it reached for the first time to `arcs_file` (parity fuzz
    --guide coverage)."""
    env = shutil.which("env") or "/usr/bin/env"
    argv = (env, f"PYTHONPATH={coverage_dir}", str(python), str(GUIDED_WORKER), f"--arcs={arcs_file}",
            f"--include={','.join(patterns)}", "--release", release, *device_args())
    return EngineSpec(pin_label(release), argv, release)


class BranchesReached:
    """The branch arcs a guided worker reported, read as its file grows (a restarted worker
    appends to the same file): how many are new after each example, and how many in all."""

    def __init__(self, path: Path):
        self.path = path
        self.arcs: set[tuple[str, int, int]] = set()
        self.reached = 0  # distinct branch arcs the last run reached, new or not
        self._offset = 0

    def new(self) -> int:
        """Branch arcs reached for the first time since the last call."""
        if not self.path.exists():
            return 0
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            text = f.read()
        complete = text[:text.rfind(b"\n") + 1]  # a line is read once it is whole
        self._offset += len(complete)
        before = len(self.arcs)
        for line in complete.decode().splitlines():
            entry = json.loads(line)
            self.reached = entry.get("reached", 0)
            for name, arcs in entry["branches"].items():
                self.arcs.update((name, a, b) for a, b in arcs)
        return len(self.arcs) - before
