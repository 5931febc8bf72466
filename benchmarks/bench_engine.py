"""(d) The engine layers' cost per pin, from one run: cold start of the pin's worker, then each
engine scenario once in that warm worker (as `make parity` runs them; the oracle runs each
twice there), and the worker's peak memory. A pin with no CPU engine prints its reason.

--quick (`make bench BENCH_QUICK=1`, run by tests/house/test_doc_commands.py): the gate oracle on the
first engine scenario alone, to check that it runs; its figures mean nothing.
"""

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.formats.engine_ref import EngineRef  # noqa: E402
from conformance.formats.pins import load_pins  # noqa: E402
from conformance.formats.protocol import ENGINE_LAYERS  # noqa: E402
from conformance.formats.scenario import load_scenario  # noqa: E402
from conformance.process.launch import prepare_engine  # noqa: E402
from conformance.process.session import EngineSession, served  # noqa: E402


def peak_rss_gib(pid: int) -> float:
    """VmHWM of the worker: vLLM's engine core runs inside it (in process)."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / (1 << 20)
    return float("nan")


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    scenarios = [s for s in (load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json")))
                 if s.engine is not None][:1 if quick else None]
    pins = load_pins()
    for release in (pins.oracle,) if quick else pins.releases:
        session = EngineSession(prepare_engine(EngineRef.pin(release), log=lambda m: None))
        t0 = time.perf_counter()
        proc = session.start()
        cold = time.perf_counter() - t0
        if served(["engine_steps"], proc.hello)[1]:
            failure = session.trace(scenarios[0], ["engine_steps"]).failure
            session.close()
            print(f"(d) engine layer, vllm {release}: unsupported: {failure.message.split('unsupported: ', 1)[-1]}")
            continue
        times = {}
        for s in scenarios:
            t = time.perf_counter()
            session.trace(s, list(ENGINE_LAYERS))
            times[s.name] = time.perf_counter() - t
        rss = peak_rss_gib(proc.pid)  # the worker's own, not its keeper's
        session.close()
        slowest = max(times, key=times.get)
        print(f"(d) engine layer, vllm {release}: cold start {cold:.1f} s, {len(times)} engine scenarios "
              f"{sum(times.values()):.1f} s (slowest {slowest} {times[slowest]:.1f} s, median "
              f"{sorted(times.values())[len(times) // 2]:.1f} s), worker peak RSS {rss:.2f} GiB")


if __name__ == "__main__":
    main()
