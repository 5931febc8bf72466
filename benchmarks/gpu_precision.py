"""How far a GPU's float32 matmul precision moves the tiny models' logprobs from a CPU's.

The engine goldens are written on CPU in float32; a GPU runner judges its engine layers against
them within each golden's `logprob_atol` (1e-3). This measures, through Hugging Face's Qwen3
(transformers) as a stand-in for vLLM's own GPU kernels, what a GPU does to those logprobs at
each setting of torch.set_float32_matmul_precision (vLLM's $VLLM_FLOAT32_MATMUL_PRECISION):

  teacher-forced  the committed 0.27.1 goldens of engine_ngram, engine_kv_pressure and
                  engine_dflash_gate (tiny-qwen3): each request's prompt and golden output run
                  through the model; the largest |model logprob - golden logprob| over every
                  top-k entry, and how often the model's argmax is not the golden's token
  random          random tokens (8 x 256) through tiny-qwen3 and through a Qwen3 1024 wide and
                  8 deep (weights by the tiny-model recipe): the largest |logprob| difference
                  from the CPU over the whole vocabulary, the positions beyond 1e-3, top-1 flips

Settings: `highest` (full float32, vLLM's default), `high` (TF32 matmuls), `bf16` (the model in
bfloat16). Needs torch, transformers and numpy (a pin's environment has them; the harness's own
does not). With `--device cpu` the device under test is the CPU itself, which checks the script.

    python benchmarks/gpu_precision.py [--device cuda] [--json FILE] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.formats.workload import prompt_tokens  # noqa: E402
from conformance.judging.goldens import GOLDENS  # noqa: E402
from engines.vllm.tiny_models import build_tensors, encode_safetensors  # noqa: E402  (numpy only)

TINY = REPO / "scenarios" / "models" / "tiny-qwen3"
SCENARIOS = ("engine_ngram", "engine_kv_pressure", "engine_dflash_gate")
RELEASE = "0.27.1"
SETTINGS = ("highest", "high", "bf16")
TOLERANCE = 1e-3  # the engine goldens' logprob_atol
# A Qwen3 1024 wide and 8 deep, the tiny recipe's weights rescaled for its width
# (linear 2**-19: std ~0.036 ~ 1/sqrt(1024); lm_head 2**-17: logits of std ~5).
WIDE = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 64}
WIDE_SCALES = {"embed": -14, "linear": -19, "lm_head": -17}


def load(cfg: dict, meta: dict, sha256: str | None = None):
    import hashlib

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    tensors = build_tensors(cfg, meta)
    if sha256 and hashlib.sha256(encode_safetensors(tensors)).hexdigest() != sha256:
        raise SystemExit("gpu_precision: this numpy made other weights than the committed tiny model's")
    state = {name: torch.from_numpy(array) for name, array in tensors.items()}
    model.load_state_dict(state, strict=True)
    return model


def tiny_model():
    meta = json.loads((TINY / "weights.json").read_text(encoding="utf-8"))
    return load(json.loads((TINY / "config.json").read_text(encoding="utf-8")), meta, meta["sha256"])


def wide_model():
    cfg = {**json.loads((TINY / "config.json").read_text(encoding="utf-8")), **WIDE}
    return load(cfg, {**json.loads((TINY / "weights.json").read_text(encoding="utf-8")), "scales_log2": WIDE_SCALES})


def logprobs(model, tokens, device: str, setting: str):
    """log_softmax of the model's logits (float32) for a batch of token rows, on `device` at
    `setting`; returned on CPU."""
    import torch

    torch.set_float32_matmul_precision("highest" if setting == "bf16" else setting)
    dtype = torch.bfloat16 if setting == "bf16" else torch.float32
    moved = model.to(device=device, dtype=dtype)
    try:
        with torch.no_grad():
            logits = moved(input_ids=tokens.to(device)).logits
        return torch.log_softmax(logits.float(), dim=-1).cpu()
    finally:
        model.to(device="cpu", dtype=torch.float32)
        torch.set_float32_matmul_precision("highest")


def teacher_forced(model, device: str, setting: str) -> dict:
    """Each golden request's prompt and output through the model, against the golden's top-k."""
    import torch

    worst, count, flips = 0.0, 0, 0
    for name in SCENARIOS:
        scenario = json.loads((REPO / "scenarios" / f"{name}.json").read_text(encoding="utf-8"))
        golden = GOLDENS.load(name, RELEASE)
        workload = scenario["workload"]
        requests = {r["id"]: r for r in workload["requests"]}
        for record in golden.layers["engine_outputs"]:
            req, out = requests[record["id"]], record["output_token_ids"]
            prompt = prompt_tokens(workload["seed"], req["id"], req["prompt_len"], workload["vocab_size"])
            rows = logprobs(model, torch.tensor([prompt + out[:-1]]), device, setting)[0, len(prompt) - 1:]
            for row, entries in zip(rows, record["logprobs"]):
                for token, value in entries:
                    worst = max(worst, abs(float(row[token]) - value))
                    count += 1
                flips += int(int(row.argmax()) != entries[0][0])
    return {"max_abs": worst, "logprobs": count, "argmax_changes": flips}


def against_cpu(reference, other) -> dict:
    """Largest |difference| per position over the whole vocabulary, against the CPU's."""
    per_position = (reference - other).abs().amax(dim=-1).flatten()
    flips = (reference.argmax(dim=-1) != other.argmax(dim=-1)).sum()
    return {"max_abs": float(per_position.max()), "positions": per_position.numel(),
            "beyond_tolerance": int((per_position > TOLERANCE).sum()), "top1_flips": int(flips)}


def random_inputs(model, device: str, rows: int, length: int, settings=SETTINGS) -> dict:
    import torch

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (rows, length), generator=generator)
    reference = logprobs(model, tokens, "cpu", "highest")
    return {setting: against_cpu(reference, logprobs(model, tokens, device, setting)) for setting in settings}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="the device under test (default cuda; cpu checks the script)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--quick", action="store_true",
                        help="highest and bf16 only, 2 x 64 random tokens, no wide model (a check of the script)")
    args = parser.parse_args(argv)

    import torch
    import transformers

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_precision: no CUDA device (give --device cpu to check the script)", file=sys.stderr)
        return 2
    started = time.monotonic()
    rows, length = (2, 64) if args.quick else (8, 256)
    settings = ("highest", "bf16") if args.quick else SETTINGS
    tiny = tiny_model()
    forced = {} if args.device == "cpu" else {"cpu": teacher_forced(tiny, "cpu", "highest")}
    figures = {
        "environment": {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
                        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
                        or platform.machine(), "attention": "sdpa"},
        "teacher_forced": forced | {f"{args.device}-{s}": teacher_forced(tiny, args.device, s) for s in settings},
        "random_tiny_qwen3": random_inputs(tiny, args.device, rows, length, settings),
    }
    if not args.quick:
        figures["random_qwen3_1024x8"] = random_inputs(wide_model(), args.device, rows, length)
    figures["seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
