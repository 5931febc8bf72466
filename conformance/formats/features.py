"""Features: what a scenario needs of an engine beyond the core scheduler, and what an engine may
declare it has (`hello.features`, engines/PROTOCOL.md "Features").

A scenario's features are derived from its `engine_args`, its workload and its method matrix,
never written by hand, so a new scenario cannot forget one. An engine whose hello lists features
is not run on a scenario that needs one it does not list: the gate gives that scenario an
`unsupported` verdict naming the feature. A hello without `features` has every feature.

Standard library only: the worker and the test doubles import it beside the protocol.
"""

from __future__ import annotations

import json
import os

from conformance.formats.errors import InputError
from conformance.formats.fields import METHODS

SPEC = "spec:"  # spec:<method>, one feature per speculative method
CORE = "core"  # the report's name for the scenarios that need no feature (never a feature)
# feature -> when a scenario needs it (the reports, `parity docs` and PROTOCOL.md say these words)
FEATURES: dict[str, str] = {
    **{f"{SPEC}{method}": f"speculative decoding by `{method}`: `engine_args.speculative_config.method`, "
       "or a row of `method_matrix`" for method in sorted(METHODS)},
    "parallel_drafting": "`speculative_config.parallel_drafting` true (PARD, P-EAGLE), in `engine_args` or "
                         "a row of `method_matrix`",
    "priority_policy": "`engine_args.scheduling_policy` is `\"priority\"`",
    "request_priorities": "a request of the workload has a `priority` other than 0",
    "prefix_caching": "`engine_args.enable_prefix_caching` true (vLLM's default: also when the file omits it)",
    "prefix_caching_off": "the engine can run with prefix caching turned off (`engine_args.enable_prefix_caching` "
                          "false). Asked only of an engine that declares `prefix_caching`: one that lists "
                          "`prefix_caching` without it always caches, so the scenarios with caching off (those "
                          "not needing `prefix_caching`) are not run on it; one without `prefix_caching` never "
                          "caches and runs them",
    "chunked_prefill_off": "`engine_args.enable_chunked_prefill` false",
    "long_prefill_threshold": "`engine_args.long_prefill_token_threshold` above 0",
    "max_num_scheduled_tokens": "`engine_args.max_num_scheduled_tokens` given",
    "aborts": "a request of the workload has an `abort_step` (vLLM's `Scheduler.finish_requests`)",
    "shared_prefixes": "a request of the workload has a `prefix` or `continues` another",
    "min_tokens": "a request of the workload has a `min_tokens` above 0 (vLLM's check_stop holds back "
                  "its stops until then)",
    "stop_token_ids": "a request of the workload has `stop_token_ids` (it finishes at the first of them it "
                      "emits: vLLM's `FINISHED_STOPPED`)",
    "eos": "a request of the workload has an `eos_token_id` (it stops there: vLLM's `ignore_eos` false)",
    "repetition_detection": "a request of the workload has a `repetition_detection` whose "
                            "`max_pattern_size` is above 0 (vLLM's `FINISHED_REPETITION`)",
    "kv_connector": "`engine_args.kv_transfer_config` given: a KV connector (the stand-in's remote KV store) "
                    "loads what a request's `external` says, synchronously or asynchronously, and may fail",
    "structured_outputs": "a request of the workload has a `structured_output` (a JSON schema, a regex or a choice, "
                          "as vLLM's `StructuredOutputsParams` takes it): the release's StructuredOutputManager "
                          "and grammar backend mask what is sampled and cut the drafts the grammar refuses",
    "sliding_window": "the model's `layer_types` mix sliding-window and full attention (gpt-oss): hybrid KV "
                      "cache groups, one block table per group",
    "mamba": "the model's config has mamba layers beside attention (`hybrid_override_pattern` with `M`: "
             "Nemotron-H): vLLM's hybrid page-size unification, mamba KV cache groups "
             "(MambaManager) in the mamba cache mode `engine_args.mamba_cache_mode` resolves, block-aligned "
             "prefill splits in mode `align`, and `engine_args.prefix_match_unit`'s finer block hashes",
    "lora": "`engine_args.enable_lora` true, or a request of the workload has a `lora` adapter (vLLM's "
            "`max_loras` bound on a step's adapters; block hashes keyed by the adapter's name)",
    "encoder_inputs": "a request of the workload has `encoder_inputs` (multimodal items: vLLM's mm_features "
                      "with their placeholders, scheduled under the encoder compute budget and the encoder "
                      "cache, shared by hash, freed once the decoder has read them; `engine_args.disable_chunked_mm_input`)",
    "streaming_input": "a request of the workload has a `session`: a streaming input session (vLLM's resumable "
                       "requests), its later input chunks and the end of its input arriving at given steps",
    "reasoning": "`engine_args.reasoning_parser` given: the release's reasoning parser tells its "
                 "StructuredOutputManager where a request's reasoning ends (a request's `reasoning_end`), and "
                 "its grammar masks, advances and cuts drafts only after that",
    "kv_cache_events": "`engine_args.kv_events_config.enable_kv_cache_events` true: each step record carries "
                       "the KV cache events (BlockStored, BlockRemoved, AllBlocksCleared) vLLM's scheduler "
                       "publishes at that step's update",
    "prefix_cache_resets": "the workload has `prefix_cache_resets`: the API server's reset_prefix_cache "
                           "between steps, its result recorded (false while blocks are in use)",
    "async_scheduling": "async scheduling resolved on: the oracle's `config` record says "
                        "`async_scheduling_gpu` true (vLLM's default differs by release), or, without "
                        "one, `engine_args.async_scheduling` true",
    "vllm_log_lines": "the engine prints vLLM's own log lines while it resolves a configuration, so "
                      "`budget_log_lines` and `async_log_lines` are judged word for word (no scenario needs "
                      "it). An engine whose hello lists features without it (a foreign engine) is judged "
                      "without them: on its behaviour",
}
# Features no scenario needs: they say how a run is judged (judging.judging.prints_log_lines).
JUDGING = ("vllm_log_lines",)
MAX_DECLARED = 256  # entries of hello.features
MAX_NAME = 64  # characters of one


