"""The float32 matmul precision every pin's engine runs at: full float32, pinned by the worker.

vLLM's worker (vllm/v1/worker/gpu_worker.py Worker.__init__, which CPUWorker inherits) calls
torch.set_float32_matmul_precision($VLLM_FLOAT32_MATMUL_PRECISION), default `highest`. Every
engine golden was written at `highest` in float32, and its tolerance (logprob_atol 1e-3) was
calibrated there. `high` lets torch run float32 matmuls in TF32 and `medium` in bfloat16: on
an H200 (Hugging Face's Qwen3 standing in for vLLM's kernels, benchmarks/gpu_precision.py)
TF32 moved tiny-qwen3's logprobs by about 1.5e-2 at nearly every position, 15x the tolerance,
and bfloat16 by about 0.34. Such a run is refused with the reason below, never judged.

Standard library only: engines/vllm/runtime.py (boot) and engine_layer.py apply it inside a
pin's environment; conformance/judging/goldens.py holds every golden to it.
"""

from __future__ import annotations

SETTING = "VLLM_FLOAT32_MATMUL_PRECISION"
FULL_FLOAT32 = "highest"
TOLERANCE = 1e-3  # the engine goldens' logprob_atol for float32

# what each other value of torch.set_float32_matmul_precision does to a float32 matmul, and
# what that was measured to do to the tiny models' logprobs on an H200
LOWER = {
    "high": "lets torch run float32 matmuls in TF32 (10-bit mantissa): measured on an H200, it moves "
            "the tiny models' logprobs by about 1.5e-2",
    "medium": "lets torch run float32 matmuls in bfloat16: measured on an H200 (the model in bfloat16), "
              "it moves the tiny models' logprobs by about 0.34",
}


def refusal(value: str | None, where: str = SETTING) -> str | None:
    """Why an engine running at float32 matmul precision `value` (`where` names what set it)
    is not judged against the goldens; None at full float32. None (unset) means vLLM's
    default, `highest`."""
    if value is None or value == FULL_FLOAT32:
        return None
    what = LOWER.get(value, f"is not {FULL_FLOAT32!r}, the only precision the goldens were written at")
    return (f"{where}={value!r}: {what}, far past the goldens' {TOLERANCE:g} logprob tolerance. Every "
            f"engine golden was written at {FULL_FLOAT32!r} (full float32); a run at another precision is "
            f"refused, not judged: unset {SETTING} or set it to {FULL_FLOAT32!r}")
