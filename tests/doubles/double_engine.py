#!/usr/bin/env python3
"""TEST DOUBLE ENGINE: speaks the protocol to test the harness itself. It is not an oracle.

It answers every `config` run with the record in --record (a JSON file), or misbehaves on
purpose with --fault, so the harness's handling of each failure can be tested with a real
process: crash, hang, garbage, wrong-version, out-of-order, bad-count, wrong-id, error,
no-hello, fork-hang (leaves a child process behind while hanging).
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
    args = parser.parse_args()
    out = sys.stdout.buffer
    record = json.load(open(args.record)) if args.record else {"max_num_scheduled_tokens": 1}

    def send(message: dict) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    if args.fault == "no-hello":
        time.sleep(3600)
    send({"type": "hello", "protocol": 99 if args.fault == "wrong-version" else 1,
          "engine": "double", "version": "0.0-test", "capabilities": ["config"]})
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
        if any(layer != "config" for layer in layers):
            send({"type": "error", "id": run_id, "kind": "unsupported", "message": f"only config, not {layers}"})
            continue
        runs += 1
        fault = args.fault if runs > args.after_runs else "none"
        if fault == "crash":
            send({"type": "record", "id": run_id, "layer": "config", "seq": 0, "data": record})
            os._exit(3)
        if fault in ("hang", "fork-hang"):
            if fault == "fork-hang":
                child = os.fork()
                if child == 0:
                    time.sleep(3600)
                    os._exit(0)
                if args.pidfile:
                    open(args.pidfile, "w").write(f"{os.getpid()} {child}\n")
            time.sleep(3600)
        if fault == "garbage":
            out.write(b"Segmentation fault? {not json\n")
            out.flush()
            continue
        if fault == "error":
            send({"type": "error", "id": run_id, "kind": "internal", "message": "the double was told to fail"})
            continue
        seq = 1 if fault == "out-of-order" else 0
        send({"type": "record", "id": "someone-else" if fault == "wrong-id" else run_id,
              "layer": "config", "seq": seq, "data": record})
        send({"type": "done", "id": run_id, "records": 5 if fault == "bad-count" else 1})
    return 0


if __name__ == "__main__":
    sys.exit(main())
