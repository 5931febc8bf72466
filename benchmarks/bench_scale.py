"""(n) Production scale: the harness's time and memory to receive and judge a run in the digest
form, per 10,000 steps, and each production scenario against its golden.

1. Synthetic, in this process: a 10,000-step pair of 128-request `steps` records (each record
   line ~57 KB) diverging at step 9,000. Receive = parse each line as the client does, judge it
   against its table, digest it and drop it (DigestSink); judge = the digest comparison plus the
   full comparison of the window. The lines are made as they are read, as they arrive from an
   engine; the peak memory is the process's peak RSS (ru_maxrss), the interpreter included.
2. Real, with --real (make bench passes it): for each production scenario with a golden, the gate
   oracle run against its golden (receive + judge, wall time), and each golden's bytes in git;
   then the TEST DEVICE mutant budget-minus-one-after-1000 on prod_dflash_k16: where it is
   found, the live replay's time, and the report's first field.

Goals (issue 26): judge < 30 s, a golden <= 2 MB in git.

--quick (`make bench BENCH_QUICK=1`, run by tests/house/test_doc_commands.py): 20 synthetic steps;
with --real, prod_deep_midsize alone and no mutant, to check that it runs; its figures mean
nothing.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import time
import resource
from pathlib import Path

from conformance.formats.digest import DigestSink
from conformance.formats.protocol import decode, encode

REPO = Path(__file__).resolve().parents[1]
STEPS = 10_000
REQUESTS = 128
DIVERGE_AT = 9_000
QUICK_STEPS = 20
QUICK_SCENARIO = "prod_deep_midsize"  # the smallest production scenario


def record(step: int, diverge: bool = False) -> dict:
    """A `steps` record as the current protocol declares it (record_schema.STEP): 128 requests
    decoding with 16 drafts each, as in prod_dflash_k16; a request gets a new block every 16th step."""
    reqs = {f"r{j}": {"tokens": 17, "draft_tokens": 16, "accepted_draft_tokens": (step + j) % 17,
                      "computed_tokens": 1000 + step * 3 + j, "output_tokens": step + j, "kv_blocks": 60 + j,
                      "block_ids": [[REQUESTS * step + j]] if (step + j) % 16 == 0 else None,
                      "cached_tokens": 0, "draft_token_ids": [(step * 31 + j * 7 + k) % 151_000 for k in range(16)],
                      "resent_token_ids": False,
                      "next_draft_token_ids": [(step * 31 + j * 7 + k + 31) % 151_000 for k in range(16)]}
            for j in range(REQUESTS)}
    if diverge:
        reqs["r5"]["tokens"] += 1
    return {"step": step, "total_num_scheduled_tokens": 17 * REQUESTS + diverge, "token_budget": 8192,
            "requests": reqs, "new": [], "resumed": [], "preempted": [], "finished": [], "aborted": [],
            "emitted": list(reqs), "kv_blocks": {"free": 100, "used": 8000, "cached": 0},
            "num_common_prefix_blocks": [0], "waiting": [f"w{j}" for j in range(20)], "running": list(reqs)}


def lines(steps: int, diverge_at: int | None):
    for i in range(steps):
        yield encode({"type": "record", "id": "run-1", "layer": "steps", "seq": i,
                      "data": record(i, diverge=i == diverge_at)})


def receive(raw, expect: dict | None) -> tuple[dict, float, int]:
    """(the digest form, CPU seconds spent receiving, bytes of record lines): the time to make
    each line is left out."""
    sink, seconds, size = DigestSink("steps", expect), 0.0, 0
    for line in raw:
        size += len(line)
        started = time.process_time()
        sink.append(decode(line, ("record",))["data"])
        seconds += time.process_time() - started
    return sink.to_json(), seconds, size


def synthetic(steps: int) -> None:
    from conformance.judging.digest_compare import compare_digest_layer

    diverge_at = steps * DIVERGE_AT // STEPS
    golden = DigestSink("steps")
    for i in range(steps):
        golden.append(record(i))
    golden = golden.to_json()
    theirs, seconds, size = receive(lines(steps, diverge_at), golden)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for name, form in (("the golden's", golden), ("the run's", theirs)):
        if "problem" in form:  # the records no longer are what the protocol declares: say which field
            sys.exit(f"bench_scale.py: {name} synthetic steps records: {form['problem']}")
    # the oracle's window, as a live replay brings it
    golden["oracle_window"] = {"from": diverge_at - 2, "at": diverge_at,
                               "records": [record(i) for i in range(diverge_at - 2, diverge_at + 3)]}
    started = time.process_time()
    c = compare_digest_layer("steps", golden, theirs)
    judge = time.process_time() - started
    if not (c.index == diverge_at and c.first.path == "requests.r5.tokens"):
        sys.exit(f"bench_scale.py: expected the divergence at step {diverge_at}, field requests.r5.tokens; "
                 f"got step {c.index}, {c.first}")
    print(f"(n) receive {steps} steps of {REQUESTS} requests ({size / 1e6:.0f} MB of record lines): "
          f"{seconds:.1f} s of CPU, the process's peak RSS {peak / 2**20:.0f} MiB; judge (divergence at step {c.index}, "
          f"field {c.first.path}): {judge:.2f} s of CPU (goal < 30 s)")


def git_bytes(path: Path) -> int:
    rel = path.relative_to(REPO).as_posix()
    out = subprocess.run(["git", "cat-file", "-s", f"HEAD:{rel}"], cwd=REPO, capture_output=True, text=True, encoding="utf-8")
    return int(out.stdout) if out.returncode == 0 else path.stat().st_size


def real(quick: bool = False) -> None:
    from conformance.formats.engine_ref import EngineRef
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import at_scale, load_scenario
    from conformance.gate.execute import golden_sinks
    from conformance.gate.replay import oracle_windows
    from conformance.judging.goldens import GOLDENS
    from conformance.judging.judging import judge_trace
    from conformance.process.launch import prepare_engine
    from conformance.process.session import EngineSession

    pins = load_pins()
    scenarios = at_scale([load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))], "production")
    if quick:
        scenarios = [s for s in scenarios if s.name == QUICK_SCENARIO]
    with EngineSession(prepare_engine(EngineRef.pin(pins.oracle), pins, lambda m: None),
                       sinks=golden_sinks(pins.oracle)) as session:
        session.start()  # the cold start is not the scenario's
        for s in scenarios:
            golden = GOLDENS.lookup(s.name, pins.oracle)
            if golden.trace is None:
                print(f"(n) {s.name}: no golden of vllm-{pins.oracle} (`make goldens`)")
                continue
            started = time.perf_counter()
            trace = session.trace(s)
            ran = time.perf_counter() - started
            started = time.perf_counter()
            verdict = judge_trace(trace, golden, "candidate")
            judged = time.perf_counter() - started
            path = GOLDENS.path(s.name, pins.oracle)
            print(f"(n) {s.name}: {trace.digests['steps']['count']} steps; the oracle run and received "
                  f"{ran:.0f} s, judged {judged:.2f} s (goal < 30 s): {verdict.kind}; golden "
                  f"{git_bytes(path):,} bytes in git (goal <= 2,000,000)")
    s = load_scenario(REPO / "scenarios" / "prod_dflash_k16.json")
    golden = GOLDENS.lookup(s.name, pins.oracle)
    if quick:
        print(f"(n) {s.name} with budget-minus-one-after-1000: left out (--quick)")
        return
    if golden.trace is None:
        return
    mutant = EngineRef.test_device(pins.oracle, "budget-minus-one-after-1000")
    with EngineSession(prepare_engine(mutant, pins, lambda m: None), sinks=golden_sinks(pins.oracle)) as session:
        trace = session.trace(s)
    started = time.perf_counter()
    trace = oracle_windows(copy.deepcopy(trace), s, pins, lambda m: None)
    replay = time.perf_counter() - started
    started = time.perf_counter()
    verdict = judge_trace(trace, golden, "candidate")
    judged = time.perf_counter() - started
    c = next((c for c in verdict.comparisons if not c.equal), None)
    if c is None:
        print(f"(n) {s.name} with budget-minus-one-after-1000: {verdict.kind} (no step binds its budget "
              "after step 1000: the scenario no longer exercises the deep divergence)")
        return
    print(f"(n) {s.name} with budget-minus-one-after-1000: {verdict.kind} at step {c.index}, first field "
          f"{c.first.path} ({c.first.expected!r} -> {c.first.actual!r}); the oracle's window replayed live in "
          f"{replay:.0f} s (cold start included), judged {judged:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="also run the production scenarios (part 2)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps; --real: {QUICK_SCENARIO} alone, "
                        "no mutant (a check that it runs)")
    parser.add_argument("--steps", type=int, default=STEPS,
                        help=f"the synthetic run's steps (default {STEPS}; fewer: a quick check that it runs)")
    args = parser.parse_args()
    if args.steps < 10:
        parser.error("--steps: expected at least 10")
    synthetic(QUICK_STEPS if args.quick else args.steps)
    if args.real:
        real(args.quick)


if __name__ == "__main__":
    main()
