"""The harness's settings read from the environment, each decided in one place: the
cache root ($VLLM_PARITY_CACHE: the pins' environments, the tiny models' weights, uv's cache,
the adequacy results) and the device ($VLLM_PARITY_DEVICE, else a working `nvidia-smi` that
lists a GPU). Standard library only: a pin's worker and its layers read them in vLLM's
environment.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from conformance.formats.errors import InputError


class SettingError(InputError):
    """A setting read from the environment holds a value the harness cannot use."""


DEVICES = ("cpu", "gpu")


def cache_root() -> Path:
    # absolute: a relative $VLLM_PARITY_CACHE (a CI cache step's folder in the checkout) names
    # the same folder for every engine process, whatever its working directory
    return Path(os.environ.get("VLLM_PARITY_CACHE", Path.home() / ".cache" / "vllm-parity")).absolute()


def device_mode() -> str:
    """The one device decision: 'gpu' or 'cpu'. It picks a pin environment's recipe, and is
    passed to every worker (device_args), which boots vLLM on that platform; nothing else
    decides it. $VLLM_PARITY_DEVICE wins; else a working `nvidia-smi` listing a GPU means 'gpu'.
    Made once per process for a given setting (the nvidia-smi call is not repeated)."""
    return _device_mode(os.environ.get("VLLM_PARITY_DEVICE", ""), os.environ.get("PATH", ""))


@functools.cache
def _device_mode(setting: str, path: str) -> str:
    if setting:
        if setting not in DEVICES:
            raise SettingError(f"VLLM_PARITY_DEVICE must be 'cpu' or 'gpu', not {setting!r}")
        return setting
    return "gpu" if has_gpu() else "cpu"


def nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def has_gpu() -> bool:
    """A working `nvidia-smi` that lists at least one GPU."""
    path = nvidia_smi()
    if path is None:
        return False
    try:
        result = subprocess.run([path, "-L"], capture_output=True, timeout=30, encoding="utf-8", errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "GPU" in result.stdout
