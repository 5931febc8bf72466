"""Scenario files: a gate configuration (vLLM's own argument names) plus a workload.

Everything is validated here, before any engine starts, and every error names the field.
Model paths are resolved relative to the scenario file and must be local folders holding a
config.json: nothing is ever loaded from a hub. The scenario hash covers the content of
those config files, not their location, so the same scenario hashes the same anywhere.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from conformance.formats.features import needed as _needed
from conformance.formats.fields import (METHODS, METHODS_WITH_DRAFT_MODEL, ScenarioError,
                                        model_dir as _model_dir)
from conformance.formats.fields import type_name as _tname
from conformance.formats.files import InputFileError, read_bytes, read_text
from conformance.formats.method_matrix import validate_method_matrix
from conformance.formats.protocol import ENGINE_LAYERS
from conformance.formats.workload import validate_workload
from conformance.formats.workload_gen import expand as expand_workload

SCHEMA = "vllm-parity/scenario/1"
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
MAX_TOKENS_LIMIT = 1 << 20  # far above any gate configuration; rejects absurd sizes


# Field -> (type, required). The keys are vLLM's own EngineArgs names, as in `vllm serve`.
# Platform-dependent defaults (block size, chunked prefill, async scheduling) are required, so
# a CPU run and a GPU run of one scenario resolve the same configuration. Prefix caching may be
# left out: it is then vLLM's own default, true (CacheConfig.enable_prefix_caching), written
# into engine_args before hashing (DEFAULTS), so every platform resolves the same value and a
# file that omits it hashes as one that says true.
ENGINE_ARGS: dict[str, tuple[type, bool]] = {
    "model": (str, True),
    "load_format": (str, True),
    "max_num_seqs": (int, True),
    "max_num_batched_tokens": (int, True),
    "max_model_len": (int, True),
    "block_size": (int, True),
    "enable_prefix_caching": (bool, False),
    "enable_chunked_prefill": (bool, True),
    # null: vLLM's default, which each platform resolves by its own rule (the config record
    # carries both); the one platform-dependent field that may be left to vLLM
    "async_scheduling": ((bool, type(None)), True),
    "dtype": (str, False),
    "seed": (int, False),
    "max_num_scheduled_tokens": (int, False),
    "long_prefill_token_threshold": (int, False),
    "num_gpu_blocks_override": (int, False),
    "scheduling_policy": (str, False),
    "speculative_config": (dict, False),
    "kv_transfer_config": (dict, False),
    # LoRA: what the scheduler reads (LoRAConfig.max_loras bounds the adapters of a step); the
    # rank only sizes the adapters' weights, kept so a file states the whole LoRA configuration
    "enable_lora": (bool, False),
    "max_loras": (int, False),
    "max_lora_rank": (int, False),
    # encoder inputs: a chunk may not end inside an item's placeholder (SchedulerConfig)
    "disable_chunked_mm_input": (bool, False),
    # hybrid mamba models (engines/PROTOCOL.md "Hybrid mamba models"): which mamba states the
    # prefix cache keeps (vLLM's CacheConfig.mamba_cache_mode), and the finer unit block hashes
    # are computed by (CacheConfig.prefix_match_unit, hybrid models only)
    "mamba_cache_mode": (str, False),
    "prefix_match_unit": (int, False),
    # Structured outputs after reasoning: the release's reasoning parser (a name in its registry)
    # tells the StructuredOutputManager where reasoning ends, and the grammar applies after it;
    # `tokenizer` a folder beside the model holding the parser's tokens (TOKENIZER_FILES)
    "reasoning_parser": (str, False),
    "tokenizer": (str, False),
    "structured_outputs_config": (dict, False),  # STRUCTURED_OUTPUTS_CONFIG's keys
    # KV cache events (vLLM's --kv-events-config): recorded per step from the batch the
    # scheduler publishes, through vLLM's "null" publisher (nothing goes on the network)
    "kv_events_config": (dict, False),
}
MAMBA_CACHE_MODES = ("none", "align", "all")  # vLLM 0.27.1's MambaCacheMode
# Keys of --structured-outputs-config run here: enable_in_reasoning, the grammar applied during
# reasoning too (the manager's own switch)
STRUCTURED_OUTPUTS_CONFIG: dict[str, tuple[type, bool]] = {"enable_in_reasoning": (bool, True)}
REASONING_PARSER = re.compile(r"^[a-z0-9][a-z0-9_]{0,63}$")  # a name in vLLM's ReasoningParserManager
DEFAULTS = {"enable_prefix_caching": True}
# Keys of --speculative-config.
SPECULATIVE_CONFIG: dict[str, tuple[type, bool]] = {
    "method": (str, True),
    "num_speculative_tokens": (int, True),
    "model": (str, False),  # required for methods that run a draft model (checked below)
    "parallel_drafting": (bool, False),
    "prompt_lookup_max": (int, False),
    "prompt_lookup_min": (int, False),
}
# Keys of --kv-transfer-config. The connector is the stand-in's (engines/vllm/kv_connector.py, a
# TEST DOUBLE of a remote KV store that the workload's `external` requests describe); the stand-in
# layers only: the engine layers have no remote store to load from.
KV_TRANSFER_CONFIG: dict[str, tuple[type, bool]] = {
    "kv_connector": (str, True),
    "kv_role": (str, True),
    "kv_load_failure_policy": (str, False),
}
KV_EVENTS_CONFIG: dict[str, tuple[type, bool]] = {
    "enable_kv_cache_events": (bool, True),
    "publisher": (str, True),  # "null" only: vLLM's default with events on is "zmq", a socket
}
KV_CONNECTORS = ("StandInConnector",)
KV_ROLES = ("kv_both", "kv_consumer")  # a producer alone loads nothing
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")  # vLLM's default: fail
SIZE_FIELDS = (
    "max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
    "max_num_scheduled_tokens", "num_gpu_blocks_override", "num_speculative_tokens",
    "prompt_lookup_max", "prompt_lookup_min", "max_loras", "max_lora_rank", "prefix_match_unit",
)
# Other integers and their allowed ranges (inclusive).
RANGES = {"seed": (0, (1 << 63) - 1), "long_prefill_token_threshold": (0, MAX_TOKENS_LIMIT)}
TOP_LEVEL = {"schema", "name", "description", "engine_args", "workload", "method_matrix", "rows", "engine",
             "generate", "scale"}
# `scale`: "library" (the default) runs everywhere; "production" marks a generated scenario at
# production shapes, left out of `make test` and the default gate (`--scale`), judged in the
# digest form (conformance/formats/digest.py). Like `rows`, not part of the hash.
SCALES = ("library", "production")
# The `engine` block: this scenario runs the whole engine (the engine layers) on its workload.
# key -> (type, low, high). logprob_atol (the comparison's tolerance) and logprob_noise (the
# noise it was calibrated on, measured by benchmarks/bench_noise.py) say how runs are judged,
# not what an engine runs: they stay out of the scenario hash (like `rows`) and out of the
# engine's input.
ENGINE_OPTIONS = {"logprobs": (int, 1, 20), "logprob_decimals": (int, 0, 8),
                  "logprob_atol": (float, 0.0, 10.0), "logprob_noise": (float, 0.0, 10.0)}
# Four decimals: 10x finer than the float32 tolerance below, so rounding never decides a
# comparison. Token ids carry the exact check.
DEFAULT_ENGINE = {"logprobs": 5, "logprob_decimals": 4}
# By the scenario's dtype. float32: at least 10x the largest noise measured on any engine
# scenario (2.4e-5, across oneDNN's ISA capped at SSE4.1, two compute threads and requests
# decoded alone, both CPU pins; benchmarks/bench_noise.py, docs/release-gate.md "On every machine"), which
# leaves 40x. bf16 / fp16 on a GPU: not measured here (no GPU); a few hundredths expected.
DEFAULT_ATOL = {"float32": 0.001, "bfloat16": 0.5, "float16": 0.3}
# Workload keys the engine layers do not run: the engine's outputs are its model's, not the
# stand-in's a continuation is built from, its loop has no aborts, its eos token is its
# tokenizer's (not a stand-in token id), its outputs record no repetition stop, and it has no
# remote KV store. (A request's `priority`, `min_tokens`, `structured_output`, `prefix` and `lora`
# are run: the engine's add_request and SamplingParams take them, a prefix's tokens are the
# stand-in's, and an adapter is the model folder's adapters/<name>, ADAPTER_FILES.)
STEPS_ONLY = ("continues", "abort_step", "eos_token_id", "repetition_detection", "external", "reasoning_end",
              "session",  # a streaming session: the engine's loop takes no input chunks
              "kv_cache_report_mode")
# ... nor multimodal items: the tiny models have no encoder (the stand-in's steps layer runs a
# multimodal model's scheduler from its config and processor files, PROCESSOR_FILES)
STEPS_ONLY += ("encoder_inputs",)
# What a multimodal model's folder holds beside config.json, read by the release's processor to
# compute the encoder budget (vLLM's MultiModalBudget): the scenario hash covers them
PROCESSOR_FILES = ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json")  # TOKENIZER_FILES too
# An adapter the engine layers load: <model folder>/adapters/<name>/ with PEFT's config and the
# recipe of its weights (engines/vllm/tiny_adapters.py), whose files the scenario hash covers
ADAPTER_FILES = ("adapter_config.json", "weights.json")
# A grammar judges text: a workload with a structured_output needs its model folder's tokenizer
# (the project's own, engines/vllm/tiny_tokenizer.py), whose files the scenario hash then covers
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ROW = re.compile(r"^[A-Z][A-Z0-9-]{1,40}$")  # an engine-matrix row, e.g. ENG-SCHED-CORE


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    engine_args: dict  # model paths made absolute
    workload: dict | None
    source: Path
    sha256: str
    method_matrix: dict | None = None
    rows: tuple[str, ...] = ("ENG-SCHED-CORE",)  # engine-matrix rows its verdicts belong to
    engine: dict | None = None  # the engine block as the engine gets it (DEFAULT_ENGINE's keys), or None
    logprob_atol: float | None = None  # engine layers' logprob tolerance
    # the largest cross-machine noise measured on this scenario's logprobs
    # (benchmarks/bench_noise.py), from which logprob_atol is calibrated; None if not measured
    logprob_noise: float | None = None
    scale: str = "library"  # SCALES

    @property
    def layers(self) -> list[str]:
        """The layers this scenario has something to say about."""
        layers = ["config"]
        if self.engine is not None:  # the real engine generates the workload
            layers += list(ENGINE_LAYERS)
        elif self.workload is not None:
            layers += ["steps", "outputs"]
        if self.method_matrix is not None:
            layers.append("methods")
        return layers

    @property
    def features(self) -> tuple[str, ...]:
        """The features it needs (conformance/formats/features.py), from its engine_args, workload
        and method matrix. Async scheduling left to vLLM's default (null) is the oracle's config
        record's to decide: judging.scenario_features adds it."""
        return _needed(self.engine_args, self.workload, self.method_matrix)

    def to_wire(self) -> dict:
        """What an engine receives in a `run` message."""
        wire = {"name": self.name, "sha256": self.sha256, "engine_args": self.engine_args,
                "workload": self.workload}
        if self.method_matrix is not None:
            wire["method_matrix"] = self.method_matrix
        if self.engine is not None:
            wire["engine"] = self.engine
        return wire

    def without_speculation(self) -> "Scenario":
        """The same scenario with speculative decoding off (outputs must not change)."""
        args = {k: v for k, v in self.engine_args.items() if k != "speculative_config"}
        return replace(self, name=self.name + ".no-spec", engine_args=args,
                       sha256=hashlib.sha256((self.sha256 + ":no-spec").encode()).hexdigest())


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    src = str(path)
    try:
        raw = json.loads(read_text(path, "scenario"), parse_constant=_reject_constant)
    except FileNotFoundError:
        raise ScenarioError(src, "<file>", "no such file") from None
    except InputFileError as exc:
        raise ScenarioError(src, "<file>", str(exc).removeprefix(f"{path}: ")) from None
    except OSError as exc:
        raise ScenarioError(src, "<file>", f"cannot be read: {exc}") from None
    except (json.JSONDecodeError, ValueError) as exc:
        raise ScenarioError(src, "<file>", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ScenarioError(src, "<file>", "nested too deeply to be a scenario") from None
    return parse_scenario(raw, path)


def parse_scenario(raw: object, path: Path) -> Scenario:
    src = str(path)
    if not isinstance(raw, dict):
        raise ScenarioError(src, "<top>", f"must be a JSON object, got {_tname(raw)}")
    _no_unknown(src, "", raw, TOP_LEVEL)
    if raw.get("schema") != SCHEMA:
        raise ScenarioError(src, "schema", f"must be {SCHEMA!r}, got {raw.get('schema')!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ScenarioError(src, "name", "must be 1-64 characters of a-z 0-9 _ . - "
                            f"(it names golden files), got {name!r}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(src, "description", f"must be a string, got {_tname(description)}")
    base = path.resolve().parent
    args, hashed = _engine_args(src, raw.get("engine_args"), base)
    workload, generated = raw.get("workload"), raw.get("generate")
    if generated is not None:  # parameters, expanded here (conformance/formats/workload_gen.py)
        if workload is not None:
            raise ScenarioError(src, "generate", "a scenario holds a `workload` or `generate`, not both")
        workload = expand_workload(generated, src, args)
    if workload is not None:
        workload = validate_workload(workload, src, args)
    identity = {"schema": SCHEMA, "name": name, "engine_args": hashed, "workload": workload}
    if workload is not None and any("structured_output" in r for r in workload["requests"]):
        identity["tokenizer"] = _tokenizer(src, Path(args.get("tokenizer", args["model"])))
        if args.get("reasoning_parser") and args["async_scheduling"] is not False:
            # the async stand-in runner follows grammars, not a reasoning end (engines/vllm/async_loop.py)
            raise ScenarioError(src, "engine_args.async_scheduling", "must be false under a reasoning_parser: "
                                "the stand-in runs reasoning in the synchronous loop only")
    if workload is not None and any("encoder_inputs" in r for r in workload["requests"]):
        identity["processor"] = _processor(src, Path(args["model"]))
    if generated is not None:  # the hash covers the expansion and the generator that made it
        identity["generator"] = generated["generator"]
    matrix = raw.get("method_matrix")
    if matrix is not None:
        matrix, identity["method_matrix"] = validate_method_matrix(matrix, src, base)
    engine, atol, noise = _engine_options(src, raw.get("engine"), args, workload)
    if engine is not None:
        identity["engine"] = engine
        if any("lora" in r for r in workload["requests"]):  # the engine loads each adapter's weights
            identity["adapters"] = _adapters(src, Path(args["model"]), workload["requests"])
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    rows = raw.get("rows", ["ENG-SCHED-CORE"])
    if not isinstance(rows, list) or not rows or not all(isinstance(r, str) and ROW.fullmatch(r) for r in rows):
        raise ScenarioError(src, "rows", f"must be a non-empty list of engine-matrix row names "
                            f"like 'ENG-SCHED-CORE', got {rows!r}")
    scale = raw.get("scale", "library")
    if scale not in SCALES:
        raise ScenarioError(src, "scale", f"must be one of {list(SCALES)}, got {scale!r}")
    # rows are how verdicts are grouped, not what an engine runs: they are not in the hash
    return Scenario(name, description, args, workload, path, digest, matrix, tuple(rows), engine, atol,
                    noise, scale=scale)


def _engine_args(src: str, args: object, base: Path) -> tuple[dict, dict]:
    """`engine_args` checked, defaults filled in, model folders made absolute: (args, hashed),
    `hashed` naming each model folder by its config's hash, for the scenario's hash."""
    if not isinstance(args, dict):
        raise ScenarioError(src, "engine_args", f"must be an object, got {_tname(args)}")
    args = {**DEFAULTS, **_check_fields(src, "engine_args", args, ENGINE_ARGS)}
    hashed = dict(args)
    args["model"], hashed["model"] = _model_dir(src, "engine_args.model", args["model"], base)
    if args["load_format"] != "dummy":
        raise ScenarioError(src, "engine_args.load_format",
                            f"must be 'dummy' (no weights are ever loaded), got {args['load_format']!r}")
    if args.get("speculative_config") is not None:
        args["speculative_config"], hashed["speculative_config"] = _speculative_config(
            src, args["speculative_config"], base)
    if args.get("kv_transfer_config") is not None:
        args["kv_transfer_config"] = hashed["kv_transfer_config"] = _kv_transfer(src, args["kv_transfer_config"])
    if args.get("mamba_cache_mode", "none") not in MAMBA_CACHE_MODES:
        raise ScenarioError(src, "engine_args.mamba_cache_mode", f"must be one of {list(MAMBA_CACHE_MODES)} "
                            f"(vLLM's CacheConfig.mamba_cache_mode), got {args['mamba_cache_mode']!r}")
    _reasoning(src, args, hashed, base)
    if args.get("kv_events_config") is not None:
        args["kv_events_config"] = hashed["kv_events_config"] = _kv_events(src, args["kv_events_config"])
    _check_sizes(src, args)
    return args, hashed


def _kv_events(src: str, raw: dict) -> dict:
    config = _check_fields(src, "engine_args.kv_events_config", raw, KV_EVENTS_CONFIG)
    if config["publisher"] != "null":
        raise ScenarioError(src, "engine_args.kv_events_config.publisher", "must be 'null': the events are "
                            "read from the batch the scheduler publishes, never sent on a network (vLLM's "
                            f"zmq publisher would open a socket), got {config['publisher'][:40]!r}")
    return config


def _speculative_config(src: str, spec: object, base: Path) -> tuple[dict, dict]:
    """`engine_args.speculative_config`: (spec, hashed), its draft model folder made absolute."""
    spec = _check_fields(src, "engine_args.speculative_config", spec, SPECULATIVE_CONFIG)
    hashed_spec = dict(spec)
    method = spec["method"]
    if method not in METHODS:
        raise ScenarioError(src, "engine_args.speculative_config.method",
                            f"unknown method {method!r}; expected one of {sorted(METHODS)}")
    if method in METHODS_WITH_DRAFT_MODEL and method != "mtp" and "model" not in spec:
        raise ScenarioError(src, "engine_args.speculative_config.model",
                            f"method {method!r} needs a draft model config folder")
    if "model" in spec:
        spec["model"], hashed_spec["model"] = _model_dir(
            src, "engine_args.speculative_config.model", spec["model"], base)
    return spec, hashed_spec


def _reasoning(src: str, args: dict, hashed: dict, base: Path) -> None:
    """`reasoning_parser` a registry name; `tokenizer` a folder (made absolute) holding
    TOKENIZER_FILES, hashed by their content (the scenario hash does not depend on where it is)."""
    if args.get("structured_outputs_config") is not None:
        args["structured_outputs_config"] = hashed["structured_outputs_config"] = _check_fields(
            src, "engine_args.structured_outputs_config", args["structured_outputs_config"], STRUCTURED_OUTPUTS_CONFIG)
    parser = args.get("reasoning_parser")
    if parser is not None and not REASONING_PARSER.fullmatch(parser):
        raise ScenarioError(src, "engine_args.reasoning_parser", f"must be a reasoning parser's name in vLLM's "
                            f"registry (e.g. 'deepseek_r1'), 1-64 characters of a-z 0-9 _, got {parser[:80]!r}")
    if "tokenizer" not in args:
        return
    value = args["tokenizer"]
    try:
        folder = (base / value).resolve() if "\x00" not in value else None
        found = folder is not None and all((folder / name).is_file() for name in TOKENIZER_FILES)
    except (OSError, ValueError):
        found = False
    if not found:
        raise ScenarioError(src, "engine_args.tokenizer", f"{value[:80]!r} is not a local folder holding "
                            f"{' and '.join(TOKENIZER_FILES)} (relative to the scenario); hub ids are not allowed")
    args["tokenizer"] = str(folder)
    hashed["tokenizer"] = _tokenizer(src, folder)


GRAMMAR_NEEDS = "a structured_output needs the model folder's {name} (a grammar judges text; " \
                "engines/vllm/tiny_tokenizer.py makes the tiny models' one)"


def _tokenizer(src: str, folder: Path, needs: str = GRAMMAR_NEEDS) -> str:
    """The hash of the model folder's tokenizer files, which a grammar reads (`needs`: who
    needs them, for the error)."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = folder / name
        try:
            data = read_bytes(path, "tokenizer")
        except (OSError, InputFileError) as exc:
            raise ScenarioError(src, "workload.requests", f"{needs.format(name=name)}: {path} cannot be read: "
                                f"{exc}") from None
        digest.update(data)
    return "sha256:" + digest.hexdigest()


def _processor(src: str, folder: Path) -> str:
    """The hash of a multimodal model folder's processor files (its processor config and its
    tokenizer), from which the release computes the encoder budget and cache size."""
    needs = "encoder_inputs need a multimodal model folder with {name} (scenarios/models/qwen2-audio-tiny)"
    path = folder / PROCESSOR_FILES[0]
    try:
        data = read_bytes(path, "model config")
    except (OSError, InputFileError) as exc:
        raise ScenarioError(src, "workload.requests", f"{needs.format(name=path.name)}: {path} cannot be read: "
                            f"{exc}") from None
    return f"sha256:{hashlib.sha256(data).hexdigest()} {_tokenizer(src, folder, needs)}"


def _adapters(src: str, folder: Path, requests: list[dict]) -> dict[str, str]:
    """The hash of each adapter's files, by name: the engine layers load a request's adapter
    from its model folder's adapters/<name>/ (a tiny model's, made from its recipe)."""
    hashes: dict[str, str] = {}
    for i, req in enumerate(requests):
        name = req.get("lora", {}).get("name")
        if name is None or name in hashes:
            continue
        digest = hashlib.sha256()
        for file in ADAPTER_FILES:
            path = folder / "adapters" / name / file
            try:
                digest.update(read_bytes(path, "model config"))
            except (OSError, InputFileError) as exc:
                raise ScenarioError(src, f"workload.requests[{i}].lora.name", f"the engine layers load adapter "
                                    f"{name!r} from the model folder's adapters/{name}/ (engines/vllm/"
                                    f"tiny_adapters.py makes the tiny models' ones): {path} cannot be read: "
                                    f"{exc}") from None
        hashes[name] = "sha256:" + digest.hexdigest()
    return hashes


def _kv_transfer(src: str, raw: dict) -> dict:
    where = "engine_args.kv_transfer_config"
    config = _check_fields(src, where, raw, KV_TRANSFER_CONFIG)
    for key, allowed in (("kv_connector", KV_CONNECTORS), ("kv_role", KV_ROLES),
                         ("kv_load_failure_policy", KV_LOAD_FAILURE_POLICIES)):
        if key in config and config[key] not in allowed:
            raise ScenarioError(src, f"{where}.{key}", f"must be one of {list(allowed)}, got {config[key]!r}")
    return config


def at_scale(scenarios: list, scale: str) -> list:
    """The scenarios of `scale` ("library", "production", or "all")."""
    if scale not in (*SCALES, "all"):
        raise ValueError(f"expected a scale among {[*SCALES, 'all']}, got {scale!r}")
    return [s for s in scenarios if scale in ("all", s.scale)]


def _engine_options(src: str, raw, args: dict, workload) -> tuple[dict | None, float | None, float | None]:
    if raw is None:
        return None, None, None
    if not isinstance(raw, dict):
        raise ScenarioError(src, "engine", f"must be an object, got {_tname(raw)}")
    _no_unknown(src, "engine.", raw, set(ENGINE_OPTIONS))
    for key, (typ, low, high) in ENGINE_OPTIONS.items():
        if key not in raw:
            continue
        value = raw[key]
        ok = isinstance(value, (int, float) if typ is float else typ) and not isinstance(value, bool)
        if not ok or not low <= value <= high or (typ is float and value == 0):
            raise ScenarioError(src, f"engine.{key}", f"must be a {typ.__name__} in "
                                f"{'(' if typ is float else '['}{low}, {high}], got {value!r}")
    if workload is None:
        raise ScenarioError(src, "workload", "is required with `engine`: the engine generates it")
    if args.get("kv_transfer_config") is not None:
        raise ScenarioError(src, "engine_args.kv_transfer_config", "is not run by the engine layers (the "
                            "stand-in's connector has no worker side): a scenario with `engine` cannot use it")
    for key in ("kv_events_config",):
        if args.get(key) is not None:
            raise ScenarioError(src, f"engine_args.{key}", "is not run by the engine layers (their records "
                                "hold no KV cache events): a scenario with `engine` cannot use it")
    if "prefix_cache_resets" in workload:
        raise ScenarioError(src, "workload.prefix_cache_resets", "is not run by the engine layers (their loop "
                            "takes no API-server calls): a scenario with `engine` cannot use it")
    for i, req in enumerate(workload["requests"]):
        for key in STEPS_ONLY:
            if key in req:
                raise ScenarioError(src, f"workload.requests[{i}].{key}", "is not run by the engine layers "
                                    "(the stand-in's steps layer only): a scenario with `engine` cannot use it")
    engine = {k: raw.get(k, v) for k, v in DEFAULT_ENGINE.items()}
    atol = float(raw.get("logprob_atol", DEFAULT_ATOL.get(args.get("dtype", "float32"), 0.1)))
    noise = raw.get("logprob_noise")
    return engine, atol, None if noise is None else float(noise)


def _check_fields(src: str, where: str, obj: dict, schema: dict[str, tuple]) -> dict:
    _no_unknown(src, where + ".", obj, set(schema))
    for key, (typ, required) in schema.items():
        if key not in obj:
            if required:
                raise ScenarioError(src, f"{where}.{key}", "is required")
            continue
        value = obj[key]
        # bool is a subclass of int in Python; a size given as `true` is still a type error.
        ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
        if not ok:
            raise ScenarioError(src, f"{where}.{key}", f"must be {_type_words(typ)}, got {_tname(value)}")
    return dict(obj)


def _type_words(typ) -> str:
    kinds = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)


def _check_sizes(src: str, args: dict) -> None:
    spec = args.get("speculative_config") or {}
    for key in SIZE_FIELDS:
        for where, obj in (("engine_args", args), ("engine_args.speculative_config", spec)):
            if key in obj and not 1 <= obj[key] <= MAX_TOKENS_LIMIT:
                raise ScenarioError(src, f"{where}.{key}",
                                    f"must be between 1 and {MAX_TOKENS_LIMIT}, got {obj[key]}")
    for key, (low, high) in RANGES.items():
        if key in args and not low <= args[key] <= high:
            raise ScenarioError(src, f"engine_args.{key}", f"must be between {low} and {high}, got {args[key]}")


def _no_unknown(src: str, prefix: str, obj: dict, allowed: set[str]) -> None:
    for key in obj:
        if key not in allowed:
            raise ScenarioError(src, f"{prefix}{key!r}" if not key.strip() else f"{prefix}{key}",
                                f"unknown key; allowed: {sorted(allowed)}")


def _reject_constant(token: str):
    raise ValueError(f"{token} is not allowed")
