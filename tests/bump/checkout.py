"""A copy of the checkout, and `parity bump` run in it as its own code runs it
(tests/bump/test_bump.py, tests/bisect/test_commit_pins.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def checkout_copy(tmp_path: Path) -> Path:
    """The checkout's files (tracked and new, as git lists them) in a folder of their own."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode("utf-8").split("\0")
    copy = tmp_path / "checkout"
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def bump(copy: Path, release: str, *more: str) -> subprocess.CompletedProcess:
    """`parity bump` as the copy's own code runs it (its conformance/ first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run([sys.executable, "-m", "conformance.cli", "bump", release, *more], cwd=copy, env=env,
                          capture_output=True, text=True, encoding="utf-8", timeout=1800)
