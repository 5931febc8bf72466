"""The kinds of a verdict, one enum for every stage: an engine's failure (process/client.py
raises EngineFailure with one), a golden that cannot be read (judging/goldens.py), a verdict
(judging/verdict.py) and every report. A StrEnum: each kind is its word in traces, results
folders and reports, unchanged. Standard library only."""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    PASS = "pass"
    # a real engine that differs only where arithmetic explains it (judging/numerics.py):
    # reported, never failing
    NUMERICS = "numerics"
    DIVERGED = "diverged"
    # runs that could not be compared at all; each is its own line in a report
    CRASH = "crash"
    TIMEOUT = "timeout"
    PROTOCOL = "protocol"
    ENGINE_ERROR = "engine_error"
    NONDETERMINISTIC = "nondeterministic"
    MISSING_GOLDEN = "missing_golden"
    INVALID_GOLDEN = "invalid_golden"
    UNSUPPORTED = "unsupported"


FAILURE_KINDS = (Kind.CRASH, Kind.TIMEOUT, Kind.PROTOCOL, Kind.ENGINE_ERROR, Kind.NONDETERMINISTIC,
                 Kind.MISSING_GOLDEN, Kind.INVALID_GOLDEN, Kind.UNSUPPORTED)
# the failures an engine's process can end a run with, its records so far kept and judged
PARTIAL_KINDS = (Kind.CRASH, Kind.TIMEOUT, Kind.PROTOCOL, Kind.ENGINE_ERROR)
