"""Progress on long work: what runs now, how far along the whole is, about how long is left.

Everything goes through a `log` function the caller gives (the command line's writes to
stderr), never to stdout, which holds the report alone: `parity gate > report.txt` leaves
only the report in the file. Plain lines, no carriage-return animation, so a CI log reads
like a terminal. A heartbeat repeats the current activity whenever nothing was said for
HEARTBEAT seconds, so no cold start, pip install or long scenario is ever silent.
"""

from __future__ import annotations

import contextlib
import threading
import time

HEARTBEAT = 5.0  # seconds of silence before the current activity is repeated


def duration(seconds: float) -> str:
    """4.2 s, 38 s, 2 min 05 s: short enough for a progress line."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s"


class Progress:
    """Work measured in estimated seconds (`total`); `advance` as parts finish. The time left
    is the estimate of what remains, scaled by how fast the estimate has proved so far."""

    def __init__(self, total: float, log, heartbeat: float = HEARTBEAT, clock=time.monotonic):
        self.total, self.done = max(total, 0.0), 0.0
        self._log, self._clock, self._every = log, clock, heartbeat
        self._start = self._said = clock()
        # what runs now, by key (one per engine side by side): activity, since, estimated cost
        self._running: dict = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, message: str) -> None:
        with self._lock:
            self._said = self._clock()
            self._log(message)

    def begin(self, activity: str, cost: float = 0.0, key=None) -> None:
        """A new activity of `cost` estimated seconds (not yet done): said now, with the time
        left, and repeated while it lasts. It replaces the activity of the same `key` (one
        key per engine running side by side)."""
        with self._lock:
            self._running[key] = (activity, self._clock(), max(cost, 0.0))
        self.say(f"{activity} [{self.status()}]")

    def advance(self, cost: float, key=None) -> None:
        """`cost` estimated seconds are done; the activity of `key` has ended (never repeated
        again: an engine that failed is not "still running")."""
        with self._lock:
            self.done = min(self.total, self.done + max(cost, 0.0))
            self._running.pop(key, None)

    def elapsed(self) -> float:
        return self._clock() - self._start

    def left(self) -> float:
        """Seconds left by estimate: the estimated remainder at the rate measured so far
        (the estimate itself until enough is done to measure a rate)."""
        rate = self.elapsed() / self.done if self.done >= 0.05 * self.total and self.done > 0 else 1.0
        # the current activities count as done for the time they have run, up to their estimates
        now = self._clock()
        current = sum(min(cost, (now - since) / rate) for _, since, cost in list(self._running.values()))
        return max((self.total - self.done - current) * rate, 0.0)

    def status(self) -> str:
        share = 100.0 * self.done / self.total if self.total else 100.0
        return f"{share:.0f}% done, {duration(self.elapsed())} elapsed, about {duration(self.left())} left"

    def __enter__(self) -> "Progress":
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self._every)):
            with self._lock:
                quiet = self._clock() - self._said >= self._every
                running = sorted(self._running.values(), key=lambda r: r[1]) if quiet else []
            for activity, since, _ in running:
                self.say(f"{activity}: still running after {duration(self._clock() - since)} "
                         f"[{self.status()}]")


class EngineProgress:
    """One engine's share of a Progress, as its session (process/session.py) reports it: each
    cold start (`starting`), then each item in turn (`item` when its run begins, `end` when it
    has its trace). items: (scenario name, layers, estimated seconds); the cold start counts as
    done once the first item starts."""

    def __init__(self, progress: Progress, tag: str, label: str, items: list[tuple[str, list, float]],
                 cold_start: float):
        self.progress, self.tag, self.label, self.items = progress, tag, label, items
        self.cold_start, self._starting = cold_start, False
        self._ended = 0  # items ended so far: the current one is the next

    def starting(self) -> None:
        self._starting = True
        self.progress.begin(f"[{self.tag}] {self.label}: starting the engine", self.cold_start, self)

    def item(self) -> None:
        self._started()
        name, layers, cost = self.items[self._ended]
        self.progress.begin(f"[{self.tag}] {self.label}: {name} ({', '.join(layers)}; "
                            f"{self._ended + 1}/{len(self.items)})", cost, self)

    def end(self) -> None:
        self._started()  # an engine that failed to start ends its item without running it
        self.progress.advance(self.items[self._ended][2], self)
        self._ended += 1

    def _started(self) -> None:
        if self._starting:
            self._starting = False
            self.progress.advance(self.cold_start, self)


@contextlib.contextmanager
def heartbeat(log, activity: str, every: float = HEARTBEAT, clock=time.monotonic):
    """Say `activity` now and again every `every` seconds while the block runs, with the time
    it has taken; say how long it took at the end. For one long step with no estimate (a pip
    install inside an environment build)."""
    start = clock()
    stop = threading.Event()
    log(f"{activity} ...")

    def beat() -> None:
        while not stop.wait(every):
            log(f"{activity}: still running after {duration(clock() - start)}")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    outcome = "failed after"
    try:
        yield
        outcome = "done in"
    finally:
        stop.set()
        thread.join()
        log(f"{activity}: {outcome} {duration(clock() - start)}")
