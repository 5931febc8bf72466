"""Driving one engine process through the protocol: spawn, handshake, run scenarios, close.

An engine is an argument list (never a shell string). A pinned vLLM release is served by
engines/vllm/worker.py inside that pin's environment and stays warm across scenarios.
Every way an engine can fail ends in an EngineFailure with a kind and the partial records.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

from conformance.formats.kinds import Kind
from conformance.formats.errors import ParityError
from conformance.formats import digest, protocol
from conformance.formats.scenario import Scenario
from conformance.formats.settings import SettingError
from conformance.process import lines
from conformance.process.launch import EngineSpec
from conformance.process.reaper import Ended, ended_unwinding, ended_words, kill_group, start_kept, stopping, track

# Defaults, in seconds; $VLLM_PARITY_HANDSHAKE_TIMEOUT / $VLLM_PARITY_RUN_TIMEOUT override them,
# read when an engine starts (timeout_setting).
HANDSHAKE_TIMEOUT = 300.0  # a cold vllm import
RUN_TIMEOUT = 600.0  # one scenario, all layers
SHUTDOWN_GRACE = 10.0  # PROTOCOL.md: an engine exits within 10 s of `shutdown`
EXIT_GRACE = 2.0  # how long an engine whose stdout closed gets to exit (and the reverse)
POLL_INTERVAL = 0.25  # how often a wait for a line checks whether the engine is still alive


class Stopped(Exception):
    """The whole run is being stopped (Ctrl-C, SIGTERM): no engine starts or waits any more."""


class EngineFailure(ParityError, RuntimeError):
    """The engine could not produce a trace. `kind` names the failure for the verdict."""

    def __init__(self, kind: str, message: str, partial: dict | None = None):
        super().__init__(message)
        self.kind, self.partial = kind, partial or {}


@dataclass
class EngineProcess:
    """One engine process. Timeouts left as None are read from the environment when the engine
    starts ($VLLM_PARITY_HANDSHAKE_TIMEOUT, $VLLM_PARITY_RUN_TIMEOUT, in seconds)."""

    spec: EngineSpec
    handshake_timeout: float | None = None
    hello: dict = field(default_factory=dict)
    _proc: subprocess.Popen | None = None
    _lines: queue.Queue = field(default_factory=queue.Queue)
    _runs: int = 0
    run_timeout: float | None = None
    # protocol.MAX_RUN_BYTES / MAX_RUN_RECORDS unless $VLLM_PARITY_MAX_RUN_BYTES / _RECORDS say more
    max_run_bytes: int | None = None
    max_run_records: int | None = None
    _budget: int | None = None  # bytes a run in progress may still send; None between runs
    _limits: tuple[int, int] = (0, 0)  # the run in progress's limits: bytes, records
    _stderr_mark: int = 0  # where the run in progress began in the engine's stderr

    def __enter__(self) -> "EngineProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        # Settings first: a bad value is bad input, reported before any process exists.
        handshake = self.handshake_timeout
        if handshake is None:
            handshake = timeout_setting("VLLM_PARITY_HANDSHAKE_TIMEOUT", HANDSHAKE_TIMEOUT)
        if self.run_timeout is None:
            self.run_timeout = timeout_setting("VLLM_PARITY_RUN_TIMEOUT", RUN_TIMEOUT)
        if self.max_run_bytes is None:
            self.max_run_bytes = limit_setting("VLLM_PARITY_MAX_RUN_BYTES", protocol.MAX_RUN_BYTES)
        if self.max_run_records is None:
            self.max_run_records = limit_setting("VLLM_PARITY_MAX_RUN_RECORDS", protocol.MAX_RUN_RECORDS)
        if stopping():
            raise Stopped(f"{self.spec.label}: not started, the run is being stopped")
        self._stderr = tempfile.TemporaryFile()
        try:
            proc = start_kept(list(self.spec.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=self._stderr)
        except OSError as exc:
            raise EngineFailure(Kind.CRASH, f"{self.spec.label}: cannot start {self.spec.argv[0]!r}: {exc}")
        if not track(proc):  # the run is being stopped: the engine was ended at once
            raise Stopped(f"{self.spec.label}: ended at once, the run is being stopped")
        self._proc = proc
        threading.Thread(target=self._read, args=(self._proc.stdout, self._lines), daemon=True).start()
        with self._ended_on_interrupt():
            message = self._next(time.monotonic() + handshake, ("hello", "error"), "handshake")
            if message["type"] == "error":
                self.close()
                raise EngineFailure(Kind.ENGINE_ERROR, f"{self.spec.label} refused to start: "
                                    f"{protocol.cut(message['message'], protocol.MAX_ERROR_MESSAGE)}"
                                    f"{self._tail()}")
            if message["protocol"] != protocol.PROTOCOL_VERSION:
                self.close()
                raise EngineFailure(Kind.PROTOCOL, f"{self.spec.label}: expected protocol version "
                                    f"{protocol.PROTOCOL_VERSION}, got {message['protocol']}"
                                    f"{protocol.older_version_hint(message['protocol'])}")
            self.hello = message

    def run(self, scenario: Scenario, layers: list[str], timeout: float | None = None,
            sinks: dict | None = None, stop_after_step: int | None = None) -> dict[str, list]:
        """Run one scenario; return the records of each requested layer, in order. The timeout
        bounds the whole run (sending it, and every record), not each line.

        A production-scale scenario's `steps` and `outputs` come back in the digest form
        (formats/digest.py DigestSink), never held whole: `sinks` gives them (digest.sinks,
        told the golden's digests to keep the records around the first difference from them),
        else they are made here. `stop_after_step` asks the engine to stop its steps after that
        step (a window replayed live)."""
        if timeout is None:
            timeout = self.run_timeout if self.run_timeout is not None else \
                timeout_setting("VLLM_PARITY_RUN_TIMEOUT", RUN_TIMEOUT)
        with self._ended_on_interrupt():
            self._limits = self.limits(scenario)
            self._budget = self._limits[0]
            try:
                return self._run(scenario, layers, time.monotonic() + timeout, sinks, stop_after_step)
            finally:
                self._budget = None

    def limits(self, scenario: Scenario) -> tuple[int, int]:
        """(bytes, records) one run of `scenario` may send (engines/PROTOCOL.md "Limits"): the
        full form's, or a production scenario's own declared scale (protocol.py), whichever is
        more."""
        most_bytes = self.max_run_bytes if self.max_run_bytes is not None else protocol.MAX_RUN_BYTES
        most_records = self.max_run_records if self.max_run_records is not None else protocol.MAX_RUN_RECORDS
        if getattr(scenario, "scale", "library") == "production" and scenario.workload is not None:
            return (max(most_bytes, protocol.MAX_PRODUCTION_RUN_BYTES),
                    max(most_records, protocol.production_run_records(scenario.workload)))
        return most_bytes, most_records

    def _run(self, scenario: Scenario, layers: list[str], deadline: float, sinks: dict | None = None,
             stop_after_step: int | None = None) -> dict[str, list]:
        self._runs += 1
        # a failure shows the stderr lines of this run, not those earlier runs of this warm engine
        # left (the first run's include what the engine wrote while starting)
        if self._runs > 1:
            self._stderr_mark = os.fstat(self._stderr.fileno()).st_size
        run_id = f"run-{self._runs}"
        records: dict[str, list] = {layer: [] for layer in layers}
        if getattr(scenario, "scale", "library") == "production":  # never held whole
            records.update(sinks if sinks is not None else digest.sinks(layers))
        last: tuple | None = None
        where = _progress(scenario.name, records, last)
        message = {"type": "run", "id": run_id, "scenario": scenario.to_wire(), "layers": layers}
        if stop_after_step is not None:
            message["stop_after_step"] = stop_after_step
        self._send(message, records, deadline, where)
        while True:
            where = _progress(scenario.name, records, last)
            message = self._next(deadline, ("record", "done", "error"), where, records)
            if message["id"] != run_id:
                self._fail(Kind.PROTOCOL, f"{where}: expected messages for {run_id!r}, got id "
                           f"{message['id']!r}", records)
            if message["type"] == "error":
                # an engine that does not serve a layer says so: the verdict is `unsupported`;
                # any other error comes with the engine's last stderr lines (its traceback)
                text = protocol.cut(message["message"], protocol.MAX_ERROR_MESSAGE)
                if message["kind"] == Kind.UNSUPPORTED:
                    raise EngineFailure(Kind.UNSUPPORTED, f"{where}: engine reported unsupported: {text}", records)
                tail = "" if message["kind"] == "bad_request" else self._tail()  # our input's fault
                raise EngineFailure(Kind.ENGINE_ERROR, f"{where}: engine reported {protocol.cut(message['kind'], 40)}: "
                                    f"{text}{tail}", records)
            if message["type"] == "done":
                count = sum(len(v) for v in records.values())
                if message["records"] != count:
                    self._fail(Kind.PROTOCOL, f"{where}: done says {message['records']} records, "
                               f"{count} arrived", records)
                return records
            layer = message["layer"]
            if layer not in records:
                self._fail(Kind.PROTOCOL, f"{where}: expected a record of layer {layers}, got {layer!r}", records)
            if message["seq"] != len(records[layer]):
                self._fail(Kind.PROTOCOL, f"{where}: records out of order in layer {layer!r}: "
                           f"expected seq {len(records[layer])}, got {message['seq']}", records)
            records[layer].append(message["data"])
            last = (layer, message["seq"], message["data"])
            most = self._limits[1]
            if sum(len(v) for v in records.values()) > most:
                self._fail(Kind.PROTOCOL, f"{_progress(scenario.name, records, last)}: more than {most} records "
                           "in one run, the limit (engines/PROTOCOL.md \"Limits\"; "
                           "$VLLM_PARITY_MAX_RUN_RECORDS raises it)", records)

    @property
    def alive(self) -> bool:
        """Started, and not ended by the client: not closed, and not ended after a crash, a
        timeout or a broken protocol (an engine that answered a run, even with an error, is)."""
        return self._proc is not None

    @property
    def pid(self) -> int | None:
        """The engine's own process id while it is alive (not its keeper's, whose child it is)."""
        return self._proc.parity_engine if self._proc is not None else None

    def send_line(self, line: bytes, where: str, timeout: float = SHUTDOWN_GRACE) -> None:
        """Write `line` to the engine as it is, outside any run: bad input on purpose (`parity
        selfcheck`). An engine that does not read it within `timeout` is ended (EngineFailure)."""
        with self._ended_on_interrupt():
            outcome = _write_within(self._proc, line, timeout)
            if outcome == "blocked":
                self._timed_out(f"{where} (the engine did not read it)", None)
            if outcome != "ok":
                self._crashed(f"sending {where}", None)

    def answer(self, expect: tuple[str, ...], where: str, timeout: float) -> dict:
        """The engine's next message, one of the types `expect`, within `timeout` seconds
        (after send_line); anything else is an EngineFailure, the engine then ended."""
        with self._ended_on_interrupt():
            return self._next(time.monotonic() + timeout, expect, where)

    def close(self) -> bool:
        """Send `shutdown`, give the engine SHUTDOWN_GRACE seconds to exit, then end its process
        group. True when it had exited by then (PROTOCOL.md: within 10 s of `shutdown`). An
        engine closed in the middle of a run (it broke the protocol, or the harness is stopping)
        is ended at once: it reads `shutdown` only after its run, which may never end."""
        proc = self._proc
        if proc is None:
            return False
        self._proc = None
        between_runs = self._budget is None
        if proc.poll() is None and between_runs and _write_within(proc, protocol.encode({"type": "shutdown"}),
                                                                  SHUTDOWN_GRACE) == "ok":
            try:
                proc.wait(timeout=SHUTDOWN_GRACE)
            except subprocess.TimeoutExpired:
                pass
        exited = proc.poll() is not None
        kill_group(proc)
        return exited

    def stderr_tail(self, lines: int = 15, max_bytes: int | None = None, since: int = 0) -> str:
        """The last `lines` lines of the engine's stderr written after byte `since`, read from
        its last `max_bytes` only when given (a line cut by that bound starts with "[...]").
        Read with pread: the engine writes through the same open file, and moving its offset
        would have it write over its own lines."""
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        start = since if max_bytes is None else max(since, size - max_bytes)
        text = os.pread(fd, max(0, size - start), start).decode("utf-8", "replace")
        return ("[...]" if start > since else "") + "\n".join(text.splitlines()[-lines:])

    # -- internals ---------------------------------------------------------------------

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        while True:
            line = stream.readline(protocol.MAX_LINE_BYTES + 1)
            lines.put(line)
            if not line:
                return

    @contextlib.contextmanager
    def _ended_on_interrupt(self):
        """Anything but an EngineFailure escaping (Ctrl-C, a bug, bad input found late) ends the
        engine's process group: it runs in its own session, so no terminal signal reaches it."""
        try:
            yield
        except EngineFailure:
            raise
        except BaseException as exc:
            proc, self._proc = self._proc, None
            ended_unwinding(kill_group(proc))  # said by the handler's end_all
            raise

    def _send(self, message: dict, partial: dict, deadline: float, where: str) -> None:
        # On a helper thread: an engine that does not read its stdin fills the pipe, and a
        # blocked write must not outlive the run's deadline.
        outcome = _write_within(self._proc, protocol.encode(message), max(0.0, deadline - time.monotonic()))
        if outcome == "blocked":
            self._timed_out(f"{where} (the engine did not read the run message)", partial)
        if outcome != "ok":
            self._crashed(f"sending the run of {where}", partial)

    def _next(self, deadline: float, expect: tuple[str, ...], where: str, partial: dict | None = None) -> dict:
        exited_at = None
        while True:
            # The deadline bounds the whole exchange, even while lines keep arriving.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._timed_out(where, partial)
            if stopping():  # end_all() ended this engine: no failure to report
                raise Stopped(f"{self.spec.label}: stopped during {where}")
            try:
                line = self._lines.get(timeout=min(remaining, POLL_INTERVAL))
            except queue.Empty:
                proc = self._proc
                if proc is not None and proc.poll() is not None:
                    # The engine exited, yet its stdout is still open: a child holds it.
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at >= EXIT_GRACE:
                        self._crashed(where, partial, stdout_held=True)
                continue
            if not line:
                self._crashed(where, partial)
            if self._budget is not None:  # counted before the line is parsed: memory stays bounded
                self._budget -= len(line)
                if self._budget < 0:
                    self._fail(Kind.PROTOCOL, f"{self.spec.label} during {where}: its records exceed "
                               f"{self._limits[0]} bytes in one run, the limit (engines/PROTOCOL.md "
                               "\"Limits\"; $VLLM_PARITY_MAX_RUN_BYTES raises it)", partial)
            try:
                return lines.decode(line, expect)
            except protocol.ProtocolError as exc:
                self._fail(Kind.PROTOCOL, f"{self.spec.label} during {where}: {exc}", partial)

    def _timed_out(self, where: str, partial: dict | None) -> None:
        proc, self._proc = self._proc, None
        strays = kill_group(proc)
        raise EngineFailure(Kind.TIMEOUT, f"{self.spec.label}: no answer during {where} before the "
                            f"timeout; {ended_words(strays)}{self._tail()}",
                            partial) from None

    def _crashed(self, where: str, partial: dict | None, stdout_held: bool = False) -> None:
        proc, self._proc = self._proc, None
        code, strays = None, Ended()
        if proc is not None:
            try:
                code = proc.wait(timeout=EXIT_GRACE)
            except subprocess.TimeoutExpired:
                pass
            strays = kill_group(proc)  # children that outlived it, or the engine itself if it lingers
        if stdout_held:
            how = f"exited (status {code}) but a child process kept its stdout open"
        elif code is None:
            how = "closed its stdout without exiting"
        else:
            how = f"exited (status {code})"
        raise EngineFailure(Kind.CRASH, f"{self.spec.label} {how} during {where}; "
                            f"{ended_words(strays)}{self._tail()}", partial)

    def _fail(self, kind: str, message: str, partial: dict | None) -> None:
        tail = self._tail()
        self.close()
        raise EngineFailure(kind, message + tail, partial)

    def _tail(self) -> str:
        """The engine's last stderr lines, for a failure's message: where a port's traceback is.
        Those of the run in progress only (earlier runs of this warm engine left theirs before
        it). Bounded in bytes and lines, each line too: the message lands in every report."""
        tail = self.stderr_tail(60, TAIL_BYTES, since=self._stderr_mark)
        start = tail.rfind("Traceback (most recent call last)")  # a Python engine's last traceback whole
        tail = tail[start:] if start >= 0 else "\n".join(tail.splitlines()[-15:])
        tail = "\n".join(protocol.cut(line, TAIL_LINE) for line in tail.splitlines())
        if tail.strip():
            return f"; last stderr lines:\n{tail}"
        return "; its stderr is empty" if not self._stderr_mark else "; it wrote nothing to stderr during this run"


