"""Methods layer: the drafting-slot table and refusal parity for every speculative method.

For each row of the scenario's `method_matrix` (conformance/formats/method_matrix.py) and each K, the
scenario's engine_args with that row's speculative config (plus num_speculative_tokens=K,
and the row's `target` as model where given) are resolved through the release's own
EngineArgs(...).create_engine_config(), exactly as the config layer does
(config_layer.resolve_config). Nothing here knows a method's slot count: every number comes
from the resolved objects of the release.

Records, in this order:

1. One table record per row and K ("row": "<name>/K=<k>"): whether the release constructs
   the configuration, its drafting slots per request (SpeculativeConfig.
   max_num_new_slots_for_drafting), the scheduler's lookahead (the release's real Scheduler)
   and the budget. A configuration the release refuses stays in the table
   (constructible=false, with the refusal).

2. Refusal probes ("row": "<name>/K=<k>/mnbt=<v>"). The reservation R of a constructible
   row/K is the largest max_num_batched_tokens that the release's own drafting-budget rule
   (VllmConfig._set_max_num_scheduled_tokens, run in isolation on the resolved config with
   only max_num_batched_tokens changed) refuses; 0 when it refuses none. That is
   slots x max_num_seqs on 0.27.1 (subtracted in the config), slots on 0.28.0 (compared per
   request), num_lookahead_tokens on 0.33.0; the rule is read by running it, not restated.
   Where R > 0 the whole configuration is resolved again with max_num_batched_tokens at
   R ("at"), R-1 ("below") and R+1 ("above"). vLLM also requires max_num_batched_tokens >=
   max_num_seqs (SchedulerConfig), so where the probed value is below max_num_seqs (and at
   least 1), max_num_seqs is lowered to it; and without chunked prefill,
   max_num_batched_tokens >= max_model_len, so max_model_len is lowered likewise. Every
   such change is listed in the probe's `adjusted`.

Refusals are described by `refusal_kind` (the exception class vLLM's code raised: a
ValueError in a validator, not pydantic's ValidationError around it), `refused_by` (for
pydantic validation errors, the config class whose validation refused, else null) and
`refusal_text` (vLLM's own words without pydantic's wrapper, model paths scrubbed; fields
ending in `_text` are informational and not compared). conformance/formats/refusal.py.

Platform: vLLM serves DSpark only through its V2 model runner, which needs Triton. On a CPU
machine without Triton every release would refuse DSpark for that reason alone (0.27.1 and
0.28.0: "Model Runner V2 requires Triton."; 0.33.0: "Model Runner V1 does not support:
dspark speculative decoding"), which says nothing about the method. So, as runtime.boot
fixes the platform before vLLM is imported, this layer resolves with vLLM's module-level
HAS_TRITON (vllm/config/vllm.py) reading True where it reads False, for the duration of each
resolution and scheduler build, so the model runner is chosen as on a GPU host. This
changes nothing where Triton is present.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re

from .release import charges_drafting_per_step

PROBES = (("below", -1), ("at", 0), ("above", 1))

# The config class whose pydantic validation refused (conformance/formats/refusal.py removes the rest
# of pydantic's wrapper).
_PYDANTIC_HEAD = re.compile(r"^\d+ validation errors? for (\w+)\n")

def methods(scenario_wire: dict):
    matrix = scenario_wire.get("method_matrix")
    if not isinstance(matrix, dict):
        from conformance.formats.scenario import ScenarioError

        raise ScenarioError(scenario_wire.get("name", "<scenario>"), "method_matrix",
                            "is required for the methods layer (conformance/formats/method_matrix.py)")
    base = dict(scenario_wire["engine_args"])
    base.pop("speculative_config", None)
    probes = []
    for row in matrix["rows"]:
        for k in matrix["ks"]:
            args = _row_args(base, row, k)
            config, refusal = _resolve(args)
            record = {"row": f"{row['name']}/K={k}", "method": row["speculative_config"]["method"],
                      "k": k, "constructible": config is not None, **refusal}
            if config is None:
                record.update(parallel_drafting=None, drafting_slots_per_request=None,
                              num_lookahead_tokens=None, max_num_scheduled_tokens=None,
                              per_step_input_budget=None)
                yield record
                continue
            spec = config.speculative_config
            with _triton_platform():
                from .release import build_scheduler

                scheduler = build_scheduler(config)
            record.update(
                method=spec.method,
                parallel_drafting=bool(getattr(spec, "parallel_drafting", False)),
                drafting_slots_per_request=spec.max_num_new_slots_for_drafting,
                num_lookahead_tokens=getattr(scheduler, "num_lookahead_tokens", None),
                max_num_scheduled_tokens=config.scheduler_config.max_num_scheduled_tokens,
                per_step_input_budget=(config.scheduler_config.max_num_batched_tokens
                                       if charges_drafting_per_step() else None),
            )
            yield record
            reservation = _reservation(config, args)
            if reservation > 0:
                probes.append((row, k, args, reservation))
    for row, k, args, reservation in probes:
        for probe, delta in PROBES:
            value = reservation + delta
            probe_args, adjusted = _probe_args(args, value)
            config, refusal = _resolve(probe_args)
            yield {"row": f"{row['name']}/K={k}/mnbt={value}", "probe": probe,
                   "max_num_batched_tokens": value, "reservation": reservation,
                   "adjusted": adjusted, "refused": config is None, **refusal}


def _row_args(base: dict, row: dict, k: int) -> dict:
    args = dict(base)
    if "target" in row:
        args["model"] = row["target"]
    args["speculative_config"] = {**row["speculative_config"], "num_speculative_tokens": k}
    return args


def _probe_args(args: dict, value: int) -> tuple[dict, dict]:
    """The row's args at max_num_batched_tokens=value, with what vLLM requires besides."""
    probe = dict(args, max_num_batched_tokens=value)
    adjusted = {}
    if 1 <= value < probe["max_num_seqs"]:
        adjusted["max_num_seqs"] = value
    if not probe.get("enable_chunked_prefill", True) and 1 <= value < probe["max_model_len"]:
        adjusted["max_model_len"] = value
    probe.update(adjusted)
    return probe, adjusted


