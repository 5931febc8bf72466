"""Aborts (engines/PROTOCOL.md, `steps`, driver step 2): applied one request id per
finish_requests() call, in workload order, so the block ids handed out after them do not depend
on the process's hash seed."""

import json
import os
import subprocess

import pytest

from conformance.formats.pins import load_pins
from conformance.formats.scenario import parse_scenario
from tests.helpers import REPO

PINS = load_pins()

# Two running requests aborted at the same step, then a request admitted into the blocks they
# freed: which of their blocks it gets depends on the order they were freed in.
TWO_AT_ONCE = {
    "schema": "vllm-parity/scenario/1", "name": "abort_two_at_once",
    "engine_args": {"model": "models/qwen3-27b", "load_format": "dummy", "max_num_seqs": 4,
                    "max_num_batched_tokens": 64, "max_model_len": 128, "block_size": 4,
                    "enable_chunked_prefill": True, "async_scheduling": False,
                    "num_gpu_blocks_override": 12},
    "workload": {"seed": 7, "vocab_size": 1000, "max_steps": 50, "requests": [
        {"id": "a", "arrival_step": 0, "prompt_len": 5, "max_tokens": 10, "abort_step": 3},
        {"id": "b", "arrival_step": 0, "prompt_len": 5, "max_tokens": 10, "abort_step": 3},
        {"id": "c", "arrival_step": 3, "prompt_len": 6, "max_tokens": 2}]},
}

# Runs in the oracle's environment: the driver as it is, then with both ids in one call.
RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from engines.vllm import runtime
runtime.boot("cpu")
from engines.vllm import steps_layer
from vllm.v1.request import RequestStatus

wire = json.loads(sys.stdin.read())
driver = steps_layer.run_steps(wire)[0]
steps_layer.abort_requests = lambda scheduler, ids: (
    scheduler.finish_requests(list(ids), RequestStatus.FINISHED_ABORTED) if ids else [])
one_call = steps_layer.run_steps(wire)[0]
print(json.dumps({"driver": driver, "one_call": one_call}))
"""


def _admitted_blocks(steps: list[dict]) -> list[int]:
    return steps[3]["requests"]["c"]["block_ids"][0]


# A seed under which a set of the two ids iterates in each order (checked below): the order that
# one finish_requests call with both ids frees them in. Each run is a cold vLLM import (tens of
# CPU seconds), so two seeds, one per order, run side by side.
SEEDS = (0, 2)
SET_ORDER = "import json; print(json.dumps(list({'a', 'b'})))"


@pytest.mark.oracle
def test_aborts_at_one_step_free_blocks_in_workload_order_whatever_the_hash_seed():
    from conformance.process.envs import ensure_env

    python = ensure_env(PINS.oracle, log=lambda m: None, pins=PINS)
    orders = {seed: subprocess.run([str(python), "-c", SET_ORDER], capture_output=True, text=True, check=True,
                                   env=dict(os.environ, PYTHONHASHSEED=str(seed))).stdout for seed in SEEDS}
    assert len(set(orders.values())) == len(SEEDS), orders  # both orders of {'a', 'b'} are run
    wire = json.dumps(parse_scenario(TWO_AT_ONCE, REPO / "scenarios" / "abort_two_at_once.json").to_wire())
    procs, runs = {}, {}
    for seed in SEEDS:
        env = dict(os.environ, PYTHONHASHSEED=str(seed))
        procs[seed] = subprocess.Popen([str(python), "-c", RUN, str(REPO)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    for seed, proc in procs.items():
        out, err = proc.communicate(wire, timeout=1800)  # a loaded machine's cold start
        assert proc.returncode == 0, err[-3000:]
        runs[seed] = json.loads(out.splitlines()[-1])
    driver = {seed: run["driver"] for seed, run in runs.items()}
    first, last = driver[SEEDS[0]], driver[SEEDS[-1]]
    assert last[3]["aborted"] == ["a", "b"] and last[3]["requests"]["c"]["cached_tokens"] == 0
    assert all(steps == first for steps in driver.values()), {s: _admitted_blocks(d) for s, d in driver.items()}
    # a's blocks go back first (workload order), so c gets b's freed block first: [4, 2]
    assert _admitted_blocks(first) == [4, 2]
    # given both ids in one call, vLLM frees them in a set's order: the hash seed decides
    assert len({json.dumps(run["one_call"]) for run in runs.values()}) > 1, \
        {s: _admitted_blocks(run["one_call"]) for s, run in runs.items()}
