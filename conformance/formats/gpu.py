"""What a GPU runner decides about GPU memory, in one place: how much of it one engine may
take, and how many engines fit side by side (whether there is a GPU: formats/settings.py).

Standard library only: the harness reads the GPU through `nvidia-smi` (it never imports
torch), and engines/vllm/engine_layer.py imports this module inside a pin's environment for
the same budget. Every decision here is a plain function of what `nvidia-smi` reports, so
tests/process/test_gpu_simulation.py drives all of them on CPU with a fake `nvidia-smi`.
"""

from __future__ import annotations

import os
import subprocess

from conformance.formats.errors import ParityError
from conformance.formats.settings import nvidia_smi

# One tiny engine on a GPU: its CUDA context (~0.5 GiB), torch's workspaces, the tiny model
# and an explicit 256 MiB KV cache (the same as on CPU), with room to spare. vLLM's default
# (0.92 of the GPU per engine) would let only one engine start: a second one is refused when
# free memory is below what it asks for.
ENGINE_BYTES = 4 << 30
KV_CACHE_BYTES = 256 << 20


class GpuError(ParityError, RuntimeError):
    """nvidia-smi answered, but not in the form this module reads."""


def memory() -> tuple[int, int]:
    """(free, total) bytes of the GPU engines run on: the first one CUDA_VISIBLE_DEVICES names
    (vLLM's device 0), else GPU 0."""
    path = nvidia_smi()
    if path is None:
        raise GpuError("nvidia-smi is not on PATH")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    argv = [path, "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits",
            "-i", visible or "0"]
    result = subprocess.run(argv, capture_output=True, timeout=30, encoding="utf-8", errors="replace")
    lines = result.stdout.strip().splitlines()
    try:
        free, total = (int(x.strip()) for x in lines[0].split(","))
    except (IndexError, ValueError):
        raise GpuError(f"nvidia-smi {' '.join(argv[1:])} answered {result.stdout.strip()!r} "
                       f"(exit {result.returncode}), not 'FREE, TOTAL' in MiB") from None
    return free << 20, total << 20


def engines_fitting(free_bytes: int) -> int:
    """How many engines `free_bytes` of GPU memory holds at ENGINE_BYTES each; at least one
    (which then fails with vLLM's own message if even that does not fit)."""
    return max(1, free_bytes // ENGINE_BYTES)


def engines_side_by_side(free_bytes: int, cpus: int) -> int:
    """How many engines may run at once on one GPU: as many as fit, at most one per core
    (each engine's Python loop keeps one busy)."""
    return max(1, min(cpus, engines_fitting(free_bytes)))


def engine_memory(total_bytes: int, tiny: bool) -> dict:
    """vllm.LLM's memory arguments for one engine on a GPU of `total_bytes`. A tiny model gets
    ENGINE_BYTES (gpu_memory_utilization is a fraction of the whole GPU, and vLLM refuses to
    start when less than that fraction is free) with an explicit KV cache; a real checkpoint
    (the 27B gate) keeps vLLM's default and runs alone."""
    if not tiny:
        return {}
    fraction = -(-ENGINE_BYTES * 1000 // total_bytes) / 1000  # rounded up to 0.001
    return {"gpu_memory_utilization": min(fraction, 0.9), "kv_cache_memory_bytes": KV_CACHE_BYTES}


def golden_written_here(layers, release: str, device: str, cpu_engine_build: str | None) -> bool:
    """Whether `make goldens` on this device may write the golden of a scenario with `layers`
    for `release`. On CPU: every golden. On a GPU only what no CPU can write: a scenario with
    engine layers, for a pin without a CPU engine build (0.33.0). Every other golden was
    written on CPU, and a GPU run is judged against it by the numerics rules, never written
    over it with GPU provenance."""
    from conformance.formats.protocol import ENGINE_LAYERS

    if device != "gpu":
        return True
    return cpu_engine_build is None and any(layer in ENGINE_LAYERS for layer in layers)


def selected_for_goldens(layers, release: str, pins_setting: str, layers_setting: str) -> bool:
    """`make goldens PINS=0.33.0 LAYERS=engine`: PINS a comma- or space-separated list of
    releases, LAYERS `engine` (scenarios with engine layers) or a list of layer names; empty
    selects everything."""
    from conformance.formats.protocol import ENGINE_LAYERS

    pins = pins_setting.replace(",", " ").split()
    if pins and release not in pins:
        return False
    wanted = layers_setting.replace(",", " ").split()
    if not wanted:
        return True
    names = set(wanted) - {"engine"} | (set(ENGINE_LAYERS) if "engine" in wanted else set())
    return any(layer in names for layer in layers)
