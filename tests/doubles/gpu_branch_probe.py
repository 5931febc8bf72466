"""TEST DEVICE: drives the GPU branches of the oracle's own code inside a pin's environment on a
CPU machine, and prints what each decided as one JSON object (tests/process/test_gpu_simulation.py).

Real vLLM is imported and booted as a GPU worker would boot it (runtime.boot("gpu")); only the
two answers a CPU cannot give are faked, and named here: vLLM's platform says it is not a CPU,
and torch.cuda reports a GPU of FAKE_TOTAL bytes. Nothing here runs an engine.

    python gpu_branch_probe.py TINY_MODEL_DIR REAL_WEIGHTS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAKE_TOTAL = 80 << 30


def main(tiny: str, real: str) -> dict:
    import os

    from engines.vllm import runtime

    runtime.boot("gpu")
    import torch
    import vllm.envs
    from vllm.platforms import current_platform

    from engines.vllm import engine_layer, methods_layer, worker_counts

    found = {"runner_setting": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
             "runner_read_by_vllm": vllm.envs.VLLM_USE_V2_MODEL_RUNNER,
             "environment": runtime.environment(),
             "engine_layers_served": sorted(layer for layer in runtime.LAYERS if layer.startswith("engine_"))}
    with methods_layer._triton_platform():
        found["runner_read_by_methods_layer"] = vllm.envs.VLLM_USE_V2_MODEL_RUNNER
    found["runner_read_after_methods_layer"] = vllm.envs.VLLM_USE_V2_MODEL_RUNNER
    # float32 matmul precision: the setting boot pins, as vLLM reads it; what torch runs at, read back
    found["precision_setting"] = os.environ.get("VLLM_FLOAT32_MATMUL_PRECISION")
    found["precision_read_by_vllm"] = vllm.envs.VLLM_FLOAT32_MATMUL_PRECISION
    found["precision_in_effect"] = engine_layer.precision_in_effect()
    torch.set_float32_matmul_precision("high")  # as vLLM's worker would at VLLM_FLOAT32_MATMUL_PRECISION=high
    found["precision_in_effect_tf32"] = engine_layer.precision_in_effect()
    torch.set_float32_matmul_precision("highest")

    # the faked answers: a platform that is not a CPU, a GPU of FAKE_TOTAL bytes
    type(current_platform).is_cpu = lambda self: False
    torch.cuda.mem_get_info = lambda device=None: (FAKE_TOTAL - (1 << 30), FAKE_TOTAL)
    emptied = []
    torch.cuda.is_initialized = lambda: True
    torch.cuda.empty_cache = lambda: emptied.append(True)

    def kwargs(model: str) -> dict:
        scenario = {"name": "probe", "engine_args": {"model": model, "max_model_len": 64}}
        return {k: v for k, v in engine_layer.llm_kwargs(scenario).items()
                if k in ("gpu_memory_utilization", "kv_cache_memory_bytes", "enforce_eager")}

    found["tiny_engine"] = kwargs(tiny)
    # async scheduling under the GPU rule: vLLM runs the scheduler class it is given as given
    import importlib

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    for rule in (False, True):
        name = engine_layer.llm_kwargs({"name": "probe", "engine_args": {"model": tiny, "max_model_len": 64}},
                                       async_gpu=rule)["scheduler_cls"]
        module, _, cls = name.rpartition(".")
        found[f"scheduler_cls_async_{rule}"] = [name, issubclass(getattr(importlib.import_module(module), cls),
                                                                 AsyncScheduler)]
    found["real_weights_engine"] = kwargs(real)
    engine_layer._release_memory()
    found["cuda_cache_emptied"] = len(emptied)

    class Hookable:
        def register_forward_pre_hook(self, hook, with_kwargs=False):
            pass

    class V2Runner:  # Model Runner V2's shape: the drafter in `speculator`
        model = Hookable()
        speculator = object()

    try:
        worker_counts.install(type("Worker", (), {"model_runner": V2Runner()})())
        found["v2_runner_counted"] = "silently"
    except RuntimeError as exc:
        found["v2_runner_counted"] = str(exc)
    return found


if __name__ == "__main__":
    print("PROBE " + json.dumps(main(sys.argv[1], sys.argv[2]), default=str), flush=True)
