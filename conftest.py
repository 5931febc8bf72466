"""pytest's hooks and fixtures for the whole suite, nothing else (the constants and helpers test
files share are plain code, in tests/helpers.py). The harness's self-tests live in tests/; the vLLM
oracles they drive are real pinned releases, one warm engine session per pin for the whole session."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import CANDIDATE_PINS, DOUBLE

# every test driving a real pin is marked `oracle` (tests/oracle_marker.py checks it)
pytest_plugins = ("tests.oracle_marker", "tests.warm_engines")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group markers added here
def pytest_collection_modifyitems(config, items):
    from conformance.formats.engine_ref import EngineRef
    from conformance.formats.pins import load_pins
    from conformance.formats.settings import device_mode

    if device_mode() != "gpu":  # the same rule that picks a pin environment's recipe
        skip = pytest.mark.skip(reason="needs a CUDA GPU; this runner has none")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    # `make test` runs two pytest processes (pytest-xdist, --dist loadgroup). Every test that
    # uses a warm session is grouped by the engine it drives, so each engine still costs one
    # cold start per session, in one of the two processes. The engine is the test's `release`
    # or `mutant` parameter, else the gate oracle; a test driving another says so with its own
    # xdist_group marker. The pins other than the oracle share one group (CANDIDATE_PINS): a
    # gate with live stand-ins warms every pin, and in one process each of them starts once.
    # A module-scoped fixture is set up once per process: the tests using one share a group too.
    pins = load_pins()
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        if "warm_sessions" not in getattr(item, "fixturenames", ()):
            defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
            if any(d.scope == "module" for chain in defs.values() for d in chain):
                item.add_marker(pytest.mark.xdist_group(f"module-fixtures:{item.module.__name__}"))
            continue
        params = getattr(item, "callspec", None)
        params = params.params if params else {}
        if "mutant" in params:
            engine = EngineRef.test_device(pins.oracle, params["mutant"])
        else:
            engine = EngineRef.parse(params.get("release", pins.oracle), pins)
        other_pin = engine.is_pin and engine.release != pins.oracle
        item.add_marker(pytest.mark.xdist_group(CANDIDATE_PINS if other_pin else engine.text))


@pytest.fixture
def double_engine():
    """Argv of the TEST DOUBLE engine with extra options."""
    def make(*options: str) -> tuple[str, ...]:
        return (sys.executable, str(DOUBLE), *options)
    return make

