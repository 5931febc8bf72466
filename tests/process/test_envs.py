"""conformance/process/envs.py: building the pins' environments side by side never flakes.

`parity envs` builds every pin's environment at once, one thread each. The first step of each
build runs uv, whose path uv's own `find_uv_bin()` looks up through `sysconfig`; on Python 3.11
the first use of sysconfig is not thread-safe (`get_config_vars()` publishes its dict before
filling it, so a second thread reads `EXE` as None). The test drives the real command up to that
first step, with sysconfig's caches emptied before each round as in a fresh process.
"""

from __future__ import annotations

import subprocess
import sysconfig
import time

from conformance import cli
from conformance.formats.pins import load_pins
from conformance.process import envs

ROUNDS = 50


class FirstStep(Exception):
    """Raised by the TEST DOUBLE of subprocess.run where a build runs its first step."""


def test_the_builds_first_steps_race_without_failing(tmp_path, monkeypatch, capsys):
    releases = list(load_pins().releases)
    assert len(releases) == 3
    monkeypatch.setenv("VLLM_PARITY_CACHE", str(tmp_path))  # nothing built: every build starts
    first_steps: list[list[str]] = []

    def run(argv, *args, **kwargs):  # TEST DOUBLE of subprocess.run inside process/envs.py
        if argv[1:4] == ["-m", "pip", "config"]:  # the find-links lookup: nothing configured
            return subprocess.CompletedProcess(argv, 0, stdout="", stderr="")
        if argv[1:4] == ["-m", "pip", "download"]:  # the fidelity wheel, fetched beside the build
            return subprocess.CompletedProcess(argv, 1, stdout="", stderr="TEST DOUBLE: no index")
        first_steps.append(list(argv))
        raise FirstStep(argv[0])

    monkeypatch.setattr(envs.subprocess, "run", run)
    # The race made certain: sysconfig's one-time initialisation takes 20 ms, as on a busy
    # machine, so a thread that reads it meanwhile sees it half filled (the code before the fix
    # failed in 50 rounds of 50 with the delay, in 25 of 50 without it).
    init = sysconfig._init_posix
    monkeypatch.setattr(sysconfig, "_init_posix", lambda found: (time.sleep(0.02), init(found))[1])
    monkeypatch.setattr(sysconfig, "_CONFIG_VARS", None)
    for number in range(ROUNDS):
        sysconfig._CONFIG_VARS = None  # as in a fresh process: sysconfig not yet initialised
        monkeypatch.setattr(envs, "_TOOLS", None, raising=False)  # resolved again in each round
        first_steps.clear()
        status = cli.main(["envs"])  # the first build's failure: not bad input, so its traceback
        raised = capsys.readouterr().err
        uv = [argv[0] for argv in first_steps]
        assert len(uv) == 3 and all(path.endswith("/uv") for path in uv), \
            f"round {number}: {len(uv)} of 3 builds reached their first step ({uv}); " \
            f"`parity envs` said {raised[-2000:]}"
        assert status == 3 and "FirstStep: " in raised, raised[-2000:]  # the double's, shown whole
        assert all(argv[1] == "venv" and argv[-1].endswith(".building") for argv in first_steps)
