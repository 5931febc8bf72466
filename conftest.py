"""Shared fixtures. The harness's self-tests live in tests/; the vLLM oracles they drive are
real pinned releases, one warm worker per pin for the whole session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
GATE = REPO / "scenarios" / "dflash_27b_gate.json"
DOUBLE = REPO / "tests" / "doubles" / "double_engine.py"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group markers added here
def pytest_collection_modifyitems(config, items):
    from conformance.envs import device_mode
    from conformance.pins import load_pins

    if device_mode() != "gpu":  # the same rule that picks a pin environment's recipe
        skip = pytest.mark.skip(reason="needs a CUDA GPU; this runner has none")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    # `make test` runs two pytest processes (pytest-xdist, --dist loadgroup). Every test that
    # uses a warm worker is grouped by the engine it drives, so each engine still costs one
    # cold start per session, in one of the two processes. The engine is the test's `release`
    # or `mutant` parameter, else the gate oracle; a test driving another says so with its own
    # xdist_group marker.
    oracle = load_pins().oracle
    for item in items:
        if "warm_workers" not in getattr(item, "fixturenames", ()) or item.get_closest_marker("xdist_group"):
            continue
        params = getattr(item, "callspec", None)
        params = params.params if params else {}
        engine = params.get("release", oracle)
        if "mutant" in params:
            engine = f"{oracle}+mutant:{params['mutant']}"
        item.add_marker(pytest.mark.xdist_group(engine))


# Engines kept warm at once per pytest process. A group's tests run one after another, so an
# engine ended to make room is rarely wanted again; the cap keeps `make test` near 3 GiB.
MAX_WARM = 3


@pytest.fixture(scope="session")
def warm_workers():
    """engine (a pin, or a pin's TEST DEVICE mutant "0.27.1+mutant:NAME") -> a started
    EngineProcess, started once per session (per xdist process), closed at the end."""
    from concurrent.futures import ThreadPoolExecutor

    from conformance.engine import EngineProcess, resolve_engine

    workers: dict[str, EngineProcess] = {}  # least recently used first

    def get(engine: str) -> EngineProcess:
        if engine not in workers:
            proc = EngineProcess(resolve_engine(engine, log=lambda m: None))
            proc.start()
            workers[engine] = proc
            while len(workers) > MAX_WARM:  # each holds up to 1 GiB: end the longest unused
                workers.pop(next(iter(workers))).close()
        workers[engine] = workers.pop(engine)
        return workers[engine]

    yield get
    with ThreadPoolExecutor() as pool:  # each engine takes seconds to shut down: all at once
        list(pool.map(EngineProcess.close, workers.values()))


@pytest.fixture
def double_engine():
    """Argv of the TEST DOUBLE engine with extra options."""
    def make(*options: str) -> tuple[str, ...]:
        return (sys.executable, str(DOUBLE), *options)
    return make
