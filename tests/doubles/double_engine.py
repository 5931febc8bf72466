#!/usr/bin/env python3
"""TEST DOUBLE ENGINE: speaks the protocol to test the harness itself. It is not an oracle.

It answers every `config` run with the record in --record (a JSON file: its fields over a
complete config record of the double's own, CONFIG below, so a record given in part is still
every field PROTOCOL.md declares), or misbehaves on
purpose with --fault, so the harness's handling of each failure can be tested with a real
process: crash, hang, garbage, wrong-version, old-version, out-of-order, bad-count, wrong-id, error,
no-hello, fork-hang (leaves a child process behind while hanging), nondeterministic (each run's
config record says another max_num_seqs), and:
  crash-with-child   forks a child that keeps stdout open, then exits 3 (no EOF arrives)
  crash-orphan       forks a child that closes its stdout and sleeps, then exits 3
  close-stdout       closes its stdout and sleeps without exiting
  flood              answers a run with records 0, 1, 2, ... forever, never `done`
  no-read            sends hello, then sleeps without ever reading stdin
  setsid-hang        forks a child that leaves the process group (setsid), then hangs
  setsid-crash       forks a child that leaves the process group (setsid), then exits 3
  setsid-bare-hang   as setsid-hang, the child then running again with an empty environment
  setsid-bare-crash  as setsid-crash, likewise (no mark of the engine is left on it)
With --startfile PATH it appends its pid to PATH when it starts (to count starts); with
--stderr-line N it writes one line of N bytes to stderr first; with --pad N every config record
it sends carries a field `pad` of N characters (a record too large for the harness's limits);
with --stderr-each-run it writes `double: run N of SCENARIO` to stderr at the start of each run.
With --steps N it also serves the `steps` layer: N empty steps (step i, nothing scheduled). `crash` sends
--crash-after records (default 1) of the run, then exits 3.
With --replay RELEASE it answers every layer of a run with that pin's golden records for the
run's scenario (goldens/<scenario>/vllm-RELEASE.json), and --serve LAYERS (comma-separated)
sets the layers its hello declares and serves: a port that serves only some layers, equal to
the oracle on those, for testing how the gate judges what an engine declares.

It serves through conformance/formats/serve.py like any Python engine; a fault misbehaves inside its run
(exits, hangs, forks) or, for the faults serve() never makes, on the wire (FaultyWire).
"""

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from conformance.formats import protocol, serve  # noqa: E402

GARBAGE = b"Segmentation fault? {not json\n"
# Every field of a config record (engines/PROTOCOL.md): what --record's fields are laid over
CONFIG = {"refused": None, "max_num_batched_tokens": 4096, "max_num_scheduled_tokens": 1, "max_num_seqs": 4,
          "num_speculative_tokens": 0, "speculative_method": None, "parallel_drafting": False,
          "drafting_slots_per_request": 0, "drafting_reservation": None, "num_lookahead_tokens": 0,
          "block_size": 16, "enable_prefix_caching": False, "enable_chunked_prefill": True,
          "scheduler_class": "Scheduler", "budget_log_lines": [], "async_scheduling_gpu": False,
          "async_scheduling_cpu": False, "batch_queue_size": 1, "async_log_lines": []}


def empty_step(i: int) -> dict:
    """Step i with nothing scheduled and nothing held: every field of a steps record."""
    return {"step": i, "total_num_scheduled_tokens": 0, "token_budget": 1, "requests": {}, "new": [],
            "resumed": [], "preempted": [], "finished": [], "kv_blocks": {"free": 0, "used": 0, "cached": 0},
            "waiting": [], "running": [], "aborted": [], "emitted": [], "num_common_prefix_blocks": [0]}


