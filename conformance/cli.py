"""`parity`: run engines on scenarios, compare with goldens, regenerate goldens, gate a release.

Exit status (every command): 0 success; 1 a divergence (or a golden that would change, in
--check); 2 a run that could not be compared (engine crash, hang, protocol violation, missing
or invalid golden), bad input (malformed scenario, unknown engine, a bad option or setting) or
an environment that cannot be built; 3 an internal error, a bug of the harness (its traceback
is shown); 130 stopped by Ctrl-C, 143 by SIGTERM (every engine ended, no verdict).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import threading
import traceback
from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.errors import InputError, ParityError
from conformance.formats.features import parse_required
from conformance.formats.files import (check_output_file, claim_folder, remove_dead_writers_temporaries,
                                       write_text_atomic)
from conformance.formats.log import log
from conformance.formats.pins import REPO_ROOT, load_pins
from conformance.formats.scenario import Scenario, at_scale, load_scenario
from conformance.formats.settings import device_mode
from conformance.formats.trace import dumps, load_trace
from conformance.gate.context import RunContext
from conformance.gate.engines import gate_engines
from conformance.gate.execute import default_parallel, golden_sinks
from conformance.gate.replay import oracle_windows
from conformance.gate.run import gate, merge
from conformance.judging.goldens import GOLDENS, lookup
from conformance.judging.judging import gate_configuration_features, judge_trace
from conformance.judging.verdict import CANDIDATE, exit_status
from conformance.judging.waivers import WaiverError, load_waivers
from conformance.process.envs import build_envs, env_cache_key, lock_gpu
from conformance.process.launch import prepare_engine
from conformance.process.progress import EngineProgress, Progress
from conformance.process.reaper import end_all, ended_words, resume
from conformance.process.session import EngineSession
from conformance.report.drift import drift_rows, render_drift
from conformance.report.methods_table import render_methods_table
from conformance.report.render_text import render

SCENARIO_DIR = REPO_ROOT / "scenarios"
DEFAULT_WAIVERS = REPO_ROOT / "waivers.toml"  # the one --waivers file that may be absent
# `parity selfcheck` runs each of these on the layers it has that the engine declares: the
# steps layer both with speculation (DFlash) and without
SELF_CHECK = ("dflash_27b_gate", "steady_decode", "kv_pressure_no_spec", "method_matrix", "engine_ngram")


# A named refusal (formats/errors.py ParityError: bad input, an environment or an engine that
# cannot be had, a golden write refused) exits with its status and its words, no traceback.
# Anything else escaping a command is a bug of the harness: its traceback, exit INTERNAL_ERROR
# (not 1, which says an engine diverged).
INTERNAL_ERROR = 3


# Bounds of the numbers a command takes (argparse types below): each outside them is refused
# before anything runs, with what was expected and what arrived.
MAX_JOBS = 64  # engines side by side: each is a process of about a GiB
MAX_EXAMPLES = 10_000_000
MAX_FINDINGS = 100
MAX_BUDGET = 7 * 24 * 3600.0  # a week, in seconds
UNITS = {"s": 1, "m": 60, "h": 3600}


def whole_number(low: int, high: int, what: str):
    """An argparse type: a whole number from `low` to `high` (`what` it counts, for the error)."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high} ({what}), got {text!r}")
        return value
    return parse


def budget_seconds(text: str) -> float:
    """An argparse type: a time budget like 90s, 10m, 1h or 45 (seconds), in seconds, more
    than none and at most MAX_BUDGET."""
    match = re.fullmatch(r"\s*(\d{1,9}(?:\.\d{1,6})?)\s*([smh]?)\s*", text)
    seconds = float(match[1]) * UNITS[match[2] or "s"] if match else 0.0
    if not 0 < seconds <= MAX_BUDGET:
        raise argparse.ArgumentTypeError(f"expected a duration more than 0 and at most {MAX_BUDGET / 3600:.0f}h, "
                                         f"like 90s, 10m or 1h, got {text!r}")
    return seconds


