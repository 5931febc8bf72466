"""A pinned vLLM release's runtime, for every pin (the gate's oracle and the others) and its
mutants: boot it on the right platform, register the layers it serves (and why it serves no
others), report its environment.

Imported only inside a pin's environment, by worker.py (and mutant_server.py, warm.py).
"""

from __future__ import annotations

import json
import os
import platform
import sys

from conformance.formats import precision

LAYERS: dict = {}  # layer name -> function(scenario wire dict) -> iterable of record dicts
UNSERVED: dict = {}  # layer name -> why this environment cannot serve it
DEVICE: list = []  # the device boot() was given (the harness's one decision, settings.device_mode)

# The model runner of every engine on a GPU: V1, pinned. Each pin would pick Model Runner V2 on
# a GPU with Triton (vllm/config/vllm.py use_v2_model_runner), but the CPU rebuilds run V1 only
# (no Triton), so every committed steps and engine golden was recorded with V1 decisions (V2
# also changes the scheduler: can_skip_drafts); engines/vllm/worker_counts.py counts V1's
# `runner.drafter` (V2 keeps its drafter in `runner.speculator`); and a golden must mean the
# same thing on every machine. The methods layer still reports the runner an unpinned GPU host
# would choose (methods_layer._triton_platform).
GPU_MODEL_RUNNER = {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def boot(device: str, no_cpu_engine: str | None = None) -> None:
    """Import vLLM with the platform decided before vllm.engine.arg_utils is imported.
    `no_cpu_engine`: why the pin has no CPU rebuild, said where its engine layers are refused."""
    # The environment is the harness's own cache: a module no warm-up imported (numba's, for
    # the first ngram run) is compiled once and kept, even where PYTHONDONTWRITEBYTECODE is set
    # (measured: numba's modules cost a worker about 3 s to compile on each start).
    sys.dont_write_bytecode = False
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    # vLLM caches model inspection under ~/.cache/vllm, shared by every release: one cache per
    # pin environment, or the pins overwrite each other's entries and pay the inspection again.
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(sys.prefix, "vllm-cache"))
    # The same for the kernels torch compiles for the engine (keyed by this environment's
    # paths): kept with the environment, which compiles them once when it is built (warm.py).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(sys.prefix, "inductor-cache"))
    os.environ["VLLM_LOGGING_LEVEL"] = "INFO"  # budget log lines are captured at vLLM's default level
    # Full float32 matmuls, explicitly, before vllm.envs is first read: vLLM's worker (CPU and
    # GPU) passes this to torch.set_float32_matmul_precision. Another value a runner set stays,
    # and the engine layers refuse it by name (engine_layer.unavailable; conformance/formats/precision.py).
    os.environ.setdefault(precision.SETTING, precision.FULL_FLOAT32)
    DEVICE[:] = [device]
    if device == "gpu":
        os.environ.update(GPU_MODEL_RUNNER)  # before vllm.envs is first read
    if device == "cpu":
        # One compute thread per engine process. vLLM on CPU otherwise binds an OpenMP thread to
        # every core in every worker, so two workers (pins run side by side) fight for the same
        # cores and idle threads spin: measured, half the CPU time on the tiny models, the same
        # records. A fixed count also keeps the order of each reduction the same on any machine.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # the ngram proposer's numba kernels
        # where numba keeps the machine code of those kernels (engine_layer.cache_numba_kernels), per environment
        os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(sys.prefix, "numba-cache"))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # 0.33.0 honours VLLM_TARGET_DEVICE; 0.27.1 and 0.28.0 need the platform object set.
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        import vllm.platforms as platforms
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
    import vllm.config  # noqa: F401
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.v1.core.sched.scheduler  # noqa: F401

    from . import config_layer, engine_layer, methods_layer, steps_layer

    LAYERS["config"] = config_layer.resolve
    LAYERS["steps"] = steps_layer.steps
    LAYERS["outputs"] = steps_layer.outputs
    LAYERS["methods"] = methods_layer.methods
    reason = engine_layer.unavailable(device, no_cpu_engine)
    if reason is None:
        LAYERS["engine_config"] = engine_layer.engine_config
        LAYERS["engine_steps"] = engine_layer.engine_steps
        LAYERS["engine_outputs"] = engine_layer.engine_outputs
    else:
        UNSERVED.update({layer: reason for layer in engine_layer.LAYERS})


def cpu() -> dict:
    """The CPU that computed the records: its model, the ISA level PyTorch's kernels run at
    (after ATEN_CPU_CAPABILITY), oneDNN's cap if one is set, and a digest of its flags. A golden
    is byte-exact only on the machine that wrote it (conformance/judging/goldens.py check_golden)."""
    import hashlib

    import torch

    info: dict[str, str] = {}  # the first CPU's fields
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = info.get("model name") or platform.processor() or platform.machine()
    flags = " ".join(sorted((info.get("flags") or info.get("Features") or "").split()))
    record = {"model": model, "isa": torch.backends.cpu.get_cpu_capability(),
              "flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16]}
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        record["onednn_max_isa"] = os.environ["ONEDNN_MAX_CPU_ISA"]
    return record


def pin_version() -> str:
    """What the pin is called: a release's version, or a pinned commit's 12 hex digits (its
    environment's vLLM says the base release, or the per-commit wheel's dev version)."""
    import vllm

    from . import release

    commit = release.commit_record()
    return commit["pin"] if commit else vllm.__version__


def numerics() -> dict:
    """What decides the engine's floats beyond the build: the float32 matmul precision vLLM's
    worker gives torch (boot pins it; another is refused), vLLM's batch-invariant mode, and the
    CUDA torch was built for (None for a CPU build)."""
    import torch
    import vllm.envs

    try:
        invariant = vllm.envs.VLLM_BATCH_INVARIANT
    except ValueError:  # not an integer: vLLM fails on it when the engine starts; recorded as given
        invariant = os.environ.get("VLLM_BATCH_INVARIANT")
    return {"float32_matmul_precision": os.environ.get(precision.SETTING, precision.FULL_FLOAT32),
            "batch_invariant": invariant, "cuda": torch.version.cuda}


def environment() -> dict:
    import torch
    import vllm

    from . import release

    commit = release.commit_record()
    env = {"python": f"{sys.version_info.major}.{sys.version_info.minor}",
           "torch": torch.__version__, "vllm": pin_version(), "machine": platform.machine(),
           "build": release.build() + (f"+vllm@{commit['pin']}" if commit else ""), "fidelity": None, "cpu": cpu(),
           **numerics()}
    if commit:  # a pinned upstream commit (conformance/process/commit_env.py): what was laid over what
        env["commit"] = {"commit": commit["commit"], "base": commit["base"], "overlay": commit["overlay"],
                         "compiled_inputs_changed": commit["compiled_inputs_changed"],
                         "dependencies": commit["dependencies"]}
    if DEVICE == ["gpu"]:  # recorded on GPU only, so the CPU goldens keep their provenance
        env["device"] = "gpu"
        env["model_runner"] = "v1 (VLLM_USE_V2_MODEL_RUNNER=0, engines/vllm/runtime.py)"
    # Written by conformance/process/envs.py when the build is a rebuild: what the fidelity check found.
    fidelity = os.path.join(sys.prefix, "FIDELITY.json")
    if os.path.exists(fidelity):
        with open(fidelity, encoding="utf-8") as f:
            record = json.load(f)
        env["fidelity"] = {k: record[k] for k in ("official", "compared_files",
                                                   "allowed_differences", "equal")}
    return env
