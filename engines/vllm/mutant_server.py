"""TEST DEVICE ONLY: serves generated mutants of one pin as candidates, cheaply.

A cold vLLM process costs about 10 s on this project's machine, and the catalog has hundreds
of mutants, so this process imports the release once and forks per mutant. Each mutant is
still an engine of its own, driven through the protocol exactly as a port is:
engines/vllm/mutant_client.py is its command line; it connects to this server's unix socket
and hands over its stdin, stdout and stderr (SCM_RIGHTS); the server forks a monitor, which
forks the mutant: the fresh child installs the mutant (engines/vllm/mutant_catalog.py) and
runs the worker's protocol loop on the client's pipes, announcing itself as
"vllm+mutant:catalog:<id>", never as "vllm". A built-in mutant (mutants.py: the test suite's
warm sessions of them) is forked the same way and runs as `worker.py --mutant NAME` does. The
monitor ends the mutant when the client goes away (the harness ended it, e.g. on a timeout)
and tells the client the mutant's exit status.

    python mutant_server.py --release 0.27.1 --socket /tmp/x.sock   # prints "ready" when serving
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for conformance and engines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--release", required=True)
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--device", choices=("cpu", "gpu"), required=True)  # settings.device_mode
    args = parser.parse_args(argv)

    # stdout says "ready" and nothing else; anything vLLM prints goes to stderr, as in worker.py
    ready = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    from engines.vllm import runtime

    runtime.boot(args.device)  # the one import every mutant shares
    import vllm

    if vllm.__version__ != args.release:
        print(f"expected vllm {args.release}, found {vllm.__version__}", file=sys.stderr)
        return 1
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(args.socket))
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    ready.write(b"ready\n")
    while True:
        conn, _ = server.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            ready.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(_monitor(conn, args.release, args.device))
        conn.close()


def _monitor(conn: socket.socket, release: str, device: str) -> int:
    message, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    if len(fds) != 3:
        return 2
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)  # the worker's sys.std* objects now use the client's pipes
            os.close(fd)
        os._exit(_serve(request, release, device))
    for fd in fds:
        os.close(fd)
    while True:
        readable, _, _ = select.select([conn], [], [], 0.1)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            return 0
        if readable and not conn.recv(1):  # the client is gone: so is its engine
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 0


def _serve(request: dict, release: str, device: str) -> int:
    """The worker's protocol loop with the mutant of `request`: {"mutant": Mutant JSON}, a
    generated one installed here first, or {"builtin": NAME}, one of mutants.py."""
    from conformance.formats import protocol
    from conformance.formats.mutant import Mutant
    from engines.vllm import mutant_catalog, worker

    name = request.get("builtin")
    if name is None:
        try:
            mutant = Mutant.from_json(request["mutant"])
            mutant_catalog.install(mutant)
        except Exception as exc:  # a mutant that cannot be installed is a bad request, said once
            os.write(1, protocol.encode({"type": "error", "id": None, "kind": "bad_request",
                                         "message": f"cannot install mutant: {type(exc).__name__}: {exc}"}))
            return 2
        name = f"catalog:{mutant.id}"
    try:
        return worker.main(["--release", release, "--device", device, "--mutant", name])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
