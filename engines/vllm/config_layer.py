"""Config layer: resolve a scenario's engine_args through the release's own config code.

Records the resolved scheduling budget and, verbatim, the log lines vLLM emitted about it
(captured from vLLM's logger, never re-typed).
"""

from __future__ import annotations

import contextlib
import logging

# Log lines about the scheduling budget are the ones that name one of these.
BUDGET_WORDS = ("max_num_scheduled_tokens", "max_num_batched_tokens", "max_num_seqs",
                "speculative decoding settings")


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


def resolve_config(scenario: dict):
    """(VllmConfig or None, budget log lines, refusal or None) for the scenario's engine_args."""
    from vllm.engine.arg_utils import EngineArgs

    args = dict(scenario["engine_args"])
    _forget_once_caches()
    with _captured_vllm_log() as captured:
        try:
            config = EngineArgs(skip_tokenizer_init=True, **args).create_engine_config()
            refusal = None
        except Exception as exc:  # the release refusing a configuration is a result, not a crash
            config, refusal = None, {"type": type(exc).__name__, "message": _scrub(str(exc), args)}
    lines = [_scrub(line, args) for line in captured if any(w in line for w in BUDGET_WORDS)]
    return config, lines, refusal


def resolve(scenario: dict):
    from conformance.formats.refusal import meaning

    config, lines, refusal = resolve_config(scenario)
    if config is None:  # recorded by its meaning: vLLM's exception and words, no pydantic wrapper
        yield {"refused": meaning(refusal), "budget_log_lines": lines}
        return
    yield budget_record(config, lines)


def budget_record(config, lines: list[str], scheduler=None) -> dict:
    """`scheduler`: a live engine's own (the engine layers); else one is built to read."""
    from .release import build_scheduler, charges_drafting_per_step

    sched = config.scheduler_config
    spec = config.speculative_config
    scheduler = scheduler or build_scheduler(config)
    per_step = charges_drafting_per_step()
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
    }


def _scrub(text: str, args: dict) -> str:
    """Replace this machine's absolute model paths, so a golden regenerates anywhere."""
    spec = args.get("speculative_config") or {}
    for path, alias in ((spec.get("model"), "<draft>"), (args.get("model"), "<model>")):
        if path:
            text = text.replace(path, alias)
    return text
