"""Config layer: resolve a scenario's engine_args through the release's own config code.

Records the resolved scheduling budget and, verbatim, the log lines vLLM emitted about it
(captured from vLLM's logger, never re-typed).

Async scheduling is the one setting a platform decides after vLLM's generic rule: the GPU
platforms keep what the rule resolved, the CPU platform forces it off (vllm/platforms/cpu.py,
`scheduler_config.async_scheduling = False`). The stand-in layers model the GPU deployment, so
the configuration they run keeps the generic rule's value; both values are recorded.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

# Log lines about the scheduling budget are the ones that name one of these.
BUDGET_WORDS = ("max_num_scheduled_tokens", "max_num_batched_tokens", "max_num_seqs",
                "speculative decoding settings")
# Log lines about async scheduling ("Async scheduling not supported with draft_model-based ...",
# "Disabling cascade attention (not yet compatible with async speculative decoding).").
ASYNC_WORDS = ("sync scheduling", "asynchronous scheduling", "async speculative")


@contextlib.contextmanager
def _captured_vllm_log():
    """Every message a `vllm.*` logger emits inside the block, at vLLM's own levels.

    Hooks Logger.handle rather than adding a handler: 0.33.0 re-applies its logging
    dictConfig inside create_engine_config, which would drop an added handler.
    """
    lines: list[str] = []
    original = logging.Logger.handle

    def handle(self, record):
        if record.name == "vllm" or record.name.startswith("vllm."):
            lines.append(record.getMessage())
        return original(self, record)

    logging.Logger.handle = handle
    try:
        yield lines
    finally:
        logging.Logger.handle = original


def _forget_once_caches() -> None:
    """vLLM's *_once loggers remember what they said; a warm worker must hear it again."""
    import vllm.logger as vlog

    for name in ("_print_debug_once", "_print_info_once", "_print_warning_once", "_print_error_once"):
        cached = getattr(vlog, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


@dataclass
class AsyncRule:
    """`engine_args.async_scheduling` as each platform resolves it: `gpu` by vLLM's generic rule
    (what a CUDA host runs: its platform hook leaves the value alone), `cpu` after the CPU
    platform's hook; both None when the configuration was refused before the hook ran. `lines`:
    vLLM's log lines naming async scheduling, verbatim."""

    gpu: bool | None = None
    cpu: bool | None = None
    lines: list[str] = field(default_factory=list)


@contextlib.contextmanager
def platform_rule(keep_gpu_rule: bool):
    """An AsyncRule filled while vLLM resolves a configuration inside the block: the platform
    hook (`check_and_update_config`, vllm/config/vllm.py) is wrapped to read
    `scheduler_config.async_scheduling` before and after it. With `keep_gpu_rule` the value the
    generic rule resolved is put back after the hook, so the resolution goes on as on a GPU host.
    Only the first configuration resolved in the block is read (the engine's own)."""
    from vllm.platforms import current_platform

    from .release import cpu_forces_sync

    platform = type(current_platform)
    own = platform.__dict__.get("check_and_update_config")
    original = platform.check_and_update_config  # bound to the platform class
    rule = AsyncRule()
    seen: list = []

    def hook(cls, vllm_config):
        sched = vllm_config.scheduler_config
        before = sched.async_scheduling  # the generic rule's value: the hook runs after it
        original(vllm_config)
        on_cpu = current_platform.is_cpu()
        if not seen:
            seen.append(True)
            rule.gpu = bool(before if on_cpu else sched.async_scheduling)
            rule.cpu = bool(sched.async_scheduling if on_cpu else not cpu_forces_sync() and rule.gpu)
        if keep_gpu_rule and on_cpu:
            sched.async_scheduling = before

    platform.check_and_update_config = classmethod(hook)
    try:
        yield rule
    finally:
        if own is not None:
            platform.check_and_update_config = own
        else:
            del platform.check_and_update_config


def resolve_config(scenario: dict):
    """(VllmConfig or None, budget log lines, refusal or None) for the scenario's engine_args,
    the configuration as a GPU host resolves it (see the module doc)."""
    config, lines, refusal, _rule = resolve_with_rule(scenario)
    return config, lines, refusal


def resolve_with_rule(scenario: dict):
    """resolve_config, and the AsyncRule read while resolving (its async log lines in it)."""
    from vllm.engine.arg_utils import EngineArgs

    from .release import align_hybrid_block_size

    args = dict(scenario["engine_args"])
    if args.get("kv_transfer_config") is not None:  # the stand-in's connector, by module path
        from .kv_connector import kv_transfer_config

        args["kv_transfer_config"] = kv_transfer_config(args["kv_transfer_config"])
    if args.get("structured_outputs_config") is not None:  # EngineArgs takes the config object
        from vllm.config import StructuredOutputsConfig

        args["structured_outputs_config"] = StructuredOutputsConfig(**args["structured_outputs_config"])
    if args.get("kv_events_config") is not None:  # vLLM's own config; its publisher "null"
        from vllm.config import KVEventsConfig

        args["kv_events_config"] = KVEventsConfig(**args["kv_events_config"])
    _forget_once_caches()
    with _captured_vllm_log() as captured, platform_rule(keep_gpu_rule=True) as rule:
        try:
            config = EngineArgs(skip_tokenizer_init=not (uses_grammar(scenario) or uses_encoder(scenario)),
                                **args).create_engine_config()
            align_hybrid_block_size(config)  # a GPU executor's step before the KV cache is sized
            refusal = None
        except Exception as exc:  # the release refusing a configuration is a result, not a crash
            config, refusal = None, {"type": type(exc).__name__, "message": _scrub(str(exc), args)}
    lines = [_scrub(line, args) for line in captured if any(w in line for w in BUDGET_WORDS)]
    rule.lines = async_lines(captured, args)
    return config, lines, refusal, rule


def uses_grammar(scenario: dict) -> bool:
    """Whether a request of the workload has a structured_output: its grammar reads the model
    folder's tokenizer (vLLM refuses structured outputs under skip_tokenizer_init)."""
    workload = scenario.get("workload") or {}
    return any("structured_output" in req for req in workload.get("requests", ()))


def uses_encoder(scenario: dict) -> bool:
    """Whether a request of the workload has encoder_inputs: the release's multimodal processor,
    which computes the encoder budget, is built with the model folder's tokenizer."""
    workload = scenario.get("workload") or {}
    return any(req.get("encoder_inputs") for req in workload.get("requests", ()))


def async_lines(captured: list[str], args: dict) -> list[str]:
    return [_scrub(line, args) for line in captured if any(w in line for w in ASYNC_WORDS)]


def resolve(scenario: dict):
    from conformance.formats.refusal import meaning

    config, lines, refusal, rule = resolve_with_rule(scenario)
    if config is None:  # recorded by its meaning: vLLM's exception and words, no pydantic wrapper
        yield {"refused": meaning(refusal), "budget_log_lines": lines, "async_log_lines": rule.lines}
        return
    yield budget_record(config, lines, rule=rule)


def budget_record(config, lines: list[str], scheduler=None, rule: AsyncRule | None = None) -> dict:
    """`scheduler`: a live engine's own (the engine layers); else one is built to read, of the
    class the configuration names (AsyncScheduler under async scheduling). `rule`: how each
    platform resolved async scheduling (platform_rule)."""
    from .release import build_scheduler, charges_drafting_per_step

    sched = config.scheduler_config
    spec = config.speculative_config
    scheduler = scheduler or build_scheduler(config)
    per_step = charges_drafting_per_step()
    rule = rule or AsyncRule(bool(sched.async_scheduling), bool(sched.async_scheduling))
    return {
        "refused": None,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "max_num_scheduled_tokens": sched.max_num_scheduled_tokens,
        "max_num_seqs": sched.max_num_seqs,
        "num_speculative_tokens": spec.num_speculative_tokens if spec else 0,
        "speculative_method": spec.method if spec else None,
        "parallel_drafting": bool(getattr(spec, "parallel_drafting", False)) if spec else False,
        "drafting_slots_per_request": spec.max_num_new_slots_for_drafting if spec else 0,
        "drafting_reservation": ("per_step_input_budget" if per_step else "config") if spec else None,
        "num_lookahead_tokens": getattr(scheduler, "num_lookahead_tokens", None),
        "block_size": config.cache_config.block_size,
        "enable_prefix_caching": config.cache_config.enable_prefix_caching,
        "enable_chunked_prefill": sched.enable_chunked_prefill,
        "scheduler_class": type(scheduler).__name__,
        "budget_log_lines": lines,
        "async_scheduling_gpu": rule.gpu,
        "async_scheduling_cpu": rule.cpu,
        "batch_queue_size": batch_queue_size(config, rule.gpu),
        "async_log_lines": rule.lines,
        **encoder_budget(scheduler),
    }


def encoder_budget(scheduler) -> dict:
    """A multimodal model's encoder budget and cache size, as the scheduler holds them (vLLM's
    MultiModalBudget computed them from the model's processor); nothing for a text-only model."""
    budget = int(getattr(scheduler, "max_num_encoder_input_tokens", 0) or 0)
    if not budget:
        return {}
    return {"encoder_compute_budget": budget, "encoder_cache_size": int(scheduler.encoder_cache_manager.cache_size)}


def batch_queue_size(config, gpu_rule: bool) -> int:
    """vLLM's max_concurrent_batches (vllm/config/vllm.py) under the GPU rule: the size of
    EngineCore's batch queue, 2 with async scheduling on the V1 model runner, else 1."""
    sched = config.scheduler_config
    kept = sched.async_scheduling
    sched.async_scheduling = gpu_rule
    try:
        return int(config.max_concurrent_batches)
    finally:
        sched.async_scheduling = kept


def _scrub(text: str, args: dict) -> str:
    """Replace this machine's absolute model paths, so a golden regenerates anywhere."""
    spec = args.get("speculative_config") or {}
    for path, alias in ((spec.get("model"), "<draft>"), (args.get("tokenizer"), "<tokenizer>"),
                        (args.get("model"), "<model>")):
        if path:
            text = text.replace(path, alias)
    return text