def needed(engine_args: dict, workload: dict | None = None, method_matrix: dict | None = None,
           config: dict | None = None) -> tuple[str, ...]:
    """The features a scenario needs, in FEATURES order. `config` is the oracle's `config` record
    for the scenario (its golden's), which decides async scheduling where the scenario leaves it
    to vLLM's default."""
    args = engine_args if isinstance(engine_args, dict) else {}
    specs = [_dict(args.get("speculative_config"))]
    specs += [_dict(row.get("speculative_config")) for row in _dicts(_dict(method_matrix).get("rows"))]
    requests = _dicts(_dict(workload).get("requests"))
    threshold = args.get("long_prefill_token_threshold")
    found = {f"{SPEC}{spec.get('method')}" for spec in specs if spec.get("method") is not None}
    found |= {name for name, needs in (
        ("parallel_drafting", any(spec.get("parallel_drafting") is True for spec in specs)),
        ("priority_policy", args.get("scheduling_policy") == "priority"),
        ("request_priorities", any(r.get("priority", 0) != 0 for r in requests)),
        ("prefix_caching", args.get("enable_prefix_caching", True) is not False),
        ("chunked_prefill_off", args.get("enable_chunked_prefill", True) is False),
        ("long_prefill_threshold", _number(threshold) and threshold > 0),
        ("max_num_scheduled_tokens", args.get("max_num_scheduled_tokens") is not None),
        ("aborts", any(r.get("abort_step") is not None for r in requests)),
        ("shared_prefixes", any(r.get("prefix") is not None or r.get("continues") is not None
                                for r in requests)),
        ("min_tokens", any(_number(r.get("min_tokens")) and r["min_tokens"] > 0 for r in requests)),
        ("stop_token_ids", any(r.get("stop_token_ids") for r in requests)),
        ("eos", any(r.get("eos_token_id") is not None for r in requests)),
        ("repetition_detection", any(_number(_dict(r.get("repetition_detection")).get("max_pattern_size"))
                                     and r["repetition_detection"]["max_pattern_size"] > 0 for r in requests)),
        ("kv_connector", args.get("kv_transfer_config") is not None),
        ("structured_outputs", any(r.get("structured_output") is not None for r in requests)),
        ("sliding_window", _hybrid(args.get("model"))),
        ("mamba", _mamba(args.get("model"))),
        ("lora", args.get("enable_lora") is True or any(r.get("lora") is not None for r in requests)),
        ("encoder_inputs", any(r.get("encoder_inputs") for r in requests)),
        ("streaming_input", any(r.get("session") is not None for r in requests)),
        ("reasoning", bool(args.get("reasoning_parser"))),
        ("kv_cache_events", _dict(args.get("kv_events_config")).get("enable_kv_cache_events") is True),
        ("prefix_cache_resets", bool(_dict(workload).get("prefix_cache_resets"))),
        ("async_scheduling", _async(args, config)),
    ) if needs}
    return tuple(name for name in FEATURES if name in found) + tuple(sorted(found - set(FEATURES)))


