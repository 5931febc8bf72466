"""Shared fixtures. The harness's self-tests live in tests/; the vLLM oracles they drive are
real pinned releases, one warm worker per pin for the whole session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
GATE = REPO / "scenarios" / "dflash_27b_gate.json"
DOUBLE = REPO / "tests" / "doubles" / "double_engine.py"


def pytest_collection_modifyitems(config, items):
    from conformance.envs import device_mode

    if device_mode() != "gpu":  # the same rule that picks a pin environment's recipe
        skip = pytest.mark.skip(reason="needs a CUDA GPU; this runner has none")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def warm_workers():
    """release -> a started EngineProcess, started once per session, closed at the end."""
    from conformance.engine import EngineProcess, resolve_engine

    workers: dict[str, EngineProcess] = {}

    def get(release: str) -> EngineProcess:
        if release not in workers:
            proc = EngineProcess(resolve_engine(release, log=lambda m: None))
            proc.start()
            workers[release] = proc
        return workers[release]

    yield get
    for proc in workers.values():
        proc.close()


@pytest.fixture
def double_engine():
    """Argv of the TEST DOUBLE engine with extra options."""
    def make(*options: str) -> tuple[str, ...]:
        return (sys.executable, str(DOUBLE), *options)
    return make
