"""TEST DEVICE ONLY: the command line of one generated mutant, served by mutant_server.py.

Runs in the harness's python (standard library only). It hands its stdin, stdout and stderr
to the fork server, which forks the mutant onto them, and exits with the mutant's status.
Ending this process (as the harness does on a timeout) ends the mutant.

    python mutant_client.py --socket /tmp/x.sock --mutant '{"id": "m0123456789", ...}'
    python mutant_client.py --socket /tmp/x.sock --builtin draft-plus-one
"""

from __future__ import annotations

import argparse
import json
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--mutant", help="the mutant, as conformance.formats.mutant's JSON (Mutant.to_json)")
    which.add_argument("--builtin", metavar="NAME", help="a built-in mutant of engines/vllm/mutants.py")
    args = parser.parse_args(argv)
    request = {"builtin": args.builtin} if args.builtin else {"mutant": json.loads(args.mutant)}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(args.socket)
    except OSError as exc:
        print(f"mutant_client: no mutant server at {args.socket}: {exc}", file=sys.stderr)
        return 2
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    line = conn.makefile("rb").readline()
    return json.loads(line)["exit"] if line else 1


if __name__ == "__main__":
    sys.exit(main())
