"""(b) Driver overhead: the steps layer as served (recording scheduler + the worker's encode,
engines/vllm/lines.py, + the harness's decode, conformance/process/lines.py) vs a bare
schedule/update loop on the same scenario.

Served as the worker serves it: each step's record is written the moment its step completes and
none is kept (steps_layer.iter_steps, as engines/vllm/worker.py streams a run); the harness then
reads every line. Holding every record until the run ends, as run_steps does for tests, would
add the cyclic GC's walks over the held records, which no served run pays.

Run from the harness (`make bench`): it re-executes itself inside the oracle pin's environment.
Both loops are timed in CPU time of this process (the best of REPEATS, run alternately): the
ratio is the work the driver adds, and does not move when other processes share the machine's
cores.

--quick (`make bench BENCH_QUICK=1`, run by tests/house/test_doc_commands.py): one run of each loop,
no warm-up, to check that it runs; its figures mean nothing.
"""

import importlib.util
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.formats.scenario import load_scenario  # noqa: E402
from conformance.process import lines as harness_lines  # noqa: E402  (msgspec: in the pin's environment too)
from engines.vllm import lines as worker_lines, runtime  # noqa: E402

REPEATS = 9


def main(path: str, repeats: int = REPEATS) -> None:
    runtime.boot("cpu")
    from vllm.v1.core.sched.scheduler import Scheduler

    from engines.vllm.config_layer import resolve_config
    from engines.vllm.recorder import RecordingScheduler
    from engines.vllm.steps_layer import iter_steps, run_steps

    wire = load_scenario(path).to_wire()

    def bare() -> None:
        config = resolve_config(wire)[0]
        t0 = time.process_time()
        run_steps(wire, cls=Scheduler, config=config)
        return time.process_time() - t0

    def driven() -> None:
        config = resolve_config(wire)[0]
        t0 = time.process_time()
        sent = []  # the worker's lines, as the pipe holds them
        drive = iter_steps(wire, RecordingScheduler, config)
        while True:
            try:
                data = next(drive)
            except StopIteration as done:
                outputs = done.value
                break
            sent.append(worker_lines.encode({"type": "record", "id": "b", "layer": "steps", "seq": len(sent),
                                             "data": data}))
        for seq, data in enumerate(outputs, start=len(sent)):
            sent.append(worker_lines.encode({"type": "record", "id": "b", "layer": "outputs", "seq": seq,
                                             "data": data}))
        for line in sent:  # what the harness reads
            harness_lines.decode(line)
        return time.process_time() - t0

    if repeats > 1:
        bare(), driven()  # warm both paths
    b = d = float("inf")
    for _ in range(repeats):  # alternately, so that both loops see the same conditions
        b, d = min(b, bare()), min(d, driven())
    print(f"(b) {Path(path).stem}: bare schedule/update loop {b * 1000:.1f} ms, with the driver "
          f"{d * 1000:.1f} ms, overhead {100 * (d / b - 1):.0f}% (target <= 25%)")


if __name__ == "__main__":
    if importlib.util.find_spec("vllm") is None:  # the harness venv: move into the pin's
        from conformance.formats.pins import load_pins
        from conformance.process.envs import ensure_env

        python = str(ensure_env(load_pins().oracle))
        os.execv(python, [python, __file__, *sys.argv[1:]])
    paths = [a for a in sys.argv[1:] if a != "--quick"]
    main(paths[0], 1 if "--quick" in sys.argv[1:] else REPEATS)
