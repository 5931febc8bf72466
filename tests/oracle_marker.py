"""A pytest plugin (conftest.py loads it): every test that drives a real pinned vLLM release is
marked `oracle`, so `-m "not oracle"` leaves out every test that needs the pin environments, and
the slow tests are known by their marker. Checked twice: at collection, a test that uses the warm
engines (the `warm_sessions` fixture) must carry the marker; while tests run, a process started
from a pin's environment (an audit hook on subprocess.Popen: the worker, a mutant server, a
coverage run, each with a pin's python) fails the test that started it when it is not marked."""

from __future__ import annotations

import sys
import threading

import pytest

from conformance.formats.settings import cache_root

PIN_PYTHONS = str(cache_root() / "envs") + "/"  # the real cache: a test's own cache root is no pin
_lock = threading.Lock()
_started: set[str] = set()  # argv[0]s of pin processes started since the last take()


def pin_argv(args) -> str | None:
    """The pin python an argv runs (directly or through the keeper), if any."""
    if isinstance(args, (str, bytes)) or args is None:
        args = [args]
    for arg in args:
        text = arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)
        if text.startswith(PIN_PYTHONS):
            return text
    return None


def take() -> set[str]:
    """The pin processes started since the last call, forgotten."""
    with _lock:
        started = set(_started)
        _started.clear()
    return started


def _audit(event: str, args) -> None:
    if event == "subprocess.Popen":
        found = pin_argv(args[1])
        if found is not None:
            with _lock:
                _started.add(found)


sys.addaudithook(_audit)


def unmarked_warm(items) -> list[str]:
    return [item.nodeid for item in items if "warm_sessions" in getattr(item, "fixturenames", ())
            and not item.get_closest_marker("oracle") and not item.get_closest_marker("gpu")]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    unmarked = unmarked_warm(items)
    if unmarked:
        raise pytest.UsageError(f"tests using the warm pinned engines without the `oracle` marker: {unmarked}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    take()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "teardown" or item.get_closest_marker("oracle") or item.get_closest_marker("gpu"):
        return
    started = take()
    if started and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a pinned vLLM release ({sorted(started)[0]}) "
                           "without the `oracle` marker: mark it @pytest.mark.oracle")
