"""Tiny models made by the project itself, byte-identical on every machine.

A committed folder ``scenarios/models/tiny-<name>/`` holds ``config.json`` (the HF config vLLM
reads) and ``weights.json``::

    {"schema": "vllm-parity/tiny-weights/1", "recipe": "qwen3_causal_lm", "seed": 1,
     "sha256": "<sha256 of model.safetensors>", "scales_log2": {"embed": -14, ...}}

No weight file is committed. :func:`materialize` generates ``model.safetensors`` from the recipe
into ``<cache_root>/tiny-models/<dirname>-<sha12>/`` (next to a copy of ``config.json``),
verifies it against ``sha256`` and renames it into place atomically.

Portability: every tensor is drawn from its own ``numpy.random.Generator(PCG64(s))`` stream
(``s`` derived from the seed and the tensor name with sha256) as int32 integers in
``[-2**15, 2**15)``, then multiplied by a power-of-two scale in float32. Both steps are exact, so
the bytes do not depend on the CPU, the BLAS or the numpy build. Norm weights are 1.0, biases 0.

Runs inside a vLLM environment; needs numpy only (the file is written by :func:`encode_safetensors`,
readable by ``safetensors``); no torch.

    python engines/vllm/tiny_models.py --print-sha scenarios/models/tiny-qwen3
    python engines/vllm/tiny_models.py --materialize scenarios/models/tiny-qwen3 --cache-root DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

SCHEMA = "vllm-parity/tiny-weights/1"
INT_LOW, INT_HIGH = -(2**15), 2**15

# Default power-of-two scales (log2), overridable per model in weights.json "scales_log2".
# ints in [-2**15, 2**15) have std ~ 2**15/sqrt(3) ~ 2**14.2, so a scale of 2**e gives std
# ~ 2**(e + 14.2):
#   embed   -14 -> std ~1.15 (embeddings of unit size)
#   linear  -18 -> std ~0.072 (~1/sqrt(fan_in) for fan_in 128..256: healthy activations)
#   lm_head -10 -> std ~18: with a unit-RMS final hidden of width 128 the logits have std ~200,
#                  the drafters' default (only their argmax is read).
# The targets whose logprobs are recorded (tiny-qwen3, tiny-mimo) set lm_head -15 in their
# weights.json: logits of std ~6, so the output distributions look like a real model's (top-1
# probabilities spread over ~0.2-0.95, tenths of a nat between the top-5), where a logit bug
# shows in every logprob. A power-of-two scale changes no argmax: the greedy tokens, and so
# the top-1 margins measured against the noise, are those of -10 scaled exactly by 2**-5.
DEFAULT_SCALES_LOG2 = {"embed": -14, "linear": -18, "lm_head": -10}

# kind of each tensor: "embed" | "linear" | "lm_head" (random, scaled), "ones", "zeros".
Spec = dict  # name -> (shape tuple, kind)


# --------------------------------------------------------------------------- recipes


def _attn_mlp(spec: Spec, p: str, cfg: dict, *, qkv_in: int | None = None,
              qk_norm: bool = True, qkv_bias: bool = False) -> None:
    """One HF-named Qwen/Llama decoder block under prefix ``p`` (ends with '.')."""
    h = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or h // nh
    inter = cfg["intermediate_size"]
    qkv_in = qkv_in or h
    spec[p + "input_layernorm.weight"] = ((h,), "ones")
    spec[p + "post_attention_layernorm.weight"] = ((h,), "ones")
    spec[p + "self_attn.q_proj.weight"] = ((nh * hd, qkv_in), "linear")
    spec[p + "self_attn.k_proj.weight"] = ((nkv * hd, qkv_in), "linear")
    spec[p + "self_attn.v_proj.weight"] = ((nkv * hd, qkv_in), "linear")
    spec[p + "self_attn.o_proj.weight"] = ((h, nh * hd), "linear")
    if qkv_bias:
        spec[p + "self_attn.q_proj.bias"] = ((nh * hd,), "zeros")
        spec[p + "self_attn.k_proj.bias"] = ((nkv * hd,), "zeros")
        spec[p + "self_attn.v_proj.bias"] = ((nkv * hd,), "zeros")
    if qk_norm:
        spec[p + "self_attn.q_norm.weight"] = ((hd,), "ones")
        spec[p + "self_attn.k_norm.weight"] = ((hd,), "ones")
    spec[p + "mlp.gate_proj.weight"] = ((inter, h), "linear")
    spec[p + "mlp.up_proj.weight"] = ((inter, h), "linear")
    spec[p + "mlp.down_proj.weight"] = ((h, inter), "linear")


def recipe_qwen3_causal_lm(cfg: dict) -> Spec:
    """Qwen3ForCausalLM with HF checkpoint names (target, draft_model, PARD)."""
    spec: Spec = {}
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    spec["model.embed_tokens.weight"] = ((v, h), "embed")
    for i in range(cfg["num_hidden_layers"]):
        _attn_mlp(spec, f"model.layers.{i}.", cfg, qkv_bias=cfg.get("attention_bias", False))
    spec["model.norm.weight"] = ((h,), "ones")
    if not cfg.get("tie_word_embeddings", False):
        spec["lm_head.weight"] = ((v, h), "lm_head")
    return spec


def _aux_layer_count(cfg: dict) -> int:
    ids = (cfg.get("dflash_config") or {}).get("target_layer_ids")
    if not ids:
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return len(ids) if ids else cfg["num_hidden_layers"]


def recipe_dflash_qwen3(cfg: dict) -> Spec:
    """DFlash drafter (vLLM qwen3_dflash.py DFlashQwen3ForCausalLM.load_weights names).

    No embed_tokens / lm_head: vLLM shares them with the target.
    """
    spec: Spec = {}
    h = cfg["hidden_size"]
    target_h = cfg.get("target_hidden_size") or h
    for i in range(cfg["num_hidden_layers"]):
        _attn_mlp(spec, f"layers.{i}.", cfg, qkv_bias=cfg.get("attention_bias", False))
    spec["fc.weight"] = ((h, target_h * _aux_layer_count(cfg)), "linear")
    spec["hidden_norm.weight"] = ((h,), "ones")
    spec["norm.weight"] = ((h,), "ones")
    return spec


def recipe_eagle3_llama(cfg: dict) -> Spec:
    """Eagle3 drafter (vLLM llama_eagle3.py Eagle3LlamaForCausalLM.load_weights names).

    Layer 0 takes [embeds, hidden] (2*hidden) into q/k/v. No embed_tokens / lm_head / d2t:
    draft_vocab_size == vocab_size and vLLM shares embed/lm_head with the target.
    """
    spec: Spec = {}
    h = cfg["hidden_size"]
    target_h = cfg.get("target_hidden_size") or h
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        _attn_mlp(spec, p, cfg, qkv_in=2 * h if i == 0 else h, qk_norm=False,
                  qkv_bias=cfg.get("attention_bias", False))
        spec[p + "hidden_norm.weight"] = ((h,), "ones")
    spec["fc.weight"] = ((h, target_h * _aux_layer_count(cfg)), "linear")
    spec["norm.weight"] = ((h,), "ones")
    return spec


def recipe_mimo_causal_lm(cfg: dict) -> Spec:
    """MiMoForCausalLM (Qwen2 blocks, qkv bias) plus ``num_nextn_predict_layers`` MTP layers
    (model.mtp_layers.N.*, read by vLLM mimo_mtp.py MiMoMTP)."""
    spec: Spec = {}
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    spec["model.embed_tokens.weight"] = ((v, h), "embed")
    for i in range(cfg["num_hidden_layers"]):
        _attn_mlp(spec, f"model.layers.{i}.", cfg, qk_norm=False, qkv_bias=True)
    spec["model.norm.weight"] = ((h,), "ones")
    if not cfg.get("tie_word_embeddings", False):
        spec["lm_head.weight"] = ((v, h), "lm_head")
    for i in range(cfg.get("num_nextn_predict_layers", 0)):
        p = f"model.mtp_layers.{i}."
        _attn_mlp(spec, p, cfg, qk_norm=False, qkv_bias=True)
        spec[p + "token_layernorm.weight"] = ((h,), "ones")
        spec[p + "hidden_layernorm.weight"] = ((h,), "ones")
        spec[p + "input_proj.weight"] = ((h, 2 * h), "linear")
        spec[p + "final_layernorm.weight"] = ((h,), "ones")
    return spec


RECIPES = {
    "qwen3_causal_lm": recipe_qwen3_causal_lm,
    "dflash_qwen3": recipe_dflash_qwen3,
    "eagle3_llama": recipe_eagle3_llama,
    "mimo_causal_lm": recipe_mimo_causal_lm,
}


# --------------------------------------------------------------------------- generation


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{SCHEMA}:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _load_spec(model_dir: Path) -> tuple[dict, dict]:
    model_dir = Path(model_dir)
    cfg = _read_json(model_dir / "config.json")
    meta = _read_json(model_dir / "weights.json")
    if meta.get("schema") != SCHEMA:
        raise ValueError(f"{model_dir.name}: weights.json schema {meta.get('schema')!r}, "
                         f"expected {SCHEMA!r}")
    if meta.get("recipe") not in RECIPES:
        raise ValueError(f"{model_dir.name}: unknown recipe {meta.get('recipe')!r} "
                         f"(known: {sorted(RECIPES)})")
    return cfg, meta


def build_tensors(cfg: dict, meta: dict) -> dict:
    import numpy as np

    spec = RECIPES[meta["recipe"]](cfg)
    scales = dict(DEFAULT_SCALES_LOG2)
    scales.update(meta.get("scales_log2") or {})
    seed = int(meta["seed"])
    tensors = {}
    for name in sorted(spec):
        shape, kind = spec[name]
        if kind == "ones":
            arr = np.ones(shape, dtype=np.float32)
        elif kind == "zeros":
            arr = np.zeros(shape, dtype=np.float32)
        else:
            rng = np.random.Generator(np.random.PCG64(_tensor_seed(seed, name)))
            ints = rng.integers(INT_LOW, INT_HIGH, size=shape, dtype=np.int32)
            # |ints| <= 2**15 is exact in float32; times a power of two stays exact.
            arr = ints.astype(np.float32) * np.float32(2.0 ** int(scales[kind]))
        tensors[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return tensors


SAFETENSORS_METADATA = {"format": "pt"}


def encode_safetensors(tensors: dict) -> bytes:
    """Serialize float32 numpy arrays in the safetensors format, deterministically.

    Written by hand rather than with ``safetensors.numpy.save_file`` because that one keeps
    ``__metadata__`` in a Rust HashMap (its key order, hence the bytes, change from run to
    run with more than one key) and its layout may change between safetensors releases.
    Layout (identical to what save_file writes for all-F32 tensors and this one-key metadata):
    u64 little-endian header length, compact JSON header (``__metadata__`` first, then tensors
    in sorted name order) padded with spaces to a multiple of 8, then the raw little-endian
    data in the same order.
    """
    import numpy as np

    header: dict = {"__metadata__": SAFETENSORS_METADATA}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], dtype="<f4")
        data = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + b"".join(blobs)


def write_safetensors(model_dir: Path, path: Path) -> str:
    """Generate the recipe's model.safetensors at ``path``; return its sha256."""
    cfg, meta = _load_spec(model_dir)
    payload = encode_safetensors(build_tensors(cfg, meta))
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(payload).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def materialize(model_dir: Path, cache_root: Path) -> Path:
    """Return ``cache_root/tiny-models/<dirname>-<sha12>/`` holding config.json and
    model.safetensors generated from weights.json (built once, verified, renamed in atomically;
    reused when present)."""
    model_dir = Path(model_dir).resolve()
    _cfg, meta = _load_spec(model_dir)
    return build_folder(model_dir.name, str(meta.get("sha256") or ""), model_dir / "weights.json",
                        {"config.json": (model_dir / "config.json").read_bytes()}, "model.safetensors",
                        lambda path: write_safetensors(model_dir, path), cache_root)


