"""(k) Cross-machine noise of the engine layers' logprobs, per scenario, and the tolerance each
scenario states against it.

Each CPU pin runs every engine scenario at full precision (8 decimals) once as it runs by
default, then once per variant in a fresh worker: the ISA of PyTorch's kernels capped
(ATEN_CPU_CAPABILITY=default), oneDNN's capped (ONEDNN_MAX_CPU_ISA=SSE41), two compute threads,
and another batch layout (max_num_seqs 1: every request decoded alone). The noise of a scenario
is the largest |difference| of one token's logprob over every variant and pin
(conformance/judging/noise.py); token flips must be 0.

    python benchmarks/bench_noise.py [--scenario NAME ...] [--json FILE] [--write]

--json writes the figures; --write records each scenario's noise (rounded up to two
significant digits) as `engine.logprob_noise` in its scenario file, from where every golden
written after it states the noise beside the tolerance.

--quick (`make bench BENCH_QUICK=1`, run by tests/house/test_doc_commands.py): the gate oracle, the
first engine scenario (or the --scenario given) and one variant (threads-2), to check that it
runs; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.formats.engine_ref import EngineRef  # noqa: E402
from conformance.formats.pins import load_pins  # noqa: E402
from conformance.formats.scenario import load_scenario  # noqa: E402
from conformance.judging.noise import TOLERANCE_OVER_NOISE, logprob_noise  # noqa: E402
from conformance.process.client import EngineFailure  # noqa: E402
from conformance.process.launch import prepare_engine  # noqa: E402
from conformance.process.session import EngineSession, served  # noqa: E402

# name -> (environment of the worker, engine_args changed)
VARIANTS = {
    "aten-isa-default": ({"ATEN_CPU_CAPABILITY": "default"}, {}),
    "onednn-isa-sse41": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, {}),
    "threads-2": ({"OMP_NUM_THREADS": "2"}, {}),
    "layout-serial": ({}, {"max_num_seqs": 1}),
}
FULL = 8  # decimals kept while measuring


def full_precision(scenario, args: dict):
    engine = dict(scenario.engine, logprob_decimals=FULL)
    return replace(scenario, engine=engine, engine_args={**scenario.engine_args, **args})


def outputs(release: str, scenarios: list, env: dict, args: dict) -> dict:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the worker inherits it: the caps apply from its first import
    try:
        with EngineSession(prepare_engine(EngineRef.pin(release), log=lambda m: None)) as session:
            if served(["engine_outputs"], session.start().hello)[1]:
                return {}
            traces = {s.name: session.trace(full_precision(s, args), ["engine_outputs"]) for s in scenarios}
        failure = next((t.failure for t in traces.values() if t.failure is not None), None)
        if failure is not None:
            raise EngineFailure(failure.kind, failure.message)
        return {name: t.layers["engine_outputs"] for name, t in traces.items()}
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", action="append")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    if opts.quick and opts.write:
        parser.error("--write records measured noise: not with --quick")
    scenarios = [s for s in (load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json")))
                 if s.engine is not None and (not opts.scenario or s.name in opts.scenario)][:1 if opts.quick else None]
    pins = load_pins()
    variants = {"threads-2": VARIANTS["threads-2"]} if opts.quick else VARIANTS
    figures = {s.name: {"noise": 0.0, "compared": 0, "token_flips": 0, "by_variant": {}}
               for s in scenarios}
    for release in (pins.oracle,) if opts.quick else pins.releases:
        base = outputs(release, scenarios, {}, {})
        if not base:
            print(f"(k) vllm {release}: no engine on this machine", file=sys.stderr)
            continue
        for name, (env, args) in variants.items():
            try:
                other = outputs(release, scenarios, env, args)
            except EngineFailure as failure:  # a cap the engine cannot run under is a finding too
                reason = str(failure).split("engine reported ", 1)[-1].splitlines()[0][:160]
                print(f"(k) vllm {release} {name}: cannot run: {reason}", file=sys.stderr)
                continue
            for s in scenarios:
                n = logprob_noise(base[s.name], other[s.name])
                f = figures[s.name]
                f["by_variant"][f"{release}/{name}"] = n.largest
                f["noise"] = max(f["noise"], n.largest)
                f["compared"] += n.compared
                f["token_flips"] += n.token_flips
            print(f"(k) vllm {release} {name}: done", file=sys.stderr, flush=True)
    print(f"(k) logprob noise per engine scenario (largest over {len(variants)} variants x CPU pins), "
          "tolerance, ratio:")
    for s in scenarios:
        f = figures[s.name]
        ratio = s.logprob_atol / f["noise"] if f["noise"] else float("inf")
        print(f"    {s.name:24} noise {f['noise']:.2e}  tolerance {s.logprob_atol:g}  "
              f"ratio {ratio:,.0f}x  (>= {TOLERANCE_OVER_NOISE}x wanted)  "
              f"compared {f['compared']}  token flips {f['token_flips']}")
    if opts.json:
        opts.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if opts.write:
        for s in scenarios:
            record(s.source, figures[s.name]["noise"])


def record(path: Path, noise: float) -> None:
    """engine.logprob_noise in the scenario file, rounded up to two significant digits."""
    digits = 1 - math.floor(math.log10(noise))  # a noise of 0 was never measured: it fails here
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["engine"]["logprob_noise"] = round(math.ceil(noise * 10 ** digits) / 10 ** digits, digits)
    path.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
