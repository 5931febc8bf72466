"""Shared fixtures. The harness's self-tests live in tests/; the vLLM oracles they drive are
real pinned releases, one warm worker per pin for the whole session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
GATE = REPO / "scenarios" / "dflash_27b_gate.json"
DOUBLE = REPO / "tests" / "doubles" / "double_engine.py"
# every test driving a real pin is marked `oracle` (tests/oracle_marker.py checks it)
pytest_plugins = ("tests.oracle_marker",)


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
    _goldens_selected(config, items, load_pins())
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
            engine = EngineRef.test_device(oracle, params["mutant"]).text
        item.add_marker(pytest.mark.xdist_group(engine))


def _goldens_selected(config, items, pins) -> None:
    """`make goldens PINS=... LAYERS=...` ($VLLM_PARITY_GOLDEN_PINS, $VLLM_PARITY_GOLDEN_LAYERS)
    keeps only those goldens' tests; on a GPU, a golden update that would write any golden a CPU
    wrote is refused before anything runs (conformance/formats/gpu.py golden_written_here)."""
    import os

    from conformance.formats import gpu
    from conformance.formats.settings import device_mode

    pins_setting = os.environ.get("VLLM_PARITY_GOLDEN_PINS", "")
    layers_setting = os.environ.get("VLLM_PARITY_GOLDEN_LAYERS", "")
    golden = [(item, item.callspec.params) for item in items if hasattr(item, "callspec")
              and {"scenario", "release"} <= item.callspec.params.keys() and "parity" in item.path.parts]
    if pins_setting or layers_setting:
        dropped = [item for item, p in golden
                   if not gpu.selected_for_goldens(p["scenario"].layers, p["release"], pins_setting, layers_setting)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item not in set(dropped)]
            golden = [(item, p) for item, p in golden if item not in set(dropped)]
    if not config.getoption("update_snapshots", default=False) or device_mode() != "gpu":
        return
    refused = [item.nodeid for item, p in golden if not gpu.golden_written_here(
        p["scenario"].layers, p["release"], "gpu", pins.cpu_engine_build(p["release"]))]
    if refused:
        raise pytest.UsageError(
            f"on a GPU, `make goldens` writes only the engine goldens of pins without a CPU engine "
            f"build; {len(refused)} selected goldens were written on CPU (first: {refused[0]}). "
            "Run `make goldens PINS=0.33.0 LAYERS=engine`.")


# Engines kept warm at once per pytest process. A group's tests run one after another, so an
# engine ended to make room is rarely wanted again; the cap keeps `make test` near 3 GiB. On a
# GPU each also needs its share of GPU memory (max_warm).
MAX_WARM = 3


def max_warm(device: str, processes: int) -> int:
    """Warm engines per pytest process: MAX_WARM, and on a GPU no more than the processes'
    share of the engines its free memory holds (conformance/formats/gpu.py), at least one."""
    if device != "gpu":
        return MAX_WARM
    from conformance.formats import gpu

    return max(1, min(MAX_WARM, gpu.engines_fitting(gpu.memory()[0]) // max(1, processes)))


@pytest.fixture(scope="session")
def warm_workers(request):
    """engine (a pin, or a pin's TEST DEVICE mutant "0.27.1+mutant:NAME") -> a started
    EngineProcess, started once per session (per xdist process), closed at the end."""
    from concurrent.futures import ThreadPoolExecutor

    from conformance.formats.engine_ref import EngineRef
    from conformance.formats.pins import load_pins
    from conformance.formats.settings import device_mode
    from conformance.process.client import EngineProcess
    from conformance.process.launch import prepare_engine

    workers: dict[str, EngineProcess] = {}  # least recently used first
    xdist = getattr(request.config, "workerinput", None)  # set in a pytest-xdist worker
    processes = xdist["workercount"] if xdist else 1
    most = max_warm(device_mode(), processes)
    pins = load_pins()

    def get(engine: str) -> EngineProcess:
        if engine not in workers:
            proc = EngineProcess(prepare_engine(EngineRef.parse(engine, pins), pins, log=lambda m: None))
            proc.start()
            workers[engine] = proc
            while len(workers) > most:  # each holds up to 1 GiB: end the longest unused
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
