"""Tiny LoRA adapters made by the project itself, byte-identical on every machine, like the tiny
models they adapt (tiny_models.py).

A request's adapter ``{"id": N, "name": NAME}`` on the engine layers is the committed folder
``<model folder>/adapters/NAME/`` of its scenario's model, holding PEFT's ``adapter_config.json``
(what vLLM's PEFTHelper reads: ``r``, ``lora_alpha``, ``target_modules``) and ``weights.json``::

    {"schema": "vllm-parity/tiny-adapter/1", "recipe": "lora", "seed": 1,
     "sha256": "<sha256 of adapter_model.safetensors>", "scales_log2": {"lora_A": -18, ...}}

No weight file is committed. :func:`materialize` generates ``adapter_model.safetensors`` (PEFT's
tensor names, ``base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_A.weight`` of
shape (r, in) and ``lora_B.weight`` of shape (out, r), for every decoder layer of the base
model's config.json and every target module) into
``<cache_root>/tiny-models/<model>-adapter-<NAME>-<sha12>/`` beside a copy of
``adapter_config.json``, verified against ``sha256``, as the tiny models are. Every tensor is
drawn as tiny_models draws a model's (its own PCG64 stream of int32 in [-2**15, 2**15), times a
power-of-two scale: exact, so the bytes depend on no CPU or numpy build). lora_B is random,
not PEFT's zeros (a freshly initialised adapter changes nothing), so the adapter changes the
model's tokens.

    python engines/vllm/tiny_adapters.py --print-sha scenarios/models/tiny-qwen3/adapters/alpha
    python engines/vllm/tiny_adapters.py --materialize scenarios/models/tiny-qwen3/adapters/alpha
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

if __package__:
    from . import tiny_models
else:  # run as a script, inside a vLLM environment
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from engines.vllm import tiny_models

SCHEMA = "vllm-parity/tiny-adapter/1"
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
FOLDER = "adapters"  # <model folder>/adapters/<name>/
# lora_A -18: std ~0.072, as the base's linear weights; lora_B -17: std ~0.14. With r 8 and
# lora_alpha 16 (vLLM scales B @ A by alpha / r) the update's entries have std ~0.06, of the
# base weights' size: the adapter moves the greedy tokens, where a tiny update would leave the
# argmax alone and a huge one would drown the base model.
DEFAULT_SCALES_LOG2 = {"lora_A": -18, "lora_B": -17}
# Where each module PEFT may target sits in a Qwen3 / Llama decoder block, and its (out, in).
MODULES = {
    "q_proj": ("self_attn", lambda c: (c["num_attention_heads"] * _head_dim(c), c["hidden_size"])),
    "k_proj": ("self_attn", lambda c: (_kv_heads(c) * _head_dim(c), c["hidden_size"])),
    "v_proj": ("self_attn", lambda c: (_kv_heads(c) * _head_dim(c), c["hidden_size"])),
    "o_proj": ("self_attn", lambda c: (c["hidden_size"], c["num_attention_heads"] * _head_dim(c))),
    "gate_proj": ("mlp", lambda c: (c["intermediate_size"], c["hidden_size"])),
    "up_proj": ("mlp", lambda c: (c["intermediate_size"], c["hidden_size"])),
    "down_proj": ("mlp", lambda c: (c["hidden_size"], c["intermediate_size"])),
}


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _kv_heads(cfg: dict) -> int:
    return cfg.get("num_key_value_heads", cfg["num_attention_heads"])


def adapter_dir(model_dir: Path, name: str) -> Path:
    """The committed folder of a request's adapter `name` on the model folder `model_dir`."""
    return Path(model_dir) / FOLDER / name


def _base_dir(folder: Path) -> Path:
    """The model folder an adapter folder belongs to (<model>/adapters/<name>)."""
    return Path(folder).resolve().parent.parent


def _load_spec(folder: Path) -> tuple[dict, dict, dict]:
    """(the base model's config, adapter_config.json, weights.json) of an adapter folder."""
    folder = Path(folder)
    meta = tiny_models._read_json(folder / "weights.json")
    if meta.get("schema") != SCHEMA or meta.get("recipe") != "lora":
        raise ValueError(f"{folder.name}: weights.json must have schema {SCHEMA!r} and recipe 'lora', "
                         f"got {meta.get('schema')!r} and {meta.get('recipe')!r}")
    adapter = tiny_models._read_json(folder / CONFIG)
    unknown = sorted(set(adapter.get("target_modules") or ()) - set(MODULES))
    if unknown or not adapter.get("target_modules"):
        raise ValueError(f"{folder.name}: {CONFIG} target_modules must be a non-empty list of "
                         f"{sorted(MODULES)}, got {adapter.get('target_modules')!r}")
    return tiny_models._read_json(_base_dir(folder) / "config.json"), adapter, meta


def recipe_lora(cfg: dict, adapter: dict) -> dict:
    """name -> (shape, kind) of every tensor, PEFT's names."""
    spec, r = {}, int(adapter["r"])
    for i in range(cfg["num_hidden_layers"]):
        for module in adapter["target_modules"]:
            block, shape = MODULES[module]
            out_features, in_features = shape(cfg)
            p = f"base_model.model.model.layers.{i}.{block}.{module}."
            spec[p + "lora_A.weight"] = ((r, in_features), "lora_A")
            spec[p + "lora_B.weight"] = ((out_features, r), "lora_B")
    return spec


def build_tensors(cfg: dict, adapter: dict, meta: dict) -> dict:
    import numpy as np

    scales = {**DEFAULT_SCALES_LOG2, **(meta.get("scales_log2") or {})}
    seed = int(meta["seed"])
    tensors = {}
    for name, (shape, kind) in sorted(recipe_lora(cfg, adapter).items()):
        digest = hashlib.sha256(f"{SCHEMA}:{seed}:{name}".encode()).digest()
        rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:8], "little")))
        ints = rng.integers(tiny_models.INT_LOW, tiny_models.INT_HIGH, size=shape, dtype=np.int32)
        tensors[name] = np.ascontiguousarray(ints.astype(np.float32) * np.float32(2.0 ** int(scales[kind])))
    return tensors


def write_safetensors(folder: Path, path: Path) -> str:
    """Generate the recipe's adapter_model.safetensors at ``path``; return its sha256."""
    payload = tiny_models.encode_safetensors(build_tensors(*_load_spec(folder)))
    Path(path).write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()


def materialize(folder: Path, cache_root: Path) -> Path:
    """``cache_root/tiny-models/<model>-adapter-<name>-<sha12>/`` holding adapter_config.json and
    the adapter_model.safetensors weights.json makes (tiny_models.build_folder)."""
    folder = Path(folder).resolve()
    _cfg, _adapter, meta = _load_spec(folder)
    return tiny_models.build_folder(
        f"{_base_dir(folder).name}-adapter-{folder.name}", str(meta.get("sha256") or ""),
        folder / "weights.json", {CONFIG: (folder / CONFIG).read_bytes()}, WEIGHTS,
        lambda path: write_safetensors(folder, path), cache_root)


def main(argv: list[str] | None = None) -> int:
    return tiny_models.recipe_main(argv, __doc__.split("\n\n")[0], WEIGHTS, write_safetensors, materialize)


if __name__ == "__main__":
    sys.exit(main())
