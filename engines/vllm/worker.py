"""Serves one pinned vLLM release through the engine protocol (engines/PROTOCOL.md).

Runs inside the pin's own environment (conformance/process/envs.py builds it) and stays warm:
vLLM is imported once, then every `run` message is answered in this process, by the one
serve loop (conformance/formats/serve.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for conformance

from conformance.formats import serve  # noqa: E402  (standard library only)
from conformance.formats.scenario import ScenarioError  # noqa: E402  (standard library only)
from engines.vllm import lines  # noqa: E402  (msgspec, which vLLM requires; imports no vLLM)


def main(argv: list[str] | None = None, engine: str | None = None) -> int:
    """Serves until `shutdown`. `engine` is the name the hello announces (default "vllm", or
    "vllm+mutant:NAME"); a TEST DOUBLE built on this worker passes its own."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--release", help="the vllm release this environment must hold")
    parser.add_argument("--warm", metavar="RELEASE",
                        help="a new environment's import check (vllm imports, at RELEASE), then warm its caches (warm.py), exit")
    # No default: the harness decides the device once (conformance/formats/settings.device_mode) and passes
    # it to every worker, so a worker can never run on another platform than its environment's.
    parser.add_argument("--device", choices=("cpu", "gpu"), required=True)
    parser.add_argument("--no-cpu-engine", metavar="REASON",
                        help="why this pin has no CPU rebuild (the harness's pyproject.toml no-cpu-engine), "
                             "said where its engine layers are refused on CPU")
    parser.add_argument("--mutant", metavar="NAME",
                        help="TEST DEVICE: inject a known scheduling bug (engines/vllm/mutants.py)")
    args = parser.parse_args(argv)

    # The protocol owns the real stdout; anything vLLM prints goes to stderr instead.
    wire = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    send = serve.writer(wire, lines.encode)

    release = args.warm or args.release
    try:
        from engines.vllm import per_run, runtime  # runtime imports vllm with the platform forced first

        runtime.boot(args.device, args.no_cpu_engine)
        import vllm
    except Exception as exc:  # an import failure is reported, not a traceback on a pipe
        send({"type": "error", "id": None, "kind": "internal",
              "message": f"importing vllm {release} failed: {type(exc).__name__}: {exc}"})
        traceback.print_exc()
        return 1
    if args.mutant:  # a TEST DEVICE: the release with a known bug injected, never the oracle
        from engines.vllm import mutants

        try:
            mutants.apply(args.mutant)
        except ValueError as exc:
            send({"type": "error", "id": None, "kind": "bad_request", "message": str(exc)})
            return 2
    if release and runtime.pin_version() != release:
        send({"type": "error", "id": None, "kind": "internal",
              "message": f"expected vllm {release} in this environment, found {runtime.pin_version()}"})
        return 1
    if args.warm:
        print(f"vllm {vllm.__version__} imports on {args.device}", file=sys.stderr)
        from engines.vllm import warm

        warm.warm(lambda text: print(text, file=sys.stderr))
        return 0

    if engine is None:
        engine = f"vllm+mutant:{args.mutant}" if args.mutant else "vllm"

    def answer(scenario: dict, layers: list, stop_after_step: int | None = None) -> serve.Answer:
        unsupported = [layer for layer in layers if layer not in runtime.LAYERS]
        if unsupported:
            reasons = sorted({runtime.UNSERVED[layer] for layer in unsupported if layer in runtime.UNSERVED})
            raise serve.RunError("unsupported", "; ".join(reasons) if reasons else
                                 f"layers {unsupported} are not served; this worker serves {sorted(runtime.LAYERS)}")
        per_run.forget()  # layers share one computation within a run, never across runs
        for layer in layers:
            if layer == "steps" and stop_after_step is not None:  # a window replayed live
                yield layer, runtime.LAYERS[layer](scenario, stop_after_step=stop_after_step)
            else:
                yield layer, runtime.LAYERS[layer](scenario)

    hello = {"engine": engine, "version": runtime.pin_version(), "capabilities": sorted(runtime.LAYERS),
             "environment": runtime.environment()}
    # A malformed workload (ScenarioError) is a bad request; any other failure is internal.
    return serve.serve(hello, answer, bad_request=(ScenarioError,), send=send)


if __name__ == "__main__":
    status = main()
    if "coverage" in sys.modules:  # measured by coverage.py (make adequacy): it saves at exit
        sys.exit(status)
    # Every answer is written (the wire is unbuffered) and nothing else is kept, so skip the
    # interpreter's finalization: with vLLM and torch loaded it took ~3 s per worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
