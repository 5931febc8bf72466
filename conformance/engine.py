"""Driving one engine process through the protocol: spawn, handshake, run scenarios, close.

An engine is an argument list (never a shell string). A pinned vLLM release is served by
engines/vllm/worker.py inside that pin's environment and stays warm across scenarios.
Every way an engine can fail ends in an EngineFailure with a kind and the partial records.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import protocol
from .gate.engine_ref import COMMAND, MUTANT, PIN, EngineRef
from .pins import Pins, load_pins
from .scenario import Scenario

# Defaults, in seconds; $VLLM_PARITY_HANDSHAKE_TIMEOUT / $VLLM_PARITY_RUN_TIMEOUT override them,
# read when an engine starts (timeout_setting).
HANDSHAKE_TIMEOUT = 300.0  # a cold vllm import
RUN_TIMEOUT = 600.0  # one scenario, all layers
SHUTDOWN_GRACE = 10.0  # PROTOCOL.md: an engine exits within 10 s of `shutdown`
EXIT_GRACE = 2.0  # how long an engine whose stdout closed gets to exit (and the reverse)
POLL_INTERVAL = 0.25  # how often a wait for a line checks whether the engine is still alive


@dataclass(frozen=True)
class EngineSpec:
    label: str
    argv: tuple[str, ...]
    release: str | None = None  # set when this is a pinned vLLM release


class Stopped(Exception):
    """The whole run is being stopped (Ctrl-C, SIGTERM): no engine starts or waits any more."""


class EngineFailure(RuntimeError):
    """The engine could not produce a trace. `kind` names the failure for the verdict."""

    def __init__(self, kind: str, message: str, partial: dict | None = None):
        super().__init__(message)
        self.kind, self.partial = kind, partial or {}


def prepare_engine(ref: EngineRef, pins: Pins | None = None, log=print) -> EngineSpec:
    """What starts the engine `ref` names. A pin (or a pin's TEST DEVICE mutant) is served by
    its worker in the pin's environment, which is built here when missing (minutes, once); a
    command line is checked to name an executable."""
    from .envs import ensure_env, worker_argv

    pins = pins or load_pins()
    if ref.kind == MUTANT:
        # A TEST DEVICE: the pin with a known bug injected. Never an oracle, never a golden.
        python = ensure_env(ref.release, log=log, pins=pins)
        return EngineSpec(ref.label, worker_argv(python, ref.release, "--mutant", ref.mutant))
    if ref.kind == PIN:
        python = ensure_env(ref.release, log=log, pins=pins)
        return EngineSpec(ref.label, worker_argv(python, ref.release), ref.release)
    if ref.kind != COMMAND:
        raise ValueError(f"engine {ref.text!r}: a catalog mutant is served by `parity adequacy`'s "
                         "mutant server (parity fuzz --candidate), not started on its own")
    if shutil.which(ref.argv[0]) is None and not Path(ref.argv[0]).is_file():
        raise ValueError(f"engine {ref.text!r}: {ref.argv[0]!r} is neither a configured pin "
                         f"({', '.join(pins.releases)}) nor an executable")
    return EngineSpec(ref.label, ref.argv)


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
    _budget: int | None = None  # bytes a run in progress may still send
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
        if _STOPPING.is_set():
            raise Stopped(f"{self.spec.label}: not started, the run is being stopped")
        self._stderr = tempfile.TemporaryFile()
        try:
            proc = start_kept(list(self.spec.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=self._stderr)
        except OSError as exc:
            raise EngineFailure("crash", f"{self.spec.label}: cannot start {self.spec.argv[0]!r}: {exc}")
        with _LIVE_LOCK:  # an end_all() that ran meanwhile must not miss this engine
            stopping = _STOPPING.is_set()
            if not stopping:
                _LIVE.add(proc)
        if stopping:
            _kill_group(proc)
            raise Stopped(f"{self.spec.label}: ended at once, the run is being stopped")
        self._proc = proc
        threading.Thread(target=self._read, args=(self._proc.stdout, self._lines), daemon=True).start()
        with self._ended_on_interrupt():
            message = self._next(time.monotonic() + handshake, ("hello", "error"), "handshake")
            if message["type"] == "error":
                self.close()
                raise EngineFailure("engine_error", f"{self.spec.label} refused to start: "
                                    f"{protocol.cut(message['message'], protocol.MAX_ERROR_MESSAGE)}"
                                    f"{self._tail()}")
            if message["protocol"] != protocol.PROTOCOL_VERSION:
                self.close()
                raise EngineFailure("protocol", f"{self.spec.label}: expected protocol version "
                                    f"{protocol.PROTOCOL_VERSION}, got {message['protocol']}")
            self.hello = message

    def run(self, scenario: Scenario, layers: list[str], timeout: float | None = None) -> dict[str, list]:
        """Run one scenario; return the records of each requested layer, in order. The timeout
        bounds the whole run (sending it, and every record), not each line."""
        if timeout is None:
            timeout = self.run_timeout if self.run_timeout is not None else \
                timeout_setting("VLLM_PARITY_RUN_TIMEOUT", RUN_TIMEOUT)
        with self._ended_on_interrupt():
            self._budget = self.max_run_bytes if self.max_run_bytes is not None else protocol.MAX_RUN_BYTES
            try:
                return self._run(scenario, layers, time.monotonic() + timeout)
            finally:
                self._budget = None

    def _run(self, scenario: Scenario, layers: list[str], deadline: float) -> dict[str, list]:
        self._runs += 1
        # a failure shows the stderr lines of this run, not those earlier runs of this warm engine
        # left (the first run's include what the engine wrote while starting)
        if self._runs > 1:
            self._stderr_mark = os.fstat(self._stderr.fileno()).st_size
        run_id = f"run-{self._runs}"
        records: dict[str, list] = {layer: [] for layer in layers}
        last: tuple | None = None
        where = _progress(scenario.name, records, last)
        self._send({"type": "run", "id": run_id, "scenario": scenario.to_wire(), "layers": layers},
                   records, deadline, where)
        while True:
            where = _progress(scenario.name, records, last)
            message = self._next(deadline, ("record", "done", "error"), where, records)
            if message["id"] != run_id:
                self._fail("protocol", f"{where}: expected messages for {run_id!r}, got id "
                           f"{message['id']!r}", records)
            if message["type"] == "error":
                # an engine that does not serve a layer says so: the verdict is `unsupported`;
                # any other error comes with the engine's last stderr lines (its traceback)
                text = protocol.cut(message["message"], protocol.MAX_ERROR_MESSAGE)
                if message["kind"] == "unsupported":
                    raise EngineFailure("unsupported", f"{where}: engine reported unsupported: {text}", records)
                tail = "" if message["kind"] == "bad_request" else self._tail()  # our input's fault
                raise EngineFailure("engine_error", f"{where}: engine reported {protocol.cut(message['kind'], 40)}: "
                                    f"{text}{tail}", records)
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
            last = (layer, message["seq"], message["data"])
            most = self.max_run_records if self.max_run_records is not None else protocol.MAX_RUN_RECORDS
            if sum(len(v) for v in records.values()) > most:
                self._fail("protocol", f"{_progress(scenario.name, records, last)}: more than {most} records "
                           "in one run, the limit (engines/PROTOCOL.md \"Limits\"; "
                           "$VLLM_PARITY_MAX_RUN_RECORDS raises it)", records)

    def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if proc.poll() is None and _write_within(proc, protocol.encode({"type": "shutdown"}),
                                                 SHUTDOWN_GRACE) == "ok":
            try:
                proc.wait(timeout=SHUTDOWN_GRACE)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(proc)

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
            exc.parity_strays = getattr(exc, "parity_strays", Ended()) + _kill_group(proc)  # said by the caller
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
            if _STOPPING.is_set():  # end_all() ended this engine: no failure to report
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
                    self._fail("protocol", f"{self.spec.label} during {where}: its records exceed "
                               f"{self.max_run_bytes} bytes in one run, the limit (engines/PROTOCOL.md "
                               "\"Limits\"; $VLLM_PARITY_MAX_RUN_BYTES raises it)", partial)
            try:
                return protocol.decode(line, expect)
            except protocol.ProtocolError as exc:
                self._fail("protocol", f"{self.spec.label} during {where}: {exc}", partial)

    def _timed_out(self, where: str, partial: dict | None) -> None:
        proc, self._proc = self._proc, None
        strays = _kill_group(proc)
        raise EngineFailure("timeout", f"{self.spec.label}: no answer during {where} before the "
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
            strays = _kill_group(proc)  # children that outlived it, or the engine itself if it lingers
        if stdout_held:
            how = f"exited (status {code}) but a child process kept its stdout open"
        elif code is None:
            how = "closed its stdout without exiting"
        else:
            how = f"exited (status {code})"
        raise EngineFailure("crash", f"{self.spec.label} {how} during {where}; "
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
        raise ValueError(f"{name}={text!r}: expected a positive number of seconds")
    return value


def limit_setting(name: str, default: int) -> int:
    """A limit from the environment ($VLLM_PARITY_MAX_RUN_BYTES, ...), read when an engine
    starts; a bad value is bad input naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise ValueError(f"{name}={text!r}: expected a positive whole number")
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


# Every engine process started and not yet ended: engines run in threads side by side
# (runner.side_by_side), and a Ctrl-C reaches only the main thread, which ends them all.
_LIVE: set = set()
_LIVE_LOCK = threading.Lock()
# Set while a run is being stopped: no engine starts again, no wait for an engine goes on.
_STOPPING = threading.Event()
# Every engine's environment carries its own mark, inherited by its children: a child that
# left the engine's process group (setsid) is still found by it, even once reparented, should
# its keeper be gone.
MARK = "VLLM_PARITY_ENGINE_MARK"
_MARKS = itertools.count(1)
KEEPER = Path(__file__).with_name("keeper.py")
KEEPER_START = 30.0  # seconds for the keeper to start the engine (a Python start, a fork and an exec)
KEEPER_END = 8.0  # seconds for the keeper to end every process of its engine (its grace is 3 s)


@dataclass
class Ended:
    """What ending an engine did beyond its process group, by pid: the processes that had left
    the group (found by its keeper, by the mark, or below the engine) that were killed, those
    already gone when looked for, and those still running after it all. `unkept`: engines
    whose keeper was gone before it could say what it ended."""

    killed: list[int] = field(default_factory=list)
    not_found: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    unkept: int = 0

    def __add__(self, other: "Ended") -> "Ended":
        return Ended(self.killed + other.killed, self.not_found + other.not_found,
                     self.left + other.left, self.unkept + other.unkept)


def start_kept(argv: list[str], **popen) -> subprocess.Popen:
    """`argv` started under its keeper (conformance/keeper.py) in a session of its own, with
    `popen`'s stdin, stdout, stderr: the keeper is the process returned (its exit status is
    the engine's), the engine its child. The engine's environment carries a mark of its own.
    The harness holds the keeper's control pipe: when it is closed, by _kill_group or by the
    harness's death (kill -9 included), the keeper ends every process of the engine."""
    mark = f"{os.getpid()}-{next(_MARKS)}"
    control_r, control_w = os.pipe()
    report_r, report_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(KEEPER), str(control_r), str(report_w), "--", *argv],
            start_new_session=True,  # own group: killed with its children; no terminal signal reaches it
            env={**os.environ, MARK: mark},  # inherited by its children, found by it if they leave the group
            pass_fds=(control_r, report_w), **popen)
    except BaseException:
        os.close(control_w)
        os.close(report_r)
        raise
    finally:  # the keeper's ends, in the keeper only
        os.close(control_r)
        os.close(report_w)
    proc.parity_mark, proc.parity_control, proc.parity_report = mark, control_w, report_r
    proc.parity_said = b""
    said = _keeper_says(proc, KEEPER_START)
    if said is None or said[0] != "engine":
        _kill_group(proc)
        raise OSError(" ".join(said[1:]) if said else "its keeper ended before starting it")
    proc.parity_engine = int(said[1])
    return proc


