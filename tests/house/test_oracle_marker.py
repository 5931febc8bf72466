"""tests/oracle_marker.py: a test that drives a real pin without the `oracle` marker fails."""

import pytest

from tests import oracle_marker

pytest_plugins = ("pytester",)

STARTS_A_PIN = f"""
import contextlib, subprocess, sys
import pytest

def start():  # a pin's python, started as the keeper starts it (the file need not exist)
    with contextlib.suppress(OSError):
        subprocess.Popen([sys.executable, "keeper.py", {oracle_marker.PIN_PYTHONS + 'vllm-0.0.0-cpu-x/bin/python'!r}])

def test_unmarked():
    start()

@pytest.mark.oracle
def test_marked():
    start()

def test_no_pin():
    pass
"""

WARM_UNMARKED = """
import pytest

@pytest.fixture
def warm_sessions():
    return {}

def test_uses_warm(warm_sessions):
    pass
"""


def test_a_test_starting_a_pin_without_the_marker_fails(pytester):
    pytester.makepyfile(STARTS_A_PIN)
    result = pytester.runpytest_inprocess("-p", "tests.oracle_marker", "-p", "no:xdist",
                                          "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*test_unmarked started a pinned vLLM release*without the `oracle` marker*"])


def test_a_test_using_the_warm_engines_without_the_marker_is_refused_at_collection(pytester):
    pytester.makepyfile(WARM_UNMARKED)
    result = pytester.runpytest_inprocess("-p", "tests.oracle_marker", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*without the `oracle` marker*test_uses_warm*"])


def test_the_pin_python_is_found_in_any_argument():
    pin = oracle_marker.PIN_PYTHONS + "vllm-0.27.1-cpu-k/bin/python"
    assert oracle_marker.pin_argv(["python", "keeper.py", pin, "-m", "worker"]) == pin
    assert oracle_marker.pin_argv([pin.encode()]) == pin
    assert oracle_marker.pin_argv(["python", "double_engine.py"]) is None