def _resolve(args: dict):
    """(VllmConfig or None, refusal fields) through the config layer's own resolution."""
    from .config_layer import resolve_config

    with _triton_platform():
        config, _lines, refusal = resolve_config({"engine_args": args})
    if refusal is None:
        return config, {"refusal_kind": None, "refused_by": None, "refusal_text": None}
    from conformance.formats.refusal import meaning

    head = _PYDANTIC_HEAD.match(refusal["message"]) if refusal["type"] == "ValidationError" else None
    said = meaning(refusal)  # the exception vLLM raised, in its own words
    return None, {"refusal_kind": said["type"], "refused_by": head.group(1) if head else None,
                  "refusal_text": said["message"]}


def _reservation(config, args: dict) -> int:
    """Largest max_num_batched_tokens the release's drafting-budget rule refuses (0: none)."""
    rule = getattr(config, "_set_max_num_scheduled_tokens", None)
    if rule is None:
        raise RuntimeError("this release has no VllmConfig._set_max_num_scheduled_tokens; "
                           "the methods layer cannot read its drafting-budget rule")
    sched = config.scheduler_config
    fields = [f for f in ("max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_active_seqs")
              if hasattr(sched, f)]
    saved = {f: getattr(sched, f) for f in fields}

    def refused(value: int) -> bool:
        sched.max_num_batched_tokens = value
        sched.max_num_scheduled_tokens = args.get("max_num_scheduled_tokens")
        if "max_num_active_seqs" in saved:
            sched.max_num_active_seqs = saved["max_num_active_seqs"]
        try:
            rule()
        except ValueError:
            return True
        return False

    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.setLevel(logging.ERROR)  # the rule's warnings, once per probed value, are noise
    try:
        if not refused(1):
            return 0
        low, high = 1, saved["max_num_batched_tokens"]  # refused(low); high was accepted
        while high - low > 1:
            mid = (low + high) // 2
            if refused(mid):
                low = mid
            else:
                high = mid
        return low
    finally:
        vllm_logger.setLevel(level)
        for f, v in saved.items():
            setattr(sched, f, v)


@contextlib.contextmanager
def _triton_platform():
    """vLLM's model-runner choice as on a host with Triton and no runner pinned (see the module
    docstring; on a GPU runtime.GPU_MODEL_RUNNER pins V1 for the other layers)."""
    module = importlib.import_module("vllm.config.vllm")
    envs = importlib.import_module("vllm.envs")
    had = getattr(module, "HAS_TRITON", True)
    pinned = "VLLM_USE_V2_MODEL_RUNNER" in os.environ
    module.HAS_TRITON = True
    if pinned:  # a module attribute is found before vllm.envs' (possibly cached) __getattr__
        envs.VLLM_USE_V2_MODEL_RUNNER = None
    try:
        yield
    finally:
        module.HAS_TRITON = had
        if pinned:
            del envs.VLLM_USE_V2_MODEL_RUNNER
