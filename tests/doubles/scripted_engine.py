#!/usr/bin/env python3
"""TEST DOUBLE ENGINE (scripted): a fake engine for fuzzing the harness's reader. Not an oracle.

Usage: scripted_engine.py SCRIPT_FILE

SCRIPT_FILE is JSON: {"lines": [hex, ...], "end": "exit" | "silent", "status": int}.
The double sends a valid protocol-3 hello, waits for the first line on stdin (the harness's
`run`), then writes each of `lines` (hex-encoded raw bytes) followed by a newline, exactly as
given, garbage included. Then, with end "exit", it exits with `status`; with end "silent",
it answers nothing more, reads stdin until `shutdown` or end of input, and exits 0.

Standard library only, so it starts fast. It does not use the one serve loop
(conformance/formats/serve.py) on purpose: after the hello every byte it writes is the script's, so it
can send what no serve() would, and it answers the first `run` whatever that line holds.
"""

import json
import sys


def main() -> int:
    script = json.load(open(sys.argv[1], encoding="utf-8"))
    out = sys.stdout.buffer
    out.write(b'{"type":"hello","protocol":3,"engine":"scripted","version":"0.0-test",'
              b'"capabilities":["config","steps"]}\n')
    out.flush()
    if not sys.stdin.buffer.readline():
        return 0
    try:
        for line in script["lines"]:
            out.write(bytes.fromhex(line) + b"\n")
        out.flush()
    except BrokenPipeError:  # the harness stopped listening (it judged an earlier line)
        return 0
    if script["end"] == "exit":
        return script["status"]
    for line in sys.stdin.buffer:
        if b'"shutdown"' in line:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