def build_folder(name: str, expected: str, spec: Path, copies: dict, weights_name: str, write,
                 cache_root: Path) -> Path:
    """``cache_root/tiny-models/<name>-<sha12>/``: the files ``copies`` (name -> bytes) and the
    weights file ``write(path)`` generates (it returns their sha256, which must be ``expected``).
    Built once in a temporary folder, verified, renamed in atomically; reused when complete.
    Shared by the tiny models and their adapters (tiny_adapters.py)."""
    if len(expected) != 64:
        raise ValueError(f"{name}: {spec.name} has no sha256 (fill it with "
                         f"`python engines/vllm/{Path(__file__).name} --print-sha ...`)")
    parent = Path(cache_root) / "tiny-models"
    final = parent / f"{name}-{expected[:12]}"
    if _is_complete(final, copies, weights_name, expected):
        return final
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=parent))
    try:
        got = write(tmp / weights_name)
        if got != expected:
            raise ValueError(f"tiny model {name}: {weights_name} sha256 mismatch: "
                             f"expected {expected}, got {got}")
        for file, data in copies.items():
            (tmp / file).write_bytes(data)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache may be shared
        try:
            os.rename(tmp, final)
        except OSError:
            # Another caller won the race (final exists and is non-empty) or a stale,
            # incomplete folder is in the way.
            if not _is_complete(final, copies, weights_name, expected):
                stale = parent / f".{final.name}.stale-{os.getpid()}"
                try:
                    os.rename(final, stale)
                    shutil.rmtree(stale, ignore_errors=True)
                except OSError:
                    pass
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if not _is_complete(final, copies, weights_name, expected):
        raise RuntimeError(f"tiny model {name}: {final} incomplete after build")
    return final


