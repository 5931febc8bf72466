#!/usr/bin/env python3
"""TEST DOUBLE ENGINE, hostile: replays a pin's goldens with edits an attacker would make. It is
not an oracle and never writes a golden.

It answers each run with the golden records of --replay RELEASE (default: the gate oracle) for
the run's scenario, edited as the JSON file given with --plan says:

    {
      "hello":  {"engine": "<script>x</script>", "environment": null},   merged into the hello
      "stderr": "\\u001b[31mtext\\u001b[0m written to stderr at start",
      "serve":  ["config", "steps", "outputs"],                        the layers it declares
      "edits": [
        {"scenario": "steady_decode",   (optional: every scenario when absent)
         "layer": "steps", "seq": 3,    (seq: an index, or "*" for every record of the layer)
         "path": ["requests", "r0", "computed_tokens"],  (keys and list indexes into the record)
         "value": "12"}                 (or "float": "nan" / "inf" / "-inf", or "delete": true)
        {"layer": "steps", "seq": 0, "record": [1, 2]}   (the whole record replaced)
        {"layer": "outputs", "append": {"id": "rX"}}      (one record appended to the layer)
        {"layer": "steps", "records": [{"refused": ...}]}  (the layer's records replaced)
      ],
      "error": {"scenario": "steady_decode", "kind": "internal", "message": "..."},
      "exit":  {"scenario": "steady_decode", "status": 3, "stderr": "..."}
    }

Every edit changes the candidate's own records only: the harness must judge them against the
oracle's golden, never believe them. Messages go out as they are, unchecked (`send_raw`: NaN,
a null environment), as a hostile engine's would.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from conformance.formats import serve  # noqa: E402

FLOATS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def applies(rule: dict, scenario: str) -> bool:
    return rule.get("scenario") in (None, "*", scenario)


def edit_record(record, edit: dict):
    if "record" in edit:
        return copy.deepcopy(edit["record"])
    path = list(edit["path"])
    target = record
    for key in path[:-1]:
        target = target[key]
    if edit.get("delete"):
        del target[path[-1]]
    elif "float" in edit:
        target[path[-1]] = FLOATS[edit["float"]]
    else:
        target[path[-1]] = copy.deepcopy(edit["value"])
    return record


def edited(layer: str, records: list, edits: list[dict]) -> list:
    records = copy.deepcopy(records)
    for edit in edits:
        if edit["layer"] != layer:
            continue
        if "append" in edit:
            records.append(copy.deepcopy(edit["append"]))
            continue
        if "records" in edit:
            records = copy.deepcopy(edit["records"])
            continue
        seqs = range(len(records)) if edit["seq"] == "*" else [edit["seq"]]
        for seq in seqs:
            records[seq] = edit_record(records[seq], edit)
    return records


def send_raw(message: dict) -> None:
    """One protocol line as this engine means it, never checked against the protocol first."""
    sys.stdout.buffer.write(json.dumps(message, separators=(",", ":"), allow_nan=True).encode() + b"\n")
    sys.stdout.buffer.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help="JSON file: the edits (see the module's doc)")
    parser.add_argument("--replay", help="the pin whose goldens are replayed (default: the gate oracle)")
    args = parser.parse_args()
    with open(args.plan, encoding="utf-8") as f:
        plan = json.load(f)
    from conformance.formats.pins import load_pins
    from conformance.judging.goldens import GOLDENS

    release = args.replay or load_pins().oracle
    if plan.get("stderr"):
        sys.stderr.write(plan["stderr"] + "\n")
        sys.stderr.flush()
    served = plan.get("serve", ["config", "steps", "outputs", "methods"])

    def run(scenario: dict, layers: list) -> serve.Answer:
        name = scenario["name"]
        exit_rule = plan.get("exit")
        if exit_rule and applies(exit_rule, name):
            sys.stderr.write(exit_rule.get("stderr", "") + "\n")
            sys.stderr.flush()
            os._exit(exit_rule.get("status", 3))
        error = plan.get("error")
        if error and applies(error, name):
            raise serve.RunError(error.get("kind", "internal"), error.get("message", ""))
        if any(layer not in served for layer in layers):
            raise serve.RunError("unsupported", f"only {served}, not {layers}")
        golden = GOLDENS.load(name, release).layers
        edits = [e for e in plan.get("edits", []) if applies(e, name)]
        return [(layer, edited(layer, golden.get(layer, []), edits)) for layer in layers]

    hello = {"engine": "hostile-double", "version": "0.0-test", "capabilities": served}
    hello.update(plan.get("hello", {}))
    return serve.serve(hello, run, send=send_raw)


if __name__ == "__main__":
    sys.exit(main())
