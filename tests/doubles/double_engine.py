#!/usr/bin/env python3
"""TEST DOUBLE ENGINE: speaks the protocol to test the harness itself. It is not an oracle.

It answers every `config` run with the record in --record (a JSON file), or misbehaves on
purpose with --fault, so the harness's handling of each failure can be tested with a real
process: crash, hang, garbage, wrong-version, out-of-order, bad-count, wrong-id, error,
no-hello, fork-hang (leaves a child process behind while hanging), and:
  crash-with-child   forks a child that keeps stdout open, then exits 3 (no EOF arrives)
  crash-orphan       forks a child that closes its stdout and sleeps, then exits 3
  close-stdout       closes its stdout and sleeps without exiting
  flood              answers a run with records 0, 1, 2, ... forever, never `done`
  no-read            sends hello, then sleeps without ever reading stdin
  setsid-hang        forks a child that leaves the process group (setsid), then hangs
  setsid-crash       forks a child that leaves the process group (setsid), then exits 3
With --startfile PATH it appends its pid to PATH when it starts (to count starts); with
--stderr-line N it writes one line of N bytes to stderr first.
With --steps N it also serves the `steps` layer: N records {"step": i}. `crash` sends
--crash-after records (default 1) of the run, then exits 3.
With --replay RELEASE it answers every layer of a run with that pin's golden records for the
run's scenario (goldens/<scenario>/vllm-RELEASE.json), and --serve LAYERS (comma-separated)
sets the layers its hello declares and serves: a port that serves only some layers, equal to
the oracle on those, for testing how the gate judges what an engine declares.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from conformance import protocol  # noqa: E402


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
    args = parser.parse_args()
    if args.stderr_line:
        sys.stderr.write("x" * args.stderr_line + "\n")
        sys.stderr.flush()
    if args.startfile:
        with open(args.startfile, "a") as f:
            f.write(f"{os.getpid()}\n")
    out = sys.stdout.buffer
    record = json.load(open(args.record)) if args.record else {"max_num_scheduled_tokens": 1}

    def send(message: dict) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    def pids(*more: int) -> None:
        if args.pidfile:
            with open(args.pidfile, "w") as f:
                f.write(" ".join(str(p) for p in (os.getpid(), *more)) + "\n")

    if args.fault == "no-hello":
        time.sleep(3600)
    if args.fault == "no-read":
        send({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "engine": "double", "version": "0.0-test",
              "capabilities": ["config"]})
        time.sleep(3600)
    served = ["config"] + (["steps"] if args.steps is not None else [])
    if args.serve:
        served = args.serve.split(",")
    send({"type": "hello", "protocol": 99 if args.fault == "wrong-version" else protocol.PROTOCOL_VERSION,
          "engine": "double", "version": "0.0-test", "capabilities": served})
    runs = 0
    for line in sys.stdin.buffer:
        try:
            message = protocol.decode(line, ("run", "shutdown"))
        except protocol.ProtocolError as exc:
            send({"type": "error", "id": None, "kind": "bad_request", "message": str(exc)})
            continue
        if message["type"] == "shutdown":
            return 0
        run_id, layers = message["id"], message["layers"]
        if any(layer not in served for layer in layers):
            send({"type": "error", "id": run_id, "kind": "unsupported", "message": f"only {served}, not {layers}"})
            continue
        runs += 1
        fault = args.fault if runs > args.after_runs else "none"
        answer = []  # (layer, seq, data) of this run's records, in order
        golden = None
        if args.replay:
            from conformance.gate.golden_store import GOLDENS

            golden = GOLDENS.load(message["scenario"]["name"], args.replay)["layers"]
        for layer in layers:
            if golden is not None:
                answer += [(layer, i, data) for i, data in enumerate(golden[layer])]
            elif layer == "config":
                answer.append(("config", 0, record))
            elif layer == "steps" and args.steps is not None:
                answer += [("steps", i, {"step": i, "num_scheduled_tokens": 1}) for i in range(args.steps)]
            # any other layer --serve declares: no records (a port that declares more than it sends)
        if fault == "crash":
            for layer, seq, data in answer[:args.crash_after]:
                send({"type": "record", "id": run_id, "layer": layer, "seq": seq, "data": data})
            os._exit(3)
        if fault in ("setsid-hang", "setsid-crash"):
            child = os.fork()
            if child == 0:
                os.setsid()  # out of the engine's process group: a group kill misses it
                os.close(1)
                time.sleep(3600)
                os._exit(0)
            pids(child)
            if fault == "setsid-crash":
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
        if fault == "flood":
            for seq in range(1 << 62):
                send({"type": "record", "id": run_id, "layer": "config", "seq": seq, "data": record})
        if fault in ("hang", "fork-hang"):
            if fault == "fork-hang":
                child = os.fork()
                if child == 0:
                    time.sleep(3600)
                    os._exit(0)
                pids(child)
            time.sleep(3600)
        if fault == "garbage":
            out.write(b"Segmentation fault? {not json\n")
            out.flush()
            continue
        if fault == "error":
            send({"type": "error", "id": run_id, "kind": "internal", "message": "the double was told to fail"})
            continue
        for i, (layer, seq, data) in enumerate(answer):
            if fault == "out-of-order" and i == 0:
                seq += 1
            send({"type": "record", "id": "someone-else" if fault == "wrong-id" else run_id,
                  "layer": layer, "seq": seq, "data": data})
        send({"type": "done", "id": run_id, "records": 5 if fault == "bad-count" else len(answer)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
