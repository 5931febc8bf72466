"""`parity gate`: every configured engine on the scenarios, judged against the oracle."""

from __future__ import annotations

from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.features import parse_required
from conformance.formats.log import log
from conformance.formats.pins import REPO_ROOT, load_pins
from conformance.formats.settings import device_mode
from conformance.gate.context import RunContext
from conformance.gate.execute import default_parallel
from conformance.gate.options import MAX_JOBS, parse_layers, plan_options, read_waivers, whole_number
from conformance.gate.plan import plan_inputs
from conformance.gate.run import gate as run_gate
from conformance.judging.judging import gate_configuration_features


def register(sub) -> None:
    p = sub.add_parser("gate", help="run every configured engine on the scenarios, judge against the oracle")
    plan_options(p)
    p.add_argument("--require-layers", help="comma-separated layers a candidate must serve to pass "
                   "(default: the layers asked); a required layer it does not serve fails the gate")
    p.add_argument("--require-features", help="comma-separated features a candidate must declare to pass, "
                   "`all`, or `none` (default: those the gate configuration's own scenarios, "
                   "dflash_27b_gate*, need): a scenario needing a feature its hello does not declare "
                   "is `unsupported` and not run, failing the gate only when the feature is required")
    p.add_argument("--drift", action="store_true", help="with a candidate, also print the drift across "
                   "pins and the per-pin tables (always printed without a candidate)")
    p.add_argument("--waivers", type=Path, help="waived divergences (default: waivers.toml, "
                   "which may be absent; any other path must exist)")
    p.add_argument("--reports", type=Path, help="write junit.xml, summary.md, report.html and annotation.md here")
    p.add_argument("--shard", metavar="I/N", help="run only shard I of N of the work (a CI matrix); "
                   "its verdicts and traces go to --results, the gate's verdict comes from `parity merge`")
    p.add_argument("--results", type=Path, help="write this run's traces, verdicts and manifest here "
                   "(default with --shard: out/results/shard-I-of-N)")
    p.add_argument("--jobs", type=whole_number(1, MAX_JOBS, "engines side by side"),
                   help="engines run side by side (default: the CPU count on CPU, 1 on a GPU runner)")
    p.set_defaults(handler=gate)


def gate(args) -> int:
    pins = load_pins()
    waivers = read_waivers(args.waivers)  # a missing or malformed waivers file stops the gate before any run
    required = parse_layers(args.require_layers, "--require-layers")
    # by default, the features of the gate configuration's own scenarios (--require-features none opts out)
    features = (parse_required(args.require_features) if args.require_features is not None
                else gate_configuration_features(pins.oracle))
    shard, scenarios, layers, engines = plan_inputs(args, pins, log)
    if required and layers and set(required) - set(layers):
        raise InputError(f"--require-layers {','.join(required)}: "
                         f"{', '.join(sorted(set(required) - set(layers)))} not among --layers {','.join(layers)}")
    results = args.results
    if shard and results is None:
        results = REPO_ROOT / "out" / "results" / f"shard-{shard[0]}-of-{shard[1]}"
    context = RunContext(pins, log, waivers=waivers, reports=args.reports, results=results, shard=shard,
                         parallel=args.jobs or default_parallel(device_mode()), layers=layers,
                         require_layers=required, require_features=features, drift=args.drift)
    return run_gate(context, scenarios, engines)