def _is_complete(folder: Path, copies: dict, weights_name: str, sha256: str) -> bool:
    """The folder holds these files and weights of this sha256 (checked on every reuse: a few
    MB, milliseconds; a cache edited by hand is rebuilt, never loaded)."""
    try:
        return (all((folder / file).read_bytes() == data for file, data in copies.items())
                and _sha256_file(folder / weights_name) == sha256)
    except OSError:
        return False


def _cache_root() -> Path:
    """The harness's cache root; this file also runs as a script, outside the package."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from conformance.formats.settings import cache_root

    return cache_root()


def recipe_main(argv, description: str, weights: str, write, materialize_one) -> int:
    """The command line of a recipe module (this one, tiny_adapters.py): --print-sha DIR... prints
    the sha256 of the `weights` file each recipe folder makes (`write(folder, path)`),
    --materialize DIR... builds each into the cache (`materialize_one(folder, cache_root)`)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--print-sha", metavar="DIR", nargs="+",
                    help=f"print the sha256 of the {weights} each recipe makes")
    ap.add_argument("--materialize", metavar="DIR", nargs="+")
    ap.add_argument("--cache-root", type=Path, help="default: the harness's cache root "
                    "(conformance/formats/settings.py)")
    args = ap.parse_args(argv)
    for d in args.print_sha or ():
        with tempfile.TemporaryDirectory() as td:
            sha = write(Path(d), Path(td) / weights)
        print(f"{sha}  {Path(d).name}" if len(args.print_sha) > 1 else sha)
    for d in args.materialize or ():
        print(materialize_one(Path(d), args.cache_root or _cache_root()))
    if not (args.print_sha or args.materialize):
        ap.print_help()
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return recipe_main(argv, __doc__.split("\n\n")[0], "model.safetensors", write_safetensors, materialize)


if __name__ == "__main__":
    sys.exit(main())
