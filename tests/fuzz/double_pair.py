"""A TEST DOUBLE pair of engines for `parity fuzz`'s search: pure Python, milliseconds per example
(tests/fuzz/test_fuzz_search.py, test_fuzz_production.py)."""

from __future__ import annotations

import json

from conformance.formats.trace import make_trace
from conformance.judging.verdict import CANDIDATE, judge


class DoublePair:
    """TEST DOUBLE of conformance.fuzz.search.Pair: no engine runs. The "oracle" admits at most
    max_num_seqs requests at step 0; the "candidate" has a planted bug and admits every
    request arriving at step 0. Both traces are judged by the real verdict.judge."""

    layers = ["config", "steps"]

    def __init__(self, bug: bool = True):
        self.bug, self.seen = bug, []

    def candidate_features(self):
        return None  # its hello says nothing of features: every feature

    def candidate_layers(self):
        return None  # nor of the layers it serves

    def judge(self, scenario, timeout=None):
        self.seen.append(json.dumps(scenario.workload, sort_keys=True))
        args = scenario.engine_args
        at_zero = [r["id"] for r in scenario.workload["requests"] if r["arrival_step"] == 0]
        layers = {"config": [{"refused": None, "max_num_seqs": args["max_num_seqs"]}]}
        oracle = dict(layers, steps=[{"step": 0, "new": at_zero[:args["max_num_seqs"]]}])
        candidate = dict(layers, steps=[{"step": 0, "new": at_zero if self.bug else oracle["steps"][0]["new"]}])
        hello = {"engine": "double", "version": "0", "protocol": 1}
        golden = make_trace("oracle", hello, scenario, oracle)
        return judge(make_trace("double", hello, scenario, candidate), golden, CANDIDATE), golden