def plan_options(p: argparse.ArgumentParser) -> None:
    """The options the gate's plan is made of (plan_inputs), given alike to `parity gate` and to
    `parity envs`, so a CI shard's envs step selects the pins its gate step runs."""
    p.add_argument("--candidate", action="append", default=[],
                   help="a candidate engine (pin or command line); repeatable. Default: the other "
                        "pins, as informational stand-ins")
    p.add_argument("--stand-ins", choices=("goldens", "live"),
                   help="with no --candidate, the other pins stand in as informational candidates: read from "
                        "their committed goldens (no environment or process for them; the default with --scale "
                        "library), or run live (the default with --scale production or all)")
    p.add_argument("--scenario", action="append", type=Path, help="default: every scenarios/*.json of --scale")
    p.add_argument("--scale", choices=("library", "production", "all"), default="library",
                   help="which scenarios/*.json run by default: the library (default), the production-scale "
                        "scenarios (minutes of oracle time each, judged in the digest form), or all")
    p.add_argument("--layers", help="comma-separated layers to judge (default: every layer the scenario "
                   "has); a candidate is judged on those its hello declares, the reports say which were not")


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments; `main` runs the command named."""
    parser = argparse.ArgumentParser(prog="parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("envs", help="build (or reuse) the isolated environment of each pin")
    p.add_argument("--pin", action="append", help="only these releases (default: all pins)")
    p.add_argument("--lock-gpu", action="store_true",
                   help="write each pin's locked GPU requirements (engines/vllm/requirements-gpu-X.txt) "
                        "with uv from package metadata, and build nothing")
    p.add_argument("--key", action="store_true", help="print the cache key of the environments these "
                   "options select (one line, from each one's env key: a CI cache step's key), and build nothing")
    # the gate's plan options: with any of them, only the pins that plan's share runs are selected
    p.add_argument("--shard", metavar="I/N", help="only the pins shard I of N of the gate runs (with the "
                   "same --candidate, --scenario, --scale and --layers as its `parity gate --shard`)")
    plan_options(p)

    p = sub.add_parser("run", help="run one engine on one scenario and write its trace")
    p.add_argument("--engine", required=True, help="a pin (0.28.0, vllm==0.28.0) or an engine command line")
    p.add_argument("--scenario", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--layers", help="comma-separated layers (default: every layer the scenario has)")

    p = sub.add_parser("compare", help="compare a trace with a golden and explain the difference")
    p.add_argument("--trace", required=True, type=Path)
    p.add_argument("--golden", type=Path, help="default: the gate oracle's golden for the trace's scenario")
    p.add_argument("--replay", type=Path, metavar="SCENARIO",
                   help="a production-scale scenario's file: replay the gate oracle live up to the trace's "
                        "first difference from its golden, to show both sides' records there")

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

    p = sub.add_parser("merge", help="combine the results folders of every shard into the gate's verdict")
    p.add_argument("results", nargs="+", type=Path, metavar="RESULTS", help="one folder per shard")
    p.add_argument("--waivers", type=Path, help="waived divergences (default: waivers.toml, "
                   "which may be absent; any other path must exist)")
    p.add_argument("--reports", type=Path, help="write junit.xml, summary.md, report.html and annotation.md here")
    p.add_argument("--drift", action="store_true", help="also print the drift across pins and the per-pin tables")

    p = sub.add_parser("goldens", help="regenerate every pin's goldens from real oracle runs (make goldens)")
    p.add_argument("--check", action="store_true",
                   help="regenerate in memory; fail if any golden would change or has no scenario")
    p.add_argument("--engine", action="append", help="only these pins (a candidate is refused)")
    p.add_argument("--scenario", action="append", type=Path, help="default: every scenarios/*.json")
    p.add_argument("--layers", help="only the goldens of scenarios with any of these layers (comma-separated; "
                   "`engine`: the engine layers); a golden always holds every layer of its scenario")
    p.add_argument("--from-results", action="append", type=Path, metavar="DIR",
                   help="the oracle's traces from a gate's results folder (`parity gate --results DIR`; "
                   "repeat for every shard's) instead of running it again")
    p.add_argument("--scale", choices=("library", "production", "all"), default="all",
                   help="without --scenario, the goldens of which scenarios/*.json: the library, the "
                        "production-scale scenarios (minutes of oracle time each), or all (default)")

    p = sub.add_parser("bump", help="make a release the gate oracle: check its CPU rebuild and dependencies, "
                       "edit [tool.vllm-parity], lock its GPU set, build it, write its goldens and the "
                       "pull request's text (make bump PIN=X)")
    p.add_argument("release", help="the release to make the gate oracle, e.g. 0.28.0")
    p.add_argument("--pr-text", type=Path, help="where the pull request's text (markdown) is written "
                   "(default: out/bump/pull-request.md; it is also printed)")

    p = sub.add_parser("bisect", help="the port queue of an upstream range: the first-parent commits of "
                       "A..B that change a scenario's trace, found by building commit pins")
    p.add_argument("--from", dest="start", required=True, help="A: a commit (sha, vllm@sha12) or tag of the source")
    p.add_argument("--to", dest="end", required=True, help="B: a commit or tag of the source, after A")
    p.add_argument("--scenario", action="append", type=Path, help="default: every library scenario")
    p.add_argument("--rows", help="comma-separated engine-matrix rows: only the scenarios filed under them")
    p.add_argument("--layers", help="comma-separated layers (default: each scenario's stand-in layers)")
    p.add_argument("--source", help="the repository: a git URL, a local path or file:// (default: that of "
                   "the declared commit A or B names, else of the first declared commit)")
    p.add_argument("--base", help="the release each commit's CPU environment is laid over (default: as --source)")
    p.add_argument("--markdown", type=Path, help="also write the port queue in markdown here")

    p = sub.add_parser("comparable", help="may these two runs' throughput figures be compared?")
    p.add_argument("traces", nargs=2, type=Path, metavar="TRACE")

    p = sub.add_parser("drift", help="where each pin first departs from the previous, per scenario")
    p.add_argument("--scenario", action="append", type=Path, help="default: every scenarios/*.json")

    p = sub.add_parser("selfcheck", help="check that an engine speaks the protocol correctly, on "
                       "every layer its hello declares")
    p.add_argument("--engine", required=True)
    p.add_argument("--scenario", action="append", type=Path,
                   help="repeatable; each is run on the layers it has that the engine declares "
                   "(default: " + ", ".join(SELF_CHECK) + ")")

    p = sub.add_parser("docs", help="rewrite the docs' scenario tables (scenarios/README.md, docs/porting.md) "
                       "from scenarios/*.json")
    p.add_argument("--check", action="store_true", help="change nothing; fail if a table differs")

    p = sub.add_parser("adequacy", help="coverage of vLLM's scheduler by the scenarios, and the "
                       "mutants of the scheduler and the engine path the gate catches (make adequacy)")
    p.add_argument("--pin", action="append", help="coverage of these pins only (default: all pins)")
    p.add_argument("--sample", type=int, help="run a deterministic sample of this many of the scheduler's mutants")
    p.add_argument("--kv-sample", type=int, help="run a deterministic sample of this many of the KV cache "
                   "manager's and block pool's mutants (default: all)")
    p.add_argument("--seed", type=int, default=13, help="the sample's seed (default 13)")
    p.add_argument("--no-mutants", action="store_true", help="coverage only")
    p.add_argument("--no-coverage", action="store_true", help="mutants only")
    p.add_argument("--engine-layers", action="store_true",
                   help="measure coverage on the engine-layer scenarios too (about 100 s per pin)")
    p.add_argument("--no-engine-tier", action="store_true",
                   help="mutants run the stand-in scenarios only, not the engine-layer tier after them")
    p.add_argument("--engine-sample", type=int,
                   help="run a deterministic sample of this many engine-path mutants (default: all)")
    p.add_argument("--catalog", choices=("scheduler", "kv", "engine", "all", "traces"), default="all",
                   help="which mutant catalog to run: the scheduler's, the KV cache manager's and block "
                   "pool's, the engine path's (sampler, drafters, model runner, numerics), or all of these "
                   "(default); or traces: the oracle's own goldens mutated and served back as candidates, "
                   "every golden of every scale (the judge's adequacy; alone, no coverage pass, no vLLM)")
    p.add_argument("--trace-sample", type=int,
                   help="traces: a deterministic sample of this many mutants of each family per golden "
                   "(default: all)")
    p.add_argument("--trace-scenario", action="append",
                   help="traces: this scenario's goldens only (by name; repeatable; default: every scenario)")

    p = sub.add_parser("fuzz", help="search for a scenario on which a candidate differs from the "
                       "oracle, shrink it, write it as a scenario file (make fuzz)")
    p.add_argument("--candidate", required=True, help="the engine to fuzz: a command line, a pin, or "
                   "a pin's TEST DEVICE mutant (0.27.1+mutant:NAME)")
    p.add_argument("--against", help="the oracle pin (default: the gate oracle)")
    p.add_argument("--budget", type=budget_seconds, help="time to search, like 90s, 10m, 1h (default 10m)")
    p.add_argument("--examples", type=whole_number(1, MAX_EXAMPLES, "examples to run"),
                   help="examples to run, instead of a time budget")
    p.add_argument("--seed", type=int, help="the same seed gives the same examples (default: random, printed)")
    p.add_argument("--layers", help="comma-separated layers: stand-in ones (default: steps,outputs, those the "
                   "candidate serves; config,steps,outputs judges config too) or engine ones "
                   "(engine_steps,engine_outputs: the whole engine on the tiny models)")
    p.add_argument("--out", type=Path, help="where findings are written (default: out/fuzz)")
    p.add_argument("--findings", type=whole_number(1, MAX_FINDINGS, "findings"), default=1,
                   help="stop after this many distinct findings (default 1)")
    p.add_argument("--guide", choices=("behaviours", "coverage"), default="behaviours",
                   help="what the search prefers: examples where the oracle's scheduler does more "
                   "(default), or also those reaching branches of the scheduling code not reached "
                   "yet (runs the oracle under coverage.py; progress shows branches reached)")
    p.add_argument("--replay", type=Path, metavar="FILE", help="run one scenario file on both engines "
                   "and print the verdict, as the gate prints it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _printable_anywhere()
    with _stop_on_signals():  # also while the engines are ended below
        try:
            return COMMANDS[args.command](args)
        except ParityError as exc:
            log(f"parity {args.command}: error: {exc}")
            return exc.status
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Interrupted)
            strays = end_all()  # with what was ended while it unwound
            resume()
            signum = getattr(exc, "signum", signal.SIGINT)
            how = ("interrupted (Ctrl-C)" if signum == signal.SIGINT
                   else f"stopped by {signal.Signals(signum).name}")
            log(f"parity {args.command}: {how}: "
                f"{ended_words(strays, 'every engine process and its children')}; no verdict")
            return 128 + signum
        except Exception:  # noqa: BLE001 - not bad input: a bug of the harness, shown whole
            log(traceback.format_exc().rstrip())
            strays = end_all()
            resume()  # parity may be called again in this process (a test, a script)
            log(f"parity {args.command}: internal error (a bug of the harness, not of the engine or "
                f"the input; its traceback is above): "
                f"{ended_words(strays, 'every engine process and its children')}; exit status {INTERNAL_ERROR}")
            return INTERNAL_ERROR


def _printable_anywhere() -> None:
    """Under a locale whose encoding cannot hold a report's text (the C locale with Python's
    UTF-8 mode off is ASCII), characters it cannot encode are printed as escapes instead of
    ending the command. Files are UTF-8 whatever the locale (encoding= on every read and write)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a real text stream (pytest's capture has it too)
            stream.reconfigure(errors="backslashreplace")


class Interrupted(KeyboardInterrupt):
    """SIGTERM (a CI runner cancelling the job, `kill`), handled as Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals():
    """While a command runs, SIGINT and SIGTERM raise Interrupted in the main thread, which
    ends every engine (an engine runs in its own session: no terminal signal reaches it).
    After the first, further signals are noted and ignored: the cleanup runs to its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def later(signum, frame):
        log(f"parity: {signal.Signals(signum).name} again: still ending the engines")

    def first(signum, frame):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, later)
        raise Interrupted(signum)

    before = {sig: signal.signal(sig, first) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def cmd_envs(args) -> int:
    """Build the pins' environments side by side (envs.build_envs): every pin's, --pin's, or,
    given the gate's plan options, only those the plan's share runs; --key prints their cache key."""
    pins = load_pins()
    planned = (args.shard or args.candidate or args.scenario or args.layers or args.scale != "library"
               or args.stand_ins is not None)
    if planned and args.pin:
        raise InputError("--pin: give either --pin or the gate's plan options (--shard, --candidate, "
                         "--stand-ins, --scenario, --scale, --layers), not both")
    releases = _share_pins(args, pins) if planned else args.pin or list(pins.releases)
    if args.key:
        print(env_cache_key(releases, pins))
        return 0
    if planned:
        log(f"[envs] the plan's share runs {', '.join(releases) or 'no pin'}: building only "
            f"{'those' if releases else 'nothing'}")
    if args.lock_gpu:
        for release in releases:
            lock_gpu(release, pins, log)
        return 0
    build_envs(releases, pins, log)
    return 0


def _share_pins(args, pins) -> list[str]:
    """The pins this share of the gate's plan runs: the plan `parity gate` makes of the same
    options (plan_inputs), cut by the same function (plan.shard_plan)."""
    from conformance.gate.plan import pins_needed, shard_plan

    shard, scenarios, layers, engines = plan_inputs(args, pins, lambda m: None)
    manifest, share = shard_plan(RunContext(pins, log, shard=shard, layers=layers), scenarios, engines)
    return pins_needed(manifest, share, pins)


def default_stand_ins(scale: str) -> str:
    """The library's stand-ins are read from their goldens; a production scenario's golden holds
    digests, not the records a report shows at a first difference, so there they run live."""
    return "goldens" if scale == "library" else "live"


def plan_inputs(args, pins, log) -> tuple:
    """What the gate's plan is made of, read from the plan options (plan_options) alike by
    `parity gate` and `parity envs`: (shard, scenarios, layers, engines)."""
    from conformance.gate.shards import parse_shard

    shard = parse_shard(args.shard) if args.shard else None
    scenarios = _scenarios(args.scenario, args.scale)
    layers = _layers(args.layers)
    stand_ins = args.stand_ins or default_stand_ins(args.scale)
    return shard, scenarios, layers, gate_engines(pins, args.candidate, log, stand_ins)


def cmd_run(args) -> int:
    scenario = load_scenario(args.scenario)  # validated before any engine starts
    check_output_file(args.out, "--out")  # and where the trace goes
    pins = load_pins()
    spec = prepare_engine(EngineRef.parse(args.engine, pins), pins, log)
    layers = _layers(args.layers) or scenario.layers
    with Progress(2.0, log) as progress:  # a cold start and one scenario, said while they last
        with EngineSession(spec, progress=EngineProgress(progress, "run", spec.label,
                                                         [(scenario.name, layers, 1.0)], 1.0),
                           sinks=golden_sinks(pins.oracle)) as session:
            trace = session.trace(scenario, layers)
    remove_dead_writers_temporaries(args.out)  # what an earlier run killed while writing it left
    write_text_atomic(args.out, dumps(trace))
    if trace.failure is not None:
        log(f"parity run: {trace.failure.kind}: {trace.failure.message}\n"
            f"partial trace kept in {args.out}")
        return 2
    log(f"parity run: trace written to {args.out}")
    return 0


def cmd_compare(args) -> int:
    pins = load_pins()
    trace = load_trace(args.trace)
    if args.replay:
        scenario = load_scenario(args.replay)
        if scenario.name != trace.scenario_name:
            raise InputError(f"--replay {args.replay}: scenario {scenario.name!r}, the trace's is "
                             f"{trace.scenario_name!r}")
        trace = oracle_windows(trace, scenario, pins, log)
    golden = lookup(args.golden) if args.golden else GOLDENS.lookup(trace.scenario_name, pins.oracle)
    engine = trace.engine
    name = engine.get("name")
    if isinstance(name, str) and name and not trace.label.startswith(name):
        # a command's run is named by its hello, as the gate names it, not by its command line
        trace = trace.with_label(f"{name} {engine.get('version') or ''}".strip())
    verdict = judge_trace(trace, golden, CANDIDATE)
    print(render([verdict], pins.oracle))
    return exit_status([verdict])


def cmd_gate(args) -> int:
    pins = load_pins()
    waivers = _waivers(args.waivers)  # a missing or malformed waivers file stops the gate before any run
    required = _layers(args.require_layers, "--require-layers")
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
    return gate(context, scenarios, engines)


def cmd_merge(args) -> int:
    context = RunContext(load_pins(), log, waivers=_waivers(args.waivers), reports=args.reports,
                         drift=args.drift)
    return merge(context, args.results)


def cmd_goldens(args) -> int:
    from conformance.regenerate.command import goldens_command

    return goldens_command(args, _scenarios(args.scenario, args.scale), _scenarios(None), log)


def cmd_selfcheck(args) -> int:
    from conformance.process.selfcheck import selfcheck

    scenarios = [load_scenario(p) for p in args.scenario or [SCENARIO_DIR / f"{n}.json" for n in SELF_CHECK]]
    pins = load_pins()
    spec = prepare_engine(EngineRef.parse(args.engine, pins), pins, log)
    from conformance.judging.judging import scenario_features

    problems = selfcheck(spec, scenarios, log=log, needs=lambda s: scenario_features(s, pins.oracle))
    for problem in problems:
        print(f"FAIL {problem}")
    print("protocol self-check: " + ("passed" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


def cmd_bump(args) -> int:
    from conformance.bump.command import bump

    return bump(args.release, _scenarios(None), log, args.pr_text)


def cmd_bisect(args) -> int:
    from conformance.bisect.command import run_bisect

    args.layers = _layers(args.layers)
    return run_bisect(args, load_pins(), _scenarios(args.scenario, "library"), log)


def cmd_comparable(args) -> int:
    from conformance.judging.comparability import NotComparable, check_comparable

    a, b = (load_trace(p) for p in args.traces)
    try:
        check_comparable(a, b)
    except NotComparable as exc:
        print(f"NOT COMPARABLE: {exc}")
        return 1
    print(f"comparable: {a.label} and {b.label} ran {a.scenario_name} "
          "under equal per-step token budgets")
    return 0


def cmd_drift(args) -> int:
    pins = load_pins()
    print(render_drift(drift_rows([s.name for s in _scenarios(args.scenario, "library")], pins.releases)))
    print(render_methods_table(pins.releases))
    return 0


def cmd_docs(args) -> int:
    from conformance.report.readme_tables import FILES, render, stale

    scenarios = _scenarios(None)
    differ = 0
    for relative, names in FILES.items():
        path = REPO_ROOT / relative
        if args.check:
            for name in stale(path, scenarios, names):
                log(f"parity docs: {relative}'s {name} table differs from what generates it: run `parity docs`")
                differ = 1
            continue
        text = path.read_text(encoding="utf-8")
        new = render(text, scenarios, names, where=relative)
        if new != text:
            path.write_text(new, encoding="utf-8")
            log(f"parity docs: {relative}'s generated tables rewritten")
    return differ


def cmd_fuzz(args) -> int:
    from conformance.fuzz.command import DEFAULT_OUT, check_out, fuzz_command

    if args.replay:
        load_scenario(args.replay)  # a bad file is bad input before any engine starts
        return fuzz_command(args, log)
    folder = args.out or DEFAULT_OUT
    check_out(folder)  # a folder findings can be written to...
    with claim_folder(folder, "--out", "findings"):  # ...that no other search is writing to
        return fuzz_command(args, log)


def cmd_adequacy(args) -> int:
    from conformance.adequacy.command import adequacy

    if args.catalog == "traces":  # every golden: the production scenarios' digests too
        from conformance.adequacy.command import trace_adequacy

        return trace_adequacy(args, _scenarios(None, "all"), log)
    return adequacy(args, _scenarios(None, "library"), log)


COMMANDS = {"bisect": cmd_bisect, "bump": cmd_bump, "comparable": cmd_comparable, "drift": cmd_drift, "envs": cmd_envs, "run": cmd_run, "compare": cmd_compare, "gate": cmd_gate,
            "goldens": cmd_goldens, "selfcheck": cmd_selfcheck, "merge": cmd_merge,
            "adequacy": cmd_adequacy, "docs": cmd_docs, "fuzz": cmd_fuzz}


def _scenarios(paths: list[Path] | None, scale: str = "all") -> list[Scenario]:
    """The scenarios given, else every scenarios/*.json of `scale` (each file is read and
    checked whatever its scale)."""
    scenarios = [load_scenario(p) for p in paths or sorted(SCENARIO_DIR.glob("*.json"))]  # before any engine starts
    if not paths:
        scenarios = at_scale(scenarios, scale)
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise InputError(f"two scenario files share a name: {sorted(names)}")
    return scenarios


def _waivers(path: Path | None) -> list:
    """--waivers: the default file may be absent (no waivers); a path given that does not
    exist is an error, so a typo never silently waives nothing."""
    path = path or DEFAULT_WAIVERS
    if path == DEFAULT_WAIVERS and not path.exists():
        return []
    if not path.exists():
        raise WaiverError(f"--waivers {path}: no such file")
    return load_waivers(path)


def _layers(text: str | None, option: str = "--layers") -> list[str] | None:
    from conformance.formats.protocol import LAYERS

    if text is None:
        return None
    layers = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in layers if x not in LAYERS]
    if unknown or not layers:
        raise InputError(f"{option}: unknown layer(s) {unknown}; known: {list(LAYERS)}")
    return layers


if __name__ == "__main__":
    sys.exit(main())
