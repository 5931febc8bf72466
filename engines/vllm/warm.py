"""Warm a freshly built pin environment once, so no scenario pays a first-time cost.

Run by conformance/process/envs.py as the last build step (`worker.py --warm RELEASE --device D`):

- vLLM's per-architecture model inspection. The first time a release meets an architecture
  it imports the model class in a `python -m vllm.model_executor.models.registry`
  subprocess (a cold import of vLLM and torch, ~6 s each) and caches the answer in
  $VLLM_CACHE_ROOT/modelinfos, keyed by the hash of the model's source file. runtime.boot
  points VLLM_CACHE_ROOT into the environment, so the answers written here are the ones every
  later worker reads. Here the inspection runs in this process instead (the subprocess only
  keeps CUDA out of a long-lived engine process; this one exits right after): the same
  function on the same class, so the same answer, without a cold import per architecture.
- The project's tiny models (tiny_models.py), made once into the shared cache.
- Where the environment runs the whole engine, one engine run, so the kernels torch compiles
  for it (cached in the environment: runtime.boot sets TORCHINDUCTOR_CACHE_DIR) and the C++
  headers it precompiles are made here, not in the first engine scenario of a gate.

Which architectures: those every committed scenario resolves, found by resolving each one's
config (and its method matrix) through the config and methods layers.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_SCENARIO = "engine_draft_model_self"  # a target and a drafter: both engine halves


def warm(log) -> None:
    from conformance.formats.scenario import load_scenario

    started = time.monotonic()
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()  # see the module docstring
    from . import config_layer, methods_layer

    scenarios = [load_scenario(path) for path in sorted((REPO / "scenarios").glob("*.json"))]
    for scenario in scenarios:
        wire = scenario.to_wire()
        try:
            list(config_layer.resolve(wire))
            if wire.get("method_matrix") is not None:
                list(methods_layer.methods(wire))
        except Exception as exc:  # a scenario the release refuses still warmed what it reached
            log(f"[warm] {scenario.name}: {type(exc).__name__}: {str(exc)[:200]}")
    cache = Path(os.environ["VLLM_CACHE_ROOT"]) / "modelinfos"
    inspected = sorted(p.stem for p in cache.glob("*.json")) if cache.is_dir() else []
    log(f"[warm] {len(inspected)} architectures inspected: {json.dumps(inspected)}")
    tiny = materialize_tiny_models()
    log(f"[warm] {len(tiny)} tiny models ready")
    from . import per_run, runtime

    if "engine_steps" in runtime.LAYERS:  # the kernels torch compiles for the engine, once
        engine = next(s for s in scenarios if s.name == ENGINE_SCENARIO).to_wire()
        per_run.forget()
        from . import engine_layer

        engine_layer.run_engine(engine)
        log(f"[warm] one engine run ({ENGINE_SCENARIO})")
    log(f"[warm] warmed in {time.monotonic() - started:.1f} s")


def materialize_tiny_models() -> list[Path]:
    from conformance.formats.settings import cache_root

    from .tiny_models import materialize

    cache = cache_root()
    return [materialize(folder, cache) for folder in sorted((REPO / "scenarios" / "models").glob("tiny-*"))
            if (folder / "weights.json").is_file()]
