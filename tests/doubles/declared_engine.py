#!/usr/bin/env python3
"""TEST DOUBLE ENGINE that declares its features: a port with no speculative decoding and no
priority policy, as the issue's "done when" describes it. It is not an oracle and never writes
a golden.

It answers each run with the golden records of --replay RELEASE (default: the gate oracle) for
the run's scenario, so on every scenario it runs it agrees with the oracle. Its hello declares
every feature (conformance/formats/features.py) but speculative decoding (`spec:*`,
`parallel_drafting`) and priorities (`priority_policy`, `request_priorities`), or those given:

    --features a,b,c    declares exactly these (unknown names are sent as they are)
    --features ''       declares none
    --no-features       says nothing of features (a hello without the field: every feature)
    --serve LAYERS      the layers it declares and serves (default: every layer)
    --engine NAME       hello.engine (default: declared-double)

Asked to run a scenario that needs a feature it does not declare, it fails the run with an
`internal` error naming the feature: a harness that sends it such a run anyway gets an
`engine_error`, never the `unsupported` verdict the gate owes a declared-missing feature.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from conformance.formats import serve  # noqa: E402
from conformance.formats.features import FEATURES, SPEC, decided_by_config, needed  # noqa: E402

LACKS = ("parallel_drafting", "priority_policy", "request_priorities")
DEFAULT = [name for name in FEATURES if not name.startswith(SPEC) and name not in LACKS]
LAYERS = ["config", "steps", "outputs", "methods", "engine_config", "engine_steps", "engine_outputs"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replay", help="the pin whose goldens are replayed (default: the gate oracle)")
    parser.add_argument("--features", help="comma-separated features declared (default: all but "
                        "speculative decoding and priorities)")
    parser.add_argument("--no-features", action="store_true", help="no `features` in the hello")
    parser.add_argument("--serve", help="comma-separated layers declared and served (default: all)")
    parser.add_argument("--engine", default="declared-double")
    args = parser.parse_args()
    from conformance.formats.pins import load_pins
    from conformance.judging.goldens import GOLDENS

    release = args.replay or load_pins().oracle
    declared = DEFAULT if args.features is None else [x for x in args.features.split(",") if x]
    served = LAYERS if args.serve is None else args.serve.split(",")

    def run(scenario: dict, layers: list) -> serve.Answer:
        golden = GOLDENS.load(scenario["name"], release).layers
        # the features as the gate decides them: async scheduling left to vLLM's default is
        # what the oracle's config record resolved (its golden's)
        config = (golden.get("config") or [None])[0] if decided_by_config(scenario.get("engine_args")) else None
        needs = needed(scenario.get("engine_args"), scenario.get("workload"), scenario.get("method_matrix"), config)
        lacking = [name for name in needs if name not in declared]
        if not args.no_features and lacking:
            raise serve.RunError("internal", f"TEST DOUBLE declared-double was sent {scenario['name']}, which "
                                 f"needs {', '.join(lacking)}: features its hello does not declare")
        if any(layer not in served for layer in layers):
            raise serve.RunError("unsupported", f"only {served}, not {layers}")
        return [(layer, golden.get(layer, [])) for layer in layers]

    hello = {"engine": args.engine, "version": "0.0-test", "capabilities": served}
    if not args.no_features:
        hello["features"] = declared
    return serve.serve(hello, run)


if __name__ == "__main__":
    sys.exit(main())
