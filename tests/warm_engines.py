"""The warm-engine pool, a pytest plugin (conftest.py names it): one warm engine session per
pin (and per TEST DEVICE mutant a test asks for) for the whole pytest process, and a gate run in
a test's process lent those engines through the gate's session seam."""

from __future__ import annotations

import threading

import pytest

# Engines kept warm at once per pytest process: at least MAX_WARM, and one per pin, since the
# goldens suite runs every scenario on every pin in turn (fewer would cold-start an engine for
# nearly every test). A group's tests run one after another, so an engine ended to make room is
# rarely wanted again; each holds up to 1 GiB. On a GPU each also needs its share of GPU memory.
MAX_WARM = 3


def max_warm(device: str, processes: int, pins: int) -> int:
    """Warm engines per pytest process: MAX_WARM or the number of pins, whichever is more, and on
    a GPU no more than the processes' share of the engines its free memory holds
    (conformance/formats/gpu.py), at least one."""
    most = max(MAX_WARM, pins)
    if device != "gpu":
        return most
    from conformance.formats import gpu

    return max(1, min(most, gpu.engines_fitting(gpu.memory()[0]) // max(1, processes)))


@pytest.fixture(scope="session")
def pin_launcher():
    """The pytest process's Launcher (process/launch.py): it holds one mutant server per pin,
    from which warm_sessions and warm_gate fork TEST DEVICE mutants; closed at the end."""
    from conformance.formats.pins import load_pins
    from conformance.process.launch import Launcher

    launcher = Launcher(load_pins(), log=lambda m: None)
    yield launcher
    launcher.close()


@pytest.fixture(scope="session")
def warm_sessions(request, pin_launcher):
    """engine (a pin, or a pin's TEST DEVICE mutant "0.27.1+mutant:NAME") -> its started
    EngineSession (process/session.py), started once per session (per xdist process) and
    restarted by the session only when its engine is gone, closed at the end. A mutant is
    forked by its pin's mutant server on a CPU (engines/vllm/mutant_server.py: one import of
    vLLM per process, ~5 s, not one per mutant); a pin starts as `parity gate` starts it."""
    from concurrent.futures import ThreadPoolExecutor

    from conformance.formats.engine_ref import MUTANT, EngineRef
    from conformance.formats.pins import load_pins
    from conformance.formats.settings import device_mode
    from conformance.process.launch import EngineSpec
    from conformance.process.session import EngineSession

    sessions: dict[str, EngineSession] = {}  # least recently used first
    xdist = getattr(request.config, "workerinput", None)  # set in a pytest-xdist worker
    processes = xdist["workercount"] if xdist else 1
    pins = load_pins()
    device = device_mode()
    most = max_warm(device, processes, len(pins.releases))
    lock = threading.Lock()  # a gate run asks from its engines' threads (warm_gate)
    launcher = pin_launcher

    def get(engine: str) -> EngineSession:
        with lock:
            if engine not in sessions:
                ref = EngineRef.parse(engine, pins)
                # a mutant is forked from one import of its pin, no cold start of its own; not on
                # a GPU, where a child must not inherit a parent that may have touched CUDA
                if ref.kind is MUTANT and device != "gpu":
                    spec = EngineSpec(ref.label, launcher.forked_mutant(ref))
                else:
                    spec = launcher.spec(ref)
                session = EngineSession(spec)
                session.start()
                sessions[engine] = session
                while len(sessions) > most:  # each holds up to 1 GiB: end the longest unused
                    sessions.pop(next(iter(sessions))).close()
            sessions[engine] = sessions.pop(engine)
            return sessions[engine]

    yield get
    with ThreadPoolExecutor() as pool:  # each engine takes seconds to shut down: all at once
        list(pool.map(EngineSession.close, sessions.values()))


def forked_mutant(spec, launcher):
    """The spec of a pin's TEST DEVICE mutant (0.27.1+mutant:NAME) forked by the pin's mutant
    server, as warm_sessions forks its own: each start (a restart after it crashed too) without
    an import of vLLM of its own. None for any other engine, and on a GPU (a child must not
    inherit a parent that may have touched CUDA)."""
    from conformance.formats.engine_ref import MUTANT, EngineRef
    from conformance.formats.settings import device_mode
    from conformance.process.launch import EngineSpec

    if spec.release is not None or "+mutant:" not in spec.label or device_mode() == "gpu":
        return None
    ref = EngineRef.parse(spec.label.removeprefix("vllm-"), launcher.pins)
    if ref.kind is not MUTANT or launcher.spec(ref).argv != spec.argv:  # not the gate's own mutant
        return None
    return EngineSpec(spec.label, launcher.forked_mutant(ref))


@pytest.fixture
def warm_gate(warm_sessions, pin_launcher):
    """`parity gate` run in this test's process (cli.main, gate/run.py) with each pinned release
    it runs served by the warm session of that pin (warm_sessions): no cold start of its own.
    A pin's TEST DEVICE mutant is forked by the pin's mutant server (forked_mutant); other
    engines (command lines) start as the gate starts them. Lent through the gate's own seam
    (gate/context.py ENGINE_SESSIONS), not by patching the gate."""
    from conformance.gate.context import ENGINE_SESSIONS
    from conformance.process.session import EngineSession

    class Lent(EngineSession):
        """The gate's session of a pin over the warm session's engine: it starts (and restarts)
        that engine, and leaves it running when the gate closes it."""

        def __init__(self, warm: EngineSession, spec, **options):
            super().__init__(spec, **options)
            self.warm = warm

        @property
        def hello(self):
            return self.warm.hello

        def start(self, until=None):
            before = self.warm.cold_starts
            proc = self.warm.start(until)
            self.cold_starts += self.warm.cold_starts - before
            return proc

        def close(self) -> bool:
            with lock:
                lent.discard(id(self.warm))
            return False

    # the warm sessions lent now: a gate may run two sessions of one pin side by side
    # (execute.side_by_side_pieces), and one engine serves one of them at a time
    lent: set[int] = set()
    lock = threading.Lock()

    def session(spec, **options) -> EngineSession:
        if spec.release is None:  # not a pinned release itself
            with lock:  # one mutant server per pin, whichever of the gate's threads asks first
                forked = forked_mutant(spec, pin_launcher)
            return EngineSession(forked or spec, **options)
        warm = warm_sessions(spec.release)
        assert warm.spec.argv == spec.argv, (warm.spec, spec)  # the same worker, the same device
        with lock:
            if id(warm) in lent:  # its engine serves the other session: this one starts its own
                return EngineSession(spec, **options)
            lent.add(id(warm))
        return Lent(warm, spec, **options)

    token = ENGINE_SESSIONS.set(session)
    yield
    ENGINE_SESSIONS.reset(token)
