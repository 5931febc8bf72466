"""Every engine process started and not yet ended, and how one is ended: its process
group, then by pid any of its processes that left the group (found by the mark each engine's
environment carries, or as a descendant seen in /proc). Engines run in threads side by side and
a Ctrl-C reaches only the main thread, which ends them all (end_all); while a run is being
stopped no engine starts (track, stopping).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

# Every engine process started and not yet ended: engines run in threads side by side
# (gate/execute.py side_by_side), and a Ctrl-C reaches only the main thread, which ends them all.
_LIVE: set = set()
_LIVE_LOCK = threading.Lock()
# Set while a run is being stopped: no engine starts again, no wait for an engine goes on.
_STOPPING = threading.Event()
# Each engine is ended once, though a stop (end_all) and its own thread may both end it.
_ENDING: "weakref.WeakKeyDictionary[subprocess.Popen, threading.Lock]" = weakref.WeakKeyDictionary()
_ENDED: "weakref.WeakSet[subprocess.Popen]" = weakref.WeakSet()
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


# What was ended while an error or an interrupt unwound the stack (an engine's own thread, the
# side-by-side run), kept until the next end_all tells it: the handler that says what was ended
# (parity's main) is far up the stack, and an exception is no place to carry it.
_UNWOUND: list[Ended] = []


def ended_unwinding(ended: Ended) -> None:
    """Keep what was ended while an exception unwinds, for the next end_all to tell."""
    with _LIVE_LOCK:
        _UNWOUND.append(ended)


def start_kept(argv: list[str], **popen) -> subprocess.Popen:
    """`argv` started under its keeper (conformance/process/keeper.py) in a session of its own, with
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
        kill_group(proc)
        raise OSError(" ".join(said[1:]) if said else "its keeper ended before starting it")
    proc.parity_engine = int(said[1])
    return proc


def stop_kept(proc: subprocess.Popen) -> Ended:
    """End a process start_kept started, and everything it started."""
    return kill_group(proc)


def _keeper_says(proc: subprocess.Popen, seconds: float) -> list[str] | None:
    """The keeper's next line on its report pipe, split in words (conformance/process/keeper.py says
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


def end_all() -> Ended:
    """Stop the run: no engine starts again (until `resume`), and every engine process still
    running is ended with its children. Returns what was ended by pid, with what was ended
    while the stop's exception unwound (ended_unwinding)."""
    with _LIVE_LOCK:
        _STOPPING.set()
        procs = list(_LIVE)
    for proc in procs:  # every group told at once, so their exits overlap
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    ended = Ended()
    for proc in procs:
        ended += kill_group(proc)
    with _LIVE_LOCK:
        unwound, _UNWOUND[:] = list(_UNWOUND), []
    return sum(unwound, Ended()) + ended


def resume() -> None:
    """Engines may start again (after a stop that was handled)."""
    _STOPPING.clear()


def track(proc: subprocess.Popen) -> bool:
    """Count an engine process as live until it is ended. While the run is being stopped it is
    ended at once instead, and False is returned: an end_all() that ran meanwhile must not miss it."""
    with _LIVE_LOCK:
        stopped = _STOPPING.is_set()
        if not stopped:
            _LIVE.add(proc)
    if stopped:
        kill_group(proc)
    return not stopped


def stopping() -> bool:
    """The run is being stopped: no engine starts, no wait for an engine goes on."""
    return _STOPPING.is_set()


def kill_group(proc: subprocess.Popen | None) -> Ended:
    """End an engine: its keeper is told (its control pipe closed) and ends every process below
    it by pid; the group is signalled too (SIGTERM, then SIGKILL should the keeper not be done
    in time). Then, by pid, any process outside the group the keeper did not end (found by the
    engine's mark, or below the keeper before it ended): the keeper was gone, or this is not
    Linux. What was ended by pid, and what was not found, is returned for the message."""
    if proc is None:
        return Ended()
    with _LIVE_LOCK:
        _LIVE.discard(proc)
        lock = _ENDING.setdefault(proc, threading.Lock())
    with lock:  # a stop (end_all) and the engine's own thread may both end it: once, the other waits
        if proc in _ENDED:
            return Ended()
        _ENDED.add(proc)
        return _end(proc)


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
