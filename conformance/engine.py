"""Driving one engine process through the protocol: spawn, handshake, run scenarios, close.

An engine is an argument list (never a shell string). A pinned vLLM release is served by
engines/vllm/worker.py inside that pin's environment and stays warm across scenarios.
Every way an engine can fail ends in an EngineFailure with a kind and the partial records.
"""

from __future__ import annotations

import os
import queue
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import protocol
from .pins import Pins, load_pins, parse_pin
from .scenario import Scenario

HANDSHAKE_TIMEOUT = float(os.environ.get("VLLM_PARITY_HANDSHAKE_TIMEOUT", 300))  # cold vllm import
RUN_TIMEOUT = float(os.environ.get("VLLM_PARITY_RUN_TIMEOUT", 600))


@dataclass(frozen=True)
class EngineSpec:
    label: str
    argv: tuple[str, ...]
    release: str | None = None  # set when this is a pinned vLLM release
    is_oracle: bool = False


class EngineFailure(RuntimeError):
    """The engine could not produce a trace. `kind` names the failure for the verdict."""

    def __init__(self, kind: str, message: str, partial: dict | None = None):
        super().__init__(message)
        self.kind, self.partial = kind, partial or {}


def resolve_engine(text: str, pins: Pins | None = None, log=print) -> EngineSpec:
    """'0.28.0' / 'vllm==0.28.0' -> a pinned worker; '0.27.1+mutant:NAME' -> that pin with a
    known bug injected (engines/vllm/mutants.py, a test device); anything else is a command line."""
    from .envs import WORKER, ensure_env

    pins = pins or load_pins()
    pin, _, mutant = text.partition("+mutant:")
    if mutant and parse_pin(pin, pins) is not None:
        # A TEST DEVICE: the pin with a known bug injected. Never an oracle, never a golden.
        release = parse_pin(pin, pins)
        python = ensure_env(release, log=log, pins=pins)
        return EngineSpec(f"vllm-{release}+mutant:{mutant}",
                          (str(python), str(WORKER), "--release", release, "--mutant", mutant))
    release = parse_pin(text, pins)
    if release is not None:
        python = ensure_env(release, log=log, pins=pins)
        return EngineSpec(f"vllm-{release}", (str(python), str(WORKER), "--release", release),
                          release, release == pins.oracle)
    argv = tuple(shlex.split(text))  # split into an argv list; never handed to a shell
    if not argv:
        raise ValueError("empty engine command")
    if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        raise ValueError(f"engine {text!r}: {argv[0]!r} is neither a configured pin "
                         f"({', '.join(pins.releases)}) nor an executable")
    return EngineSpec(Path(argv[0]).name if len(argv) == 1 else " ".join(argv), argv)


@dataclass
class EngineProcess:
    spec: EngineSpec
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    hello: dict = field(default_factory=dict)
    _proc: subprocess.Popen | None = None
    _lines: queue.Queue = field(default_factory=queue.Queue)
    _runs: int = 0

    def __enter__(self) -> "EngineProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                list(self.spec.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self._stderr, start_new_session=True,  # own group: killed with its children
            )
        except OSError as exc:
            raise EngineFailure("crash", f"{self.spec.label}: cannot start {self.spec.argv[0]!r}: {exc}")
        threading.Thread(target=self._read, daemon=True).start()
        message = self._next(time.monotonic() + self.handshake_timeout, ("hello", "error"), "handshake")
        if message["type"] == "error":
            self.close()
            raise EngineFailure("engine_error", f"{self.spec.label} refused to start: {message['message']}")
        if message["protocol"] != protocol.PROTOCOL_VERSION:
            self.close()
            raise EngineFailure("protocol", f"{self.spec.label}: expected protocol version "
                                f"{protocol.PROTOCOL_VERSION}, got {message['protocol']}")
        self.hello = message

    def run(self, scenario: Scenario, layers: list[str], timeout: float = RUN_TIMEOUT) -> dict[str, list]:
        """Run one scenario; return the records of each requested layer, in order."""
        self._runs += 1
        run_id = f"run-{self._runs}"
        records: dict[str, list] = {layer: [] for layer in layers}
        where = f"scenario {scenario.name}"
        self._send({"type": "run", "id": run_id, "scenario": scenario.to_wire(), "layers": layers}, records)
        deadline = time.monotonic() + timeout
        while True:
            message = self._next(deadline, ("record", "done", "error"), where, records)
            if message["id"] != run_id:
                self._fail("protocol", f"{where}: expected messages for {run_id!r}, got id "
                           f"{message['id']!r}", records)
            if message["type"] == "error":
                raise EngineFailure("engine_error", f"{where}: engine reported {message['kind']}: "
                                    f"{message['message']}", records)
            if message["type"] == "done":
                count = sum(len(v) for v in records.values())
                if message["records"] != count:
                    self._fail("protocol", f"{where}: done says {message['records']} records, "
                               f"{count} arrived", records)
                return records
            layer = message["layer"]
            if layer not in records:
                self._fail("protocol", f"{where}: expected a record of layer {layers}, got {layer!r}", records)
            if message["seq"] != len(records[layer]):
                self._fail("protocol", f"{where}: records out of order in layer {layer!r}: "
                           f"expected seq {len(records[layer])}, got {message['seq']}", records)
            records[layer].append(message["data"])

    def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if proc.poll() is None:
            try:
                proc.stdin.write(protocol.encode({"type": "shutdown"}))
                proc.stdin.flush()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _kill_group(proc)

    def stderr_tail(self, lines: int = 15) -> str:
        self._stderr.seek(0)
        return "\n".join(self._stderr.read().decode("utf-8", "replace").splitlines()[-lines:])

    # -- internals ---------------------------------------------------------------------

    def _read(self) -> None:
        stream = self._proc.stdout
        while True:
            line = stream.readline(protocol.MAX_LINE_BYTES + 1)
            self._lines.put(line)
            if not line:
                return

    def _send(self, message: dict, partial: dict) -> None:
        try:
            self._proc.stdin.write(protocol.encode(message))
            self._proc.stdin.flush()
        except OSError:
            self._crashed("sending a run", partial)

    def _next(self, deadline: float, expect: tuple[str, ...], where: str, partial: dict | None = None) -> dict:
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            _kill_group(self._proc)
            self._proc = None
            raise EngineFailure("timeout", f"{self.spec.label}: no answer during {where} before the "
                                "timeout; the engine and its children were ended", partial) from None
        if not line:
            self._crashed(where, partial)
        try:
            return protocol.decode(line, expect)
        except protocol.ProtocolError as exc:
            self._fail("protocol", f"{self.spec.label} during {where}: {exc}", partial)

    def _crashed(self, where: str, partial: dict | None) -> None:
        proc = self._proc
        code = proc.wait() if proc is not None else None
        self._proc = None
        raise EngineFailure("crash", f"{self.spec.label} exited (status {code}) during {where}; "
                            f"last stderr lines:\n{self.stderr_tail()}", partial)

    def _fail(self, kind: str, message: str, partial: dict | None) -> None:
        self.close()
        raise EngineFailure(kind, message, partial)


def _kill_group(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    # children that outlived the leader share its group: end them too
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
