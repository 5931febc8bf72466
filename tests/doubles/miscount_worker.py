#!/usr/bin/env python3
"""TEST DOUBLE ENGINE: a port that counts the stand-in's verify steps differently. Not an oracle.

It is the pinned release's worker (engines/vllm/worker.py), its real scheduler and the
stand-in driver of engines/vllm/steps_layer.py, with one change in the driver: every step
that samples a request counts as one of its verify steps, also the step that ends its prefill
(the protocol counts only steps that verified drafts). Each request's drafts then come from
the next entry of its acceptance pattern, one verify step early: the scheduling decisions stay
equal for dozens of steps, the state recorded after each update does not.

Run it with a pin environment's python (the worker needs vLLM):
    <env>/bin/python tests/doubles/miscount_worker.py --release 0.27.1
It announces itself as engine "vllm+double:miscounted-verify-steps".
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from engines.vllm import steps_layer, worker  # noqa: E402

ENGINE = "vllm+double:miscounted-verify-steps"


def counts_every_sample(drafts: list[int]) -> bool:
    return True  # the port's rule: a step that samples is a verify step, drafts or not


if __name__ == "__main__":
    steps_layer.counts_as_verify_step = counts_every_sample
    print("TEST DOUBLE: vLLM's worker with the stand-in's verify steps miscounted; not a real engine",
          file=sys.stderr)
    status = worker.main(engine=ENGINE)  # never announced as the oracle's "vllm"
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # as the worker itself exits: no interpreter finalization with torch loaded