TAIL_BYTES = 32 * 1024  # of an engine's stderr read for a failure's message
TAIL_LINE = 500  # characters of one stderr line in that message


def timeout_setting(name: str, default: float) -> float:
    """A timeout in seconds from the environment, read when an engine starts (not at import,
    so it can be set by a wrapper or a test); a bad value is bad input naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SettingError(f"{name}={text!r}: expected a positive number of seconds")
    return value


def limit_setting(name: str, default: int) -> int:
    """A limit from the environment ($VLLM_PARITY_MAX_RUN_BYTES, ...), read when an engine
    starts; a bad value is bad input naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise SettingError(f"{name}={text!r}: expected a positive whole number")
    return int(text)


def _progress(name: str, records: dict, last: tuple | None) -> str:
    """Where a run got to, for failure messages: the scenario and the last record that arrived
    (named by its row or step where the record has one)."""
    if last is None:
        return f"scenario {name}, before any record"
    count = sum(len(v) for v in records.values())
    layer, seq, data = last
    name_it = next((f", {key} {data[key]}" for key in ("row", "step")
                    if isinstance(data.get(key), (int, str)) and not isinstance(data.get(key), bool)), "")
    return f"scenario {name} after {count} record{'s' if count != 1 else ''} (last: {layer} #{seq}{name_it})"


def _write_within(proc: subprocess.Popen | None, data: bytes, seconds: float) -> str:
    """Write to an engine's stdin without blocking the caller past `seconds`:
    "ok", "broken" (the engine is gone) or "blocked" (it does not read)."""
    if proc is None or proc.stdin is None:
        return "broken"
    outcome: list[str] = []

    def write() -> None:
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
            outcome.append("ok")
        except (OSError, ValueError):  # broken pipe, or stdin already closed
            outcome.append("broken")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(seconds)
    # A blocked writer ends when the engine's group is killed (its write then fails).
    return outcome[0] if outcome else "blocked"