def stop_kept(proc: subprocess.Popen) -> Ended:
    """End a process start_kept started, and everything it started."""
    return _kill_group(proc)


def _keeper_says(proc: subprocess.Popen, seconds: float) -> list[str] | None:
    """The keeper's next line on its report pipe, split in words (conformance/keeper.py says
    which), waiting up to `seconds`; None at its end."""
    deadline = time.monotonic() + seconds
    while b"\n" not in proc.parity_said:
        if proc.parity_report is None:
            return None
        ready, _, _ = select.select([proc.parity_report], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(proc.parity_report, 65536) if ready else b""
        if not chunk:
            os.close(proc.parity_report)
            proc.parity_report = None
            if not proc.parity_said:
                return None
            proc.parity_said += b"\n"
        proc.parity_said += chunk
    line, _, proc.parity_said = proc.parity_said.partition(b"\n")
    return line.decode("utf-8", "replace").split(" ") if line else None


def end_all() -> Ended:
    """Stop the run: no engine starts again (until `resume`), and every engine process still
    running is ended with its children. Returns what was ended by pid."""
    with _LIVE_LOCK:
        _STOPPING.set()
        procs = list(_LIVE)
    for proc in procs:  # every group told at once, so their exits overlap
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    ended = Ended()
    for proc in procs:
        ended += _kill_group(proc)
    return ended


def resume() -> None:
    """Engines may start again (after a stop that was handled)."""
    _STOPPING.clear()


def _kill_group(proc: subprocess.Popen | None) -> Ended:
    """End an engine: its keeper is told (its control pipe closed) and ends every process below
    it by pid; the group is signalled too (SIGTERM, then SIGKILL should the keeper not be done
    in time). Then, by pid, any process outside the group the keeper did not end (found by the
    engine's mark, or below the keeper before it ended): the keeper was gone, or this is not
    Linux. What was ended by pid, and what was not found, is returned for the message."""
    if proc is None:
        return Ended()
    with _LIVE_LOCK:
        _LIVE.discard(proc)
        lock = proc.__dict__.setdefault("parity_ending", threading.Lock())
    with lock:  # a stop (end_all) and the engine's own thread may both end it: once, the other waits
        if getattr(proc, "parity_ended", False):
            return Ended()
        proc.parity_ended = True
        return _end(proc)


def _end(proc: subprocess.Popen) -> Ended:
    tree = _descendants(proc.pid)  # while the keeper lives, every process of the engine is below it
    control = getattr(proc, "parity_control", None)
    if control is not None:
        proc.parity_control = None
        os.close(control)
    for sig, wait in ((signal.SIGTERM, KEEPER_END), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # anything left in the group
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)  # reap the keeper, whatever ended it
    ended = _keeper_ended(proc)
    mark = getattr(proc, "parity_mark", None)
    done = set(ended.killed) | set(ended.not_found)
    strays = sorted(p for p in set(tree) | set(_marked(mark) if mark else ())
                    if p not in done and _outside(p, proc.pid))
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
            ended.killed.append(pid)
        except ProcessLookupError:
            ended.not_found.append(pid)
        except PermissionError:
            pass
    deadline = time.monotonic() + 2.0
    while any(_running(p) for p in ended.killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    ended.left = sorted(set(ended.left) | {p for p in ended.killed if _running(p)})
    ended.killed = sorted(p for p in set(ended.killed) if p not in ended.left)
    ended.not_found = sorted(set(ended.not_found))
    return ended


def _keeper_ended(proc: subprocess.Popen) -> Ended:
    """What the keeper said it ended outside the engine's group; `unkept` when it said nothing
    (it was killed, or never started the engine)."""
    said: list[str] | None = [""]
    while said is not None and said[0] != "exit":
        said = _keeper_says(proc, 2.0)
    if said is None:
        return Ended(unkept=1 if getattr(proc, "parity_engine", None) else 0)
    ended = Ended()
    for item in said[2:]:
        pid, group, outcome = item.split(":")
        if group == str(proc.pid):  # in the engine's group: ended with it, not named
            continue
        {"killed": ended.killed, "not_found": ended.not_found, "left": ended.left}[outcome].append(int(pid))
    return ended


def ended_words(ended: Ended, who: str = "the engine and its children") -> str:
    """What was ended, truthfully: a process that had left its engine's process group is named
    by pid, as is one that was already gone when looked for and one that still runs."""
    words = f"{who} were ended"
    if ended.killed:
        n = len(ended.killed)
        words += (f" ({n} of them by pid, {', '.join(map(str, ended.killed))}: "
                  f"{'it' if n == 1 else 'they'} had left the engine's process group)")
    if ended.not_found:
        words += f"; not found, already gone: pid {', '.join(map(str, ended.not_found))}"
    if ended.left:
        words += f"; could not end pid {', '.join(map(str, ended.left))}, still running"
    if ended.unkept:
        words += ("; an engine's keeper was gone before it said what it ended, so a child that left "
                  "its process group and cleared its environment could not be looked for")
    return words


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a process, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _outside(pid: int, group: int) -> bool:
    """Running in another process group than `group`: out of killpg's reach."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[2] != group


def _running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie has ended


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc (not Linux): process groups are all there is
        return []


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None:
            children.setdefault(stat[1], []).append(pid)
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _marked(mark: str) -> list[int]:
    """Processes whose environment carries `mark` (readable for our own processes only)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found