def decided_by_config(engine_args: dict) -> bool:
    """Whether the oracle's config record decides a feature of this scenario: async scheduling
    left to vLLM's default (null), which differs by release."""
    return isinstance(engine_args, dict) and "async_scheduling" in engine_args \
        and engine_args["async_scheduling"] is None


def _hybrid(model: object) -> bool:
    """Whether the model folder's config.json mixes sliding-window layers with others: the
    stand-in then builds one KV cache group per attention type (engines/vllm/release.py). The
    scenario loader has read and checked that file; a path that is not one needs nothing."""
    types = _model_config(model).get("layer_types")
    return isinstance(types, list) and "sliding_attention" in types and len(set(map(str, types))) > 1


def _mamba(model: object) -> bool:
    """Whether the model folder's config.json has mamba layers beside attention layers: a
    Nemotron-H `hybrid_override_pattern` with both `M` and `*` (engines/vllm/release.py's
    layer_kinds reads the same pattern)."""
    pattern = _model_config(model).get("hybrid_override_pattern")
    return isinstance(pattern, str) and "M" in pattern and "*" in pattern


def _model_config(model: object) -> dict:
    """The model folder's config.json, or {} where there is none to read."""
    if not isinstance(model, str):
        return {}
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _async(args: dict, config: dict | None) -> bool:
    resolved = _dict(config).get("async_scheduling_gpu")
    if isinstance(resolved, bool):
        return resolved
    return args.get("async_scheduling") is True


def declared(hello: dict) -> frozenset[str] | None:
    """The features an engine's hello declares; None when it says nothing (every feature)."""
    value = hello.get("features")
    return None if value is None else frozenset(x for x in value if isinstance(x, str))


def not_declared(needs, have: frozenset[str] | None) -> tuple[str, ...]:
    """The features of `needs` an engine declaring `have` does not have, in their order; and
    `prefix_caching_off` for a scenario with prefix caching off (it does not need
    `prefix_caching`) on an engine that declares prefix caching it cannot turn off."""
    if have is None:
        return ()
    lacking = tuple(name for name in needs if name not in have)
    if "prefix_caching" in have and "prefix_caching_off" not in have and "prefix_caching" not in needs:
        lacking += ("prefix_caching_off",)
    return lacking


def declared_problem(value) -> tuple[str, bool] | None:
    """What is wrong with a hello's `features`, and whether it is a limit exceeded; None when it
    is a list of at most MAX_DECLARED known feature names."""
    if not isinstance(value, list):
        return f"expected hello.features to be a list of feature names, got {type(value).__name__}", False
    if len(value) > MAX_DECLARED:
        return f"expected hello.features of at most {MAX_DECLARED} names, got {len(value)}", True
    for item in value:
        if not isinstance(item, str):
            return f"expected hello.features to hold strings, got {item!r:.80}", False
        if len(item) > MAX_NAME:
            return (f"expected feature names of at most {MAX_NAME} characters in hello.features, "
                    f"got one of {len(item)}"), True
    unknown = sorted({item for item in value if item not in FEATURES})
    if unknown:
        return (f"expected hello.features to name features this harness knows (engines/PROTOCOL.md "
                f"\"Features\"), got unknown {', '.join(repr(x) for x in unknown[:20])}"
                f"{' and more' if len(unknown) > 20 else ''}; known: {', '.join(FEATURES)}"), False
    return None


def parse_required(text: str, option: str = "--require-features") -> list[str]:
    """A comma list of feature names, `all` (every feature) or `none` (no feature: the gate's
    default requirement opted out); an unknown name is refused, naming it and the known ones."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if names == ["all"]:
        return list(FEATURES)
    if names == ["none"]:
        return []
    unknown = [x for x in names if x not in FEATURES]
    if unknown or not names:
        raise InputError(f"{option}: expected `all`, `none` or feature names, got unknown {unknown or [text]}; "
                         f"known: {', '.join(FEATURES)}")
    return [name for name in FEATURES if name in names]


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _dicts(value) -> list[dict]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
