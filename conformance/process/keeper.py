"""The keeper: the parent of one engine process, so that the engine and every process it starts
end with the harness, even when the harness is killed with SIGKILL.

    python -I -S process/keeper.py CONTROL_FD REPORT_FD -- ENGINE ARGV...

It is started by conformance/process/client.py in place of the engine, in the engine's new session, and
  - makes itself a child subreaper (PR_SET_CHILD_SUBREAPER): every process the engine starts,
    one that calls setsid and clears its environment included, stays among its descendants
    when its own parent dies (it is reparented here, not to init);
  - starts the engine (fork, then exec in the child, which gets PR_SET_PDEATHSIG = SIGKILL
    bound to this single-threaded process: the engine dies should the keeper die) and gives it
    the harness's stdin and stdout, keeping no copy of them;
  - ends every descendant, by pid (SIGTERM, then SIGKILL after a grace), when:
      the harness closes CONTROL_FD or dies (the kernel closes it: the parent-death signal,
      whatever thread of the harness started the engine), or sends it SIGTERM;
      the engine exits (what it left behind is ended at once);
  - writes to REPORT_FD one line when the engine started (`engine PID`, or `exec_error WORDS`),
    and one when it ends (`exit STATUS PID:GROUP:OUTCOME ...`: the engine's wait status, `-`
    if it would not end, then each process it signalled with its process group when found,
    OUTCOME `killed`, `not_found` or `left`), then exits with the engine's own status (by the same signal when a signal ended it).

Standard library only, no import of the harness: it runs as a script of its own (-I -S).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
GRACE = 3.0  # seconds between SIGTERM and SIGKILL when the keeper ends the engine's processes
LEFTOVERS_GRACE = 1.0  # the same, for what a finished engine left behind
ROUNDS = 20  # SIGKILL passes over the descendants (a process may fork while being ended)


def prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: no subreaper, no parent-death signal
        return False


def descendants(root: int) -> dict[int, int]:
    """Every running process below `root`, from /proc (parent links): pid -> process group."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):  # a zombie has ended (its parent reaps it)
            children.setdefault(int(fields[1]), []).append((int(name), int(fields[2])))
    found, todo = {}, list(children.get(root, ()))
    while todo:
        pid, group = todo.pop(0)
        found[pid] = group
        todo.extend(children.get(pid, ()))
    return found


class Keeper:
    def __init__(self, control: int, report: int, argv: list[str]):
        self.control, self.report, self.argv = control, report, argv
        self.engine = 0
        self.status: int | None = None  # the engine's wait status once it exited
        self.outcomes: dict[int, list] = {}  # pid -> [pid, group, outcome]
        self.stopping = False

    def say(self, line: str) -> None:
        try:
            os.write(self.report, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        except OSError:  # the harness is gone: nobody to tell
            pass

    def start(self) -> bool:
        reader, writer = os.pipe()  # the child's exec error, if any; closed by a successful exec
        keeper = os.getpid()
        pid = os.fork()
        if pid == 0:
            self.exec_engine(writer, keeper)
        os.close(writer)
        error = b""
        while chunk := os.read(reader, 4096):
            error += chunk
        os.close(reader)
        if error:
            os.waitpid(pid, 0)
            self.say(f"exec_error {error.decode('utf-8', 'replace')}")
            return False
        self.engine = pid
        self.say(f"engine {pid}")
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the engine alone holds the harness's pipes: their ends are its own
        os.dup2(null, 1)
        os.close(null)
        return True

    def exec_engine(self, errors: int, keeper: int) -> None:
        try:
            os.close(self.control)
            os.close(self.report)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != keeper:  # the keeper died before the signal was armed
                os._exit(1)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)  # as subprocess leaves them for a program it starts
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.set_inheritable(0, True)
            os.set_inheritable(1, True)
            os.set_inheritable(2, True)
            os.execvp(self.argv[0], self.argv)
        except BaseException as exc:  # noqa: BLE001 - said to the keeper, then this child ends
            words = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            os.write(errors, f"[Errno {getattr(exc, 'errno', '')}] {words}".encode())
        os._exit(127)

    def serve(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine's session has no terminal; be sure
        while True:
            self.reap()
            if self.status is not None:  # the engine exited: end what it left, then follow it
                if self.has_children():  # its orphans are reparented here before it can be reaped
                    self.end_all(LEFTOVERS_GRACE)
                return self.finish()
            if self.stopping:
                self.end_all(GRACE)
                return self.finish()
            try:
                ready, _, _ = select.select([self.control, wake_r], [], [])
            except InterruptedError:
                continue
            if self.control in ready and not os.read(self.control, 4096):
                self.stopping = True  # the harness closed it, or died
            if wake_r in ready:
                while True:
                    try:
                        if not os.read(wake_r, 4096):
                            break
                    except BlockingIOError:
                        break

    def on_term(self, signum, frame) -> None:
        self.stopping = True

    def has_children(self) -> bool:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        return True

    def reap(self) -> None:
        """Reap every ended child: the engine, and the orphans reparented here."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.engine and self.status is None:
                self.status = status

    def end_all(self, grace: float) -> None:
        """Every descendant, by pid: SIGTERM, then SIGKILL those still running after `grace`."""
        me = os.getpid()
        for pid, group in descendants(me).items():
            self.signal(pid, group, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.reap()
            if not descendants(me):
                break
            time.sleep(0.02)
        for _ in range(ROUNDS):
            self.reap()
            left = descendants(me)
            if not left:
                break
            for pid, group in left.items():
                self.signal(pid, group, signal.SIGKILL)
            time.sleep(0.02)
        self.reap()
        for pid, group in descendants(me).items():
            self.outcomes.setdefault(pid, [pid, group, "left"])[2] = "left"

    def signal(self, pid: int, group: int, sig: int) -> None:
        """Signal `pid`, whose process group was `group` when it was found."""
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            self.outcomes.setdefault(pid, [pid, group, "not_found"])
            return
        self.outcomes.setdefault(pid, [pid, group, "killed"])

    def finish(self) -> int:
        status = self.status
        ended = " ".join(f"{pid}:{group}:{outcome}" for pid, group, outcome in self.outcomes.values()
                         if pid != self.engine)
        self.say(f"exit {'-' if status is None else status} {ended}".rstrip())
        if status is None:  # the engine would not end: say so by our own status
            return 125
        if os.WIFSIGNALED(status):  # ended by the same signal as the engine
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those have no handler to reset
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(os.getpid(), sig)
            return 128 + sig  # a signal whose default is not to end a process
        return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    control, report = int(argv[0]), int(argv[1])
    engine = argv[3:]  # after "--"
    for fd in (control, report):
        os.set_inheritable(fd, False)  # the engine never holds them: their end is the harness's
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    keeper = Keeper(control, report, engine)
    if not keeper.start():
        return 127
    return keeper.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
