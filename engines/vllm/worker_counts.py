"""How many tokens the worker actually runs through the target and the drafter, per step.

Installed inside the real engine's worker (in process: LLM.collective_rpc runs
`install(worker)` there) as forward pre-hooks that only count rows; nothing is changed. The
engine-layer scheduler (recorder.EngineRecordingScheduler) opens a step at schedule() and
reads the counts at update_from_output(): the model runner and the drafter run in between.

Counted per forward pass (a list per step, in call order):
  target   rows of each target forward (input_ids / positions)
  drafter  rows of each drafter pass. DFlash computes the K/V of the context tokens in
           precompute_and_store_context_kv() and then runs its query tokens (one bonus and K
           mask queries per request) through forward(): one pass is context + queries, so
           the mask queries are included.
Eager mode only (the engine layer sets enforce_eager): a CUDA graph replay runs no hook.
"""

from __future__ import annotations

ACTIVE = False
_step: dict[str, list[int]] = {"target": [], "drafter": []}
_pending_context = [0]  # DFlash context rows waiting for their query pass


def begin_step() -> None:
    _step["target"], _step["drafter"] = [], []
    _pending_context[0] = 0


def snapshot() -> dict[str, list[int]]:
    return {"target": list(_step["target"]), "drafter": list(_step["drafter"])}


def _rows(args, kwargs) -> int:
    for name in ("input_ids", "positions", "inputs_embeds"):
        value = kwargs.get(name)
        if value is not None:
            return int(value.shape[-1] if name == "positions" and value.dim() == 2 else value.shape[0])
    for value in args:
        if hasattr(value, "shape") and value.dim() >= 1:
            return int(value.shape[0])
    return 0


def install(worker) -> str:
    """Run inside the worker. Returns what was hooked, for the engine's stderr."""
    global ACTIVE
    runner = worker.model_runner
    target = runner.get_model() if hasattr(runner, "get_model") else runner.model
    target.register_forward_pre_hook(
        lambda module, args, kwargs: _step["target"].append(_rows(args, kwargs)), with_kwargs=True)
    hooked = [type(target).__name__]
    if getattr(runner, "speculator", None) is not None:  # Model Runner V2: runtime.py pins V1
        raise RuntimeError(f"{type(runner).__name__} keeps its drafter in `speculator` (Model Runner V2); "
                           "the drafter counts hook V1's `drafter`: run with VLLM_USE_V2_MODEL_RUNNER=0")
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is not None and hasattr(model, "register_forward_pre_hook"):
        def drafter_pass(module, args, kwargs):
            _step["drafter"].append(_pending_context[0] + _rows(args, kwargs))
            _pending_context[0] = 0

        model.register_forward_pre_hook(drafter_pass, with_kwargs=True)
        hooked.append(type(model).__name__)
        precompute = getattr(model, "precompute_and_store_context_kv", None)
        if precompute is not None:  # DFlash: the context half of its first pass
            def counted(context_states, *args, **kwargs):
                _pending_context[0] += int(context_states.shape[0])
                return precompute(context_states, *args, **kwargs)

            model.precompute_and_store_context_kv = counted
            hooked.append("precompute_and_store_context_kv")
    ACTIVE = True
    return ", ".join(hooked)
