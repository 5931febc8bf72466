"""What every stage of one gate run (or merge) shares, passed as one value: the pins, where the
progress and the report go, the waivers, the folders it writes, and what was asked of it.
`parity gate` and `parity merge` build it from their arguments."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from conformance.formats.pins import Pins
from conformance.judging.waivers import Waiver
from conformance.process.session import EngineSession

# What makes the session of each engine a gate runs: EngineSession(spec, **options). The one seam
# for whoever embeds a gate run (the test suite lends its warm engines through it: tests/
# warm_engines.py); read once, when the run's context is made, in the thread that makes it.
ENGINE_SESSIONS: ContextVar[Callable[..., EngineSession]] = ContextVar("engine_sessions", default=EngineSession)


@dataclass(frozen=True)
class RunContext:
    pins: Pins
    log: Callable[[str], None]  # progress and side notes: stderr
    out: Callable[[str], None] = print  # the report itself: stdout
    waivers: Sequence[Waiver] = ()  # checked before any engine runs
    reports: Path | None = None  # the reports folder: the whole gate's (a shard writes none)
    results: Path | None = None  # the results folder this run writes its traces to
    shard: tuple[int, int] | None = None  # (I, N): run shard I of N, then `parity merge`
    parallel: int = 1  # engines side by side
    layers: list[str] | None = None  # the layers asked (None: every layer of each scenario)
    require_layers: list[str] | None = None  # the layers a candidate must serve (None: those asked)
    require_features: list[str] | None = None  # the features a candidate must declare (None: none)
    drift: bool = False  # the drift across pins and the per-pin tables even with a candidate
    # makes each engine's session (ENGINE_SESSIONS above): EngineSession unless an embedder lends its own
    sessions: Callable[..., EngineSession] = field(default_factory=ENGINE_SESSIONS.get)
