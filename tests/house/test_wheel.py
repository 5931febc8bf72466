"""The wheel: built from the checkout's sources, installed in a fresh venv, its `parity` runs
(every stage package is in it, and it finds the checkout it works in from the working folder)."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from conformance.formats.pins import REPO_ROOT, load_pins

UV = Path(sys.executable).with_name("uv")  # a pinned dependency of the harness
GOLDEN = REPO_ROOT / "goldens" / "steady_decode" / f"vllm-{load_pins().oracle}.json"


def _run(argv, cwd, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, encoding="utf-8", timeout=600, **kw)


def test_a_wheel_runs_parity_in_a_fresh_venv(tmp_path):
    source = tmp_path / "source"  # the sources only: no build/ left by an earlier build can leak in
    source.mkdir()
    shutil.copy(REPO_ROOT / "pyproject.toml", source / "pyproject.toml")
    shutil.copytree(REPO_ROOT / "conformance", source / "conformance", ignore=shutil.ignore_patterns("__pycache__"))
    built = _run([str(UV), "build", "--wheel", "-q", str(source), "-o", str(tmp_path / "dist")], tmp_path)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("vllm_parity-*.whl"))

    venv = tmp_path / "fresh"
    for argv in ([str(UV), "venv", "-q", str(venv), "--python", sys.executable],
                 [str(UV), "pip", "install", "-q", "--no-deps", "--python", str(venv / "bin" / "python"), str(wheel)]):
        done = _run(argv, tmp_path)
        assert done.returncode == 0, done.stderr
    # The harness's dependencies (deepdiff, uv) lent from this venv's site-packages, offline; a
    # path in a .pth file is not a site folder, so this checkout's editable install is not seen.
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "harness_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    parity = str(venv / "bin" / "parity")

    where = _run([str(venv / "bin" / "python"), "-c", "import conformance.gate.run as m; print(m.__file__)"], tmp_path)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr

    helped = _run([parity, "gate", "--help"], tmp_path)
    assert helped.returncode == 0 and "--candidate" in helped.stdout, helped.stderr

    compared = _run([parity, "compare", "--trace", str(GOLDEN), "--golden", str(GOLDEN)], REPO_ROOT / "docs")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "steady_decode" in compared.stdout

    outside = _run([parity, "compare", "--trace", str(GOLDEN), "--golden", str(GOLDEN)], tmp_path)
    assert outside.returncode == 2, outside.stdout + outside.stderr
    assert "pyproject.toml" in outside.stderr and "Traceback" not in outside.stderr
