"""(e) (f) (g) The three times the project holds itself to (issue "A fast, clean house"), each
measured by running the command itself, once, on this machine:

  (e) `make test` with the pin environments built                       goal: 120 s
  (f) the README's test command on a fresh machine: a fresh clone of HEAD, an empty
      VLLM_PARITY_CACHE and an empty pip cache, so every wheel is downloaded again   goal: 8 min
  (g) `make parity` with the environments built: the layers that need no model  goal: 20 s,
      and the engine layers' cost stated separately (the whole gate minus those layers)
  (j) `make parity` on a fresh machine (fresh clone, empty caches: set-up, environments and
      a cold gate)                                                      goal: 4 min,
      and that cold gate against the same gate run again, warm          goal: at most 2x

(f) and (j) take minutes and download about 1 GB each: BENCH_FRESH=0 leaves them out (it then
says so).

--quick (`make bench BENCH_QUICK=1`, run by tests/house/test_doc_commands.py): `make envs` alone, (e),
(f), (g) and (j) left out (each a whole make test or gate run), to check that it runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_MODEL_LAYERS = "config,steps,outputs,methods"


def timed(argv: list[str], cwd: Path, env: dict | None = None) -> float:
    """Seconds the command took; its output goes to a log whose tail is shown if it fails."""
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
        if done.returncode not in (0, 1):  # the gate's 1 (a divergence) is still a timed run
            log.seek(0)
            tail = log.read().decode("utf-8", "replace").splitlines()[-20:]
            sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n" + "\n".join(tail))
    return seconds


def verdict(seconds: float, goal: float) -> str:
    return f"within the goal of {goal:.0f} s" if seconds <= goal else f"OVER the goal of {goal:.0f} s by {seconds - goal:.0f} s"


def main() -> None:
    make = ["make", "--no-print-directory"]
    parity = [str(REPO / ".venv" / "bin" / "parity"), "gate"]
    timed(make + ["envs"], REPO)  # built before anything is timed
    if "--quick" in sys.argv[1:]:  # each is a whole make test or gate run: minutes
        print("(e) (f) (g) (j): left out (--quick)")
        return

    seconds = timed(make + ["test"], REPO)
    print(f"(e) make test, environments built: {seconds:.0f} s, {verdict(seconds, 120)}")

    if os.environ.get("BENCH_FRESH", "1") == "0":
        print("(f) fresh machine: left out (BENCH_FRESH=0)")
        print("(j) make parity on a fresh machine: left out (BENCH_FRESH=0)")
    else:
        with fresh_clone() as (clone, env):
            seconds = timed(make + ["test"], clone, env)
        print(f"(f) make test on a fresh machine (fresh clone of HEAD, empty caches): "
              f"{seconds / 60:.1f} min, {verdict(seconds, 480)}")
        fresh_parity(make)

    no_model = timed(parity + ["--layers", NO_MODEL_LAYERS], REPO)
    whole = timed(parity, REPO)
    print(f"(g) make parity, environments built: layers without a model ({NO_MODEL_LAYERS}) "
          f"{no_model:.0f} s, {verdict(no_model, 20)}; the whole gate {whole:.0f} s, so the "
          f"engine layers cost {whole - no_model:.0f} s more")


@contextlib.contextmanager
def fresh_clone():
    """A fresh clone of HEAD with empty caches (the uv cache lives in VLLM_PARITY_CACHE):
    (the clone's folder, the environment to run it with)."""
    with tempfile.TemporaryDirectory(prefix="parity-fresh-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        yield clone, dict(os.environ, VLLM_PARITY_CACHE=str(Path(tmp) / "cache"),
                          PIP_CACHE_DIR=str(Path(tmp) / "pip-cache"))


def fresh_parity(make: list[str]) -> None:
    """(j): `make parity` in a fresh clone, timed as its two halves (set-up with the
    environments, then the cold gate), then the gate again, warm."""
    with fresh_clone() as (clone, env):
        envs = timed(make + ["envs"], clone, env)
        gate = [str(clone / ".venv" / "bin" / "parity"), "gate"]
        cold = timed(gate, clone, env)
        warm = timed(gate, clone, env)
    total = envs + cold
    print(f"(j) make parity on a fresh machine (fresh clone of HEAD, empty caches): "
          f"{total / 60:.1f} min ({envs:.0f} s set-up and environments, {cold:.0f} s cold gate), "
          f"{verdict(total, 240)}; the cold gate is {cold / warm:.1f}x the warm one ({warm:.0f} s), "
          + ("within the goal of 2x" if cold <= 2 * warm else "OVER the goal of 2x"))


if __name__ == "__main__":
    main()
