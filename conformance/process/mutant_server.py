"""The harness's side of engines/vllm/mutant_server.py: one fork server per pin (one
import of vLLM, one fork per generated mutant), each mutant started as an engine of its own
through engines/vllm/mutant_client.py. TEST DEVICE: a mutant is never an oracle and never a
golden.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
from pathlib import Path

from conformance.formats.errors import ParityError
from conformance.formats.log import log
from conformance.formats.mutant import Mutant
from conformance.formats.pins import REPO_ROOT
from conformance.process.envs import device_args, ensure_env
from conformance.process.reaper import start_kept, stop_kept

SERVER = REPO_ROOT / "engines" / "vllm" / "mutant_server.py"
CLIENT = REPO_ROOT / "engines" / "vllm" / "mutant_client.py"


class MutantServerError(ParityError, RuntimeError):
    """The mutant server did not start; the message carries the tail of its log."""


class MutantServer:
    """engines/vllm/mutant_server.py for one pin: one import of vLLM, one fork per mutant."""

    def __init__(self, release: str, log=log):
        self.release, self.log = release, log
        self.python = ensure_env(release, log=log)
        self._tmp = tempfile.TemporaryDirectory(prefix="parity-mutants-")
        self.socket = Path(self._tmp.name) / "server.sock"
        self._stderr = open(Path(self._tmp.name) / "server.log", "wb")
        # under its keeper, as every engine: the server and the mutants it forks end with the harness
        self._proc = start_kept(
            [str(self.python), str(SERVER), "--release", release, *device_args(), "--socket", str(self.socket)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr)
        ready, _, _ = select.select([self._proc.stdout], [], [], 300)
        if not ready or self._proc.stdout.readline().strip() != b"ready":
            tail = (Path(self._tmp.name) / "server.log").read_text(errors="replace", encoding="utf-8")[-2000:]
            self.close()
            raise MutantServerError(f"the mutant server for vllm {release} did not start:\n{tail}")

    def argv(self, mutant: Mutant) -> tuple[str, ...]:
        """What starts `mutant` as an engine of its own (process/launch.py Launcher)."""
        return (sys.executable, str(CLIENT), "--socket", str(self.socket), "--mutant", json.dumps(mutant.to_json()))

    def builtin_argv(self, name: str) -> tuple[str, ...]:
        """What starts the built-in mutant NAME (engines/vllm/mutants.py) forked from this server:
        the engine `worker.py --mutant NAME` is, without an import of its own."""
        return (sys.executable, str(CLIENT), "--socket", str(self.socket), "--builtin", name)

    def close(self) -> None:
        stop_kept(self._proc)  # the server and every mutant it forked
        self._stderr.close()
        self._tmp.cleanup()