class FaultyWire:
    """Writes serve()'s messages, broken as this run's fault says: the faults a port makes on
    the wire itself, which serve() never makes (a bad seq, another run's id, a wrong count, a
    line that is not JSON). Every other message goes out as serve() wrote it."""

    def __init__(self) -> None:
        self.send = serve.writer(sys.stdout.buffer)
        self.fault = "none"
        self.records = 0  # records of this run so far
        self.garbled = False

    def start(self, fault: str) -> None:
        self.fault, self.records, self.garbled = fault, 0, False

    def __call__(self, message: dict) -> None:
        kind = message["type"]
        if self.fault == "garbage" and kind in ("record", "done"):
            if not self.garbled:  # one line that is not JSON in place of the run's answer
                sys.stdout.buffer.write(GARBAGE)
                sys.stdout.buffer.flush()
                self.garbled = True
            return
        if kind == "record":
            if self.fault == "out-of-order" and self.records == 0:
                message = dict(message, seq=message["seq"] + 1)
            if self.fault == "wrong-id":
                message = dict(message, id="someone-else")
            self.records += 1
        if kind == "done" and self.fault == "bad-count":
            message = dict(message, records=5)
        self.send(message)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", help="JSON file with the config record to answer")
    parser.add_argument("--fault", default="none")
    parser.add_argument("--after-runs", type=int, default=0, help="misbehave from this run on")
    parser.add_argument("--pidfile", help="write the pids of this process and its children here")
    parser.add_argument("--steps", type=int, default=None, help="serve the steps layer: this many records")
    parser.add_argument("--crash-after", type=int, default=1, help="records sent before a crash")
    parser.add_argument("--startfile", help="append this process's pid here when it starts")
    parser.add_argument("--stderr-line", type=int, default=0, help="write one stderr line this long")
    parser.add_argument("--replay", help="answer with this pin's golden records")
    parser.add_argument("--serve", help="comma-separated layers the hello declares")
    parser.add_argument("--pad", type=int, default=0, help="a field of this many characters in each config record")
    parser.add_argument("--stderr-each-run", action="store_true", help="a stderr line at the start of each run")
    args = parser.parse_args()
    if args.stderr_line:
        sys.stderr.write("x" * args.stderr_line + "\n")
        sys.stderr.flush()
    if args.startfile:
        with open(args.startfile, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    record = {**CONFIG, **json.load(open(args.record, encoding="utf-8"))} if args.record else CONFIG
    if args.pad:
        record = dict(record, pad="x" * args.pad)
    wire = FaultyWire()

    def pids(*more: int) -> None:
        if args.pidfile:
            with open(args.pidfile, "w", encoding="utf-8") as f:
                f.write(" ".join(str(p) for p in (os.getpid(), *more)) + "\n")

    if args.fault == "no-hello":
        time.sleep(3600)
    if args.fault == "no-read":  # the hello, then never the loop that reads
        wire({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "engine": "double", "version": "0.0-test",
              "capabilities": ["config"]})
        time.sleep(3600)
    served = ["config"] + (["steps"] if args.steps is not None else [])
    if args.serve:
        served = args.serve.split(",")
    runs = 0

    def records(scenario: dict, layers: list) -> list:
        """The run's records, (layer, [data, ...]) for each layer asked, in order."""
        if args.replay:
            from conformance.judging.goldens import GOLDENS

            golden = GOLDENS.load(scenario["name"], args.replay).layers
            return [(layer, golden[layer]) for layer in layers]
        answer = []
        for layer in layers:
            if layer == "config":
                answer.append(("config", [record]))
            elif layer == "steps" and args.steps is not None:
                answer.append(("steps", [empty_step(i) for i in range(args.steps)]))
            else:  # any other layer --serve declares: no records (a port that declares more than it sends)
                answer.append((layer, []))
        return answer

    def run(scenario: dict, layers: list) -> serve.Answer:
        nonlocal runs
        if any(layer not in served for layer in layers):
            raise serve.RunError("unsupported", f"only {served}, not {layers}")
        runs += 1
        if args.stderr_each_run:
            sys.stderr.write(f"double: run {runs} of {scenario['name']}\n")
            sys.stderr.flush()
        fault = args.fault if runs > args.after_runs else "none"
        wire.start(fault)
        answer = records(scenario, layers)
        if fault == "crash":  # the first --crash-after records of the run, then the process ends
            left = args.crash_after
            for layer, data in answer:
                if left <= 0:
                    break
                yield layer, data[:left]
                left -= len(data[:left])
            os._exit(3)
        if fault in ("setsid-hang", "setsid-crash", "setsid-bare-hang", "setsid-bare-crash"):
            left_r, left_w = os.pipe()
            child = os.fork()
            if child == 0:
                os.setsid()  # out of the engine's process group: a group kill misses it
                os.close(1)
                os.close(left_r)
                os.close(left_w)  # the parent goes on only once the child has left the group
                if "bare" in fault:  # and without the environment that marks the engine's processes
                    os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(3600)"], {})
                time.sleep(3600)
                os._exit(0)
            os.close(left_w)
            os.read(left_r, 1)  # EOF: the child has called setsid
            os.close(left_r)
            pids(child)
            if fault.endswith("crash"):
                os._exit(3)
            time.sleep(3600)
        if fault in ("crash-with-child", "crash-orphan"):
            child = os.fork()
            if child == 0:
                if fault == "crash-orphan":
                    os.close(1)  # the parent's exit now closes the harness's pipe
                time.sleep(3600)
                os._exit(0)
            pids(child)
            os._exit(3)
        if fault == "close-stdout":
            pids()
            sys.stdout.flush()
            os.close(1)
            time.sleep(3600)
        if fault == "flood":  # records 0, 1, 2, ... forever, never `done`
            yield "config", itertools.repeat(record)
        if fault in ("hang", "fork-hang"):
            if fault == "fork-hang":
                child = os.fork()
                if child == 0:
                    time.sleep(3600)
                    os._exit(0)
                pids(child)
            time.sleep(3600)
        if fault == "error":
            raise serve.RunError("internal", "the double was told to fail")
        if fault == "nondeterministic":  # each run's config record another: state kept between runs
            answer = [(layer, [dict(d, max_num_seqs=runs) for d in data] if layer == "config" else data)
                      for layer, data in answer]
        yield from answer  # garbage, out-of-order, wrong-id, bad-count: the wire breaks it

    return serve.serve({"protocol": {"wrong-version": 99, "old-version": protocol.PROTOCOL_VERSION - 1}.get(
                            args.fault, protocol.PROTOCOL_VERSION),
                        "engine": "double", "version": "0.0-test", "capabilities": served}, run, send=wire)


if __name__ == "__main__":
    sys.exit(main())
