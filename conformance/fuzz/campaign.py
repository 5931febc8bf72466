"""One `parity fuzz` run (fuzz/command.py parses its options): engines, the search, the findings
written as scenario files and confirmed, and `--replay FILE`.

A finding is written to --out as a scenario file of the project's schema, named by what
diverged (fuzz_steps_requests_tokens.json), its model paths relative to that folder. It is then
loaded back like any scenario, run on both engines again and its signature confirmed; its report
is the one the gate prints for that verdict (conformance/report/render_text.py render_verdict).
To add it to the library: move it into scenarios/ (written there directly with --out scenarios)
and write its goldens with `make goldens SCENARIOS=NAME`.

A finding is never lost: --out is checked before any engine starts; a file that cannot be
written after all is printed on standard output instead; and Ctrl-C while a finding is being
shrunk or confirmed writes the smallest failing example found so far, named `..._unconfirmed`
and marked as such, says where, then exits 130.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import tempfile
from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.errors import InputError
from conformance.formats.files import write_text_atomic
from conformance.formats.pins import REPO_ROOT, load_pins
from conformance.formats.scenario import load_scenario
from conformance.formats.trace import Trace
from conformance.fuzz.search import (ENGINE_LAYERS, SCENARIO_DIR, STAND_IN_LAYERS, Finding, FuzzError, Pair,
                                     Search, count_of, signature)
from conformance.fuzz.reduce import shape
from conformance.judging.verdict import exit_status
from conformance.process.client import EngineFailure
from conformance.process.launch import Launcher
from conformance.process.progress import duration
from conformance.report.render_text import render_verdict

DEFAULT_OUT = REPO_ROOT / "out" / "fuzz"
DEFAULT_BUDGET = 600.0  # seconds, without --budget or --examples
# Without --layers: the stand-in layers the candidate serves, config left out. A scheduler-only
# candidate whose config record differs in what it cannot help (a log line's wording) would
# otherwise be found on config.* at once, and the run end without ever exploring steps and
# outputs; a refused configuration is still judged, as the first record of both.
DEFAULT_LAYERS = ("steps", "outputs")


def fuzz_command(args, log, out=print) -> int:
    pins = load_pins()
    against = args.against or pins.oracle
    oracle_ref = _oracle_ref(against, pins)
    layers = parse_layers(args.layers)
    budget = _budget(args)
    folder = args.out or DEFAULT_OUT
    if not args.replay:
        check_out(folder)  # before any engine starts: nothing is searched for a folder that refuses it
    candidate_ref = EngineRef.parse(args.candidate, pins)
    # a catalog mutant (TEST DEVICE) is found in `parity adequacy`'s catalogs and forked by the
    # mutant server, which the launcher ends
    launcher = Launcher(pins, log, find_mutant=lambda release, mutant_id: catalog_mutant(release, mutant_id, log))
    branches = None
    try:
        oracle = launcher.spec(oracle_ref)
        if getattr(args, "guide", "behaviours") == "coverage":
            oracle, branches = guided_oracle(oracle, log)
        candidate = launcher.spec(candidate_ref)
    except BaseException:
        launcher.close()
        if branches is not None:
            branches.path.unlink(missing_ok=True)
        raise
    pair = Pair(oracle, candidate, layers)
    try:
        log(f"[fuzz] starting {oracle.label} (oracle) and {candidate.label} (candidate)")
        pair.start()
        if args.replay:
            return replay(pair, args.replay, oracle_ref.release, out)
        search, seed = _search(pair, args, layers, candidate.label, budget, branches, log)
        try:
            findings = search.run()
            unwritten = deliver(pair, findings, folder, seed, args.candidate, against, oracle_ref.release,
                                log, out)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: what was found is kept, then the command ends
            keep_unfinished(search.findings, folder, seed, args.candidate, against, log, out)
            raise
    except EngineFailure as failure:  # an engine that could not even start
        log(f"parity fuzz: {failure}")
        return 2
    finally:
        pair.close()
        launcher.close()
        if branches is not None:
            branches.path.unlink(missing_ok=True)
    out(_summary(search, seed, branches, findings))
    if unwritten or any(not f.confirmed for f in findings):
        return 2
    return 1 if findings else 0


def _oracle_ref(against: str, pins) -> EngineRef:
    """--against: a pinned release, the only engine that is an oracle."""
    try:
        oracle_ref = EngineRef.parse(against, pins)
    except ValueError:
        oracle_ref = None
    if oracle_ref is None or not oracle_ref.is_pin:
        raise InputError(f"--against: {against!r} is not a pinned release "
                         f"({', '.join(pins.releases)}); only a pin is an oracle")
    return oracle_ref


def _budget(args) -> float | None:
    """The search's time budget in seconds (gate/options.py budget_seconds): --budget, or
    DEFAULT_BUDGET when neither it nor --examples is given; None with --examples."""
    if args.budget is not None and args.examples is not None:
        raise InputError("--budget and --examples: give one of them")
    if args.budget is None and args.examples is None and not args.replay:
        return DEFAULT_BUDGET
    return args.budget


def _search(pair: Pair, args, layers: list[str], label: str, budget: float | None, branches,
            log) -> tuple[Search, int]:
    """The search on the started pair, its layers narrowed to those the candidate serves when
    --layers is not given, and its seed (--seed, else random): said before it runs."""
    if args.layers is None:
        pair.layers = layers = served_defaults(pair.candidate_layers(), label)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    log(f"[fuzz] seed {seed}; layers {', '.join(layers)}"
        + (" (config left out by default; --layers config,steps,outputs judges it too)"
           if args.layers is None else "") + "; "
        + (f"budget {duration(budget)}" if budget else f"{args.examples} examples"))
    features = pair.candidate_features()
    if features is not None:
        log(f"[fuzz] {label} declares the features {', '.join(sorted(features)) or '(none)'}: "
            "only scenarios needing no other are generated")
    search = Search(pair, seed, log, budget=budget, examples=args.examples, findings=args.findings,
                    branches=branches, guide=branches is not None, features=features)
    return search, seed


def _summary(search: Search, seed: int, branches, findings: list[Finding]) -> str:
    """The run's last lines: its seed, examples, rate, shrinking, behaviours and findings."""
    s = search.stats
    elapsed = search.clock() - search.start
    return (f"-- parity fuzz: seed {seed}, {s.examples} examples in {duration(elapsed)} "
            f"({s.examples / max(elapsed, 1e-9):.1f}/s: {s.parts_text()}), {s.shrink_runs} shrink runs, "
            f"{len(s.behaviours)} scheduler behaviours"
            + (f", {len(branches.arcs)} branches of the scheduling code" if branches is not None else "")
            + f"; {len(findings)} finding"
            f"{'s' if len(findings) != 1 else ''}"
            + "".join(f"\n   {f.signature}: {f.path or 'NOT written (printed above)'} "
                      f"({'confirmed' if f.confirmed else 'NOT confirmed'})" for f in findings))


def check_out(folder: Path) -> None:
    """--out: a folder findings can be written to (made now if it is missing). Checked by
    writing there, before any engine starts, so a search never ends with nowhere to put it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) != str(folder) else ""
        raise InputError(f"--out {folder}: expected a folder findings can be written to; "
                         f"{where}{exc.strerror or exc}") from None


class NotWritten(FuzzError):
    """A finding's scenario file could not be written; `text` is what it would have held."""

    def __init__(self, path: Path, text: str, error: OSError):
        super().__init__(f"{path} could not be written: {error.strerror or error}")
        self.path, self.text = path, text


def deliver(pair: Pair, findings: list[Finding], folder: Path, seed: int, candidate: str, against: str,
            oracle: str, log, out=print) -> int:
    """Each finding written, confirmed and reported. One whose file cannot be written is
    printed whole on standard output instead, the scenario file it would have been. Returns
    how many were not written."""
    unwritten = 0
    for finding in findings:
        try:
            confirm(pair, finding, folder, seed, candidate, against, log)
        except NotWritten as exc:
            unwritten += 1
            log(f"parity fuzz: error: the finding {finding.signature!r}: {exc}; it follows on standard "
                f"output, the scenario file it would have been (save it as {exc.path.name})")
            out(exc.text)
            continue
        out(report(finding, oracle, seed, candidate, against))
    return unwritten


def keep_unfinished(findings: list[Finding], folder: Path, seed: int, candidate: str, against: str,
                    log, out=print) -> None:
    """On Ctrl-C: each finding not confirmed yet is written as it stands, the smallest failing
    example found so far, named `..._unconfirmed` and marked in its description as not fully
    shrunk (when shrinking was stopped) and not confirmed; the log says where."""
    for finding in findings:
        if finding.confirmed:
            continue
        state = "not confirmed" if finding.shrunk else "not fully shrunk, not confirmed"
        name = scenario_name(finding.signature, folder, suffix="_unconfirmed")
        description = (describe(finding, finding.raw, seed, candidate, against)
                       + f" Stopped by an interrupt: {state}.")
        try:
            path = write_scenario(finding.raw, name, folder, description)
        except NotWritten as exc:
            log(f"[fuzz] interrupted: the smallest failing example of {finding.signature!r} so far "
                f"({state}): {exc}; it follows on standard output")
            out(exc.text)
            continue
        if finding.path is not None and finding.path != path:
            finding.path.unlink(missing_ok=True)  # the file a confirmation had begun with
        finding.path = path
        log(f"[fuzz] interrupted: the smallest failing example of {finding.signature!r} found so far "
            f"({state}, {count_of(len(finding.raw['workload']['requests']), 'request')}) is in {path}")


def served_defaults(served: list[str] | None, label: str) -> list[str]:
    """DEFAULT_LAYERS among those the candidate's hello serves (None: it did not say)."""
    layers = [x for x in DEFAULT_LAYERS if served is None or x in served]
    if not layers:
        raise FuzzError(f"{label} serves neither of the default layers {list(DEFAULT_LAYERS)} "
                        f"(its hello's capabilities: {served}); choose the layers with --layers")
    return layers


def parse_layers(text: str | None) -> list[str]:
    """The layers fuzzed: some of the stand-in layers, or some of the engine layers (another
    space of scenarios: the tiny models, conformance/fuzz/strategies.engine_scenarios);
    without --layers, DEFAULT_LAYERS (narrowed to what the candidate serves once it started)."""
    layers = [x for x in (text or ",".join(DEFAULT_LAYERS)).split(",") if x]
    if layers and (set(layers) <= set(STAND_IN_LAYERS) or set(layers) <= set(ENGINE_LAYERS)):
        return layers
    raise InputError(f"--layers: the fuzzer runs some of the stand-in layers {list(STAND_IN_LAYERS)} "
                     f"or some of the engine layers {list(ENGINE_LAYERS)}, not both at once; got {layers}")


def guided_oracle(oracle, log):
    """The oracle's worker under coverage.py, and what reads the branches it reaches
    (engines/vllm/coverage_worker.py): the same release, measured."""
    import tempfile

    from conformance.process.coverage_run import BranchesReached, ensure_coverage, guided_worker
    from conformance.process.envs import ensure_env

    python = ensure_env(oracle.release, log=log)
    handle, name = tempfile.mkstemp(prefix="parity-fuzz-branches-", suffix=".jsonl")
    os.close(handle)
    branches = BranchesReached(Path(name))
    return guided_worker(oracle.release, python, ensure_coverage(python, log=log), branches.path), branches


def catalog_mutant(release: str, mutant_id: str, log):
    """TEST DEVICE: the mutant of '0.27.1+mutant:catalog:ID', found in `parity adequacy`'s
    catalogs (the scheduler's, the KV cache manager's and block pool's, then the engine path's)."""
    from conformance.adequacy.measure import CATALOGS, catalog
    from conformance.adequacy.scope import load_scope

    scope = load_scope()
    found = [m for name in CATALOGS for m in catalog(release, scope, log, name)[0] if m.id == mutant_id]
    if not found:  # the engine path's catalog, lines the engine scenarios never run included
        from conformance.adequacy.engine_path import ENGINE_SCOPE_FILE, engine_catalog

        run, _, not_run = engine_catalog(release, load_scope(ENGINE_SCOPE_FILE), {}, log)
        found = [m for m in run + not_run if m.id == mutant_id]
    if not found:
        raise InputError(f"--candidate {EngineRef.catalog_mutant(release, mutant_id).text!r}: no mutant "
                         f"{mutant_id!r} in the catalogs of vllm {release}")
    return found[0]


def confirm(pair: Pair, finding: Finding, folder: Path, seed: int, candidate: str, against: str,
            log) -> None:
    """Write the minimal example as a scenario file, load it back, run it again: confirmed when
    the verdict's signature is the finding's. Should the minimal one not repeat (a flaky
    candidate), the examples found before it are tried, newest first. None repeating, the last
    one tried is kept as `..._unconfirmed`, its description saying what the reruns gave.
    NotWritten when the file cannot be written."""
    name = scenario_name(finding.signature, folder)
    outcomes = []
    for raw in reversed(finding.failing[-3:] or [finding.raw]):
        path = write_scenario(raw, name, folder, describe(finding, raw, seed, candidate, against))
        scenario = load_scenario(path)
        verdict, oracle = pair.judge(scenario)
        finding.raw, finding.path, finding.verdict = raw, path, verdict
        got = signature(verdict, scenario, oracle) if verdict is not None else None
        if got == finding.signature:
            finding.confirmed = True
            log(f"[fuzz] confirmed {finding.signature!r} on {path}")
            return
        outcomes.append(rerun_outcome(verdict, got, oracle))
        log(f"[fuzz] {path} did not repeat {finding.signature!r}: {outcomes[-1]}")
    unconfirmed = scenario_name(finding.signature, folder, suffix="_unconfirmed")
    said = "; ".join(dict.fromkeys(outcomes))
    kept = write_scenario(finding.raw, unconfirmed, folder, describe(finding, finding.raw, seed, candidate, against,
                                                                     rerun=said))
    finding.path.unlink(missing_ok=True)  # a normal name is a confirmed finding's
    finding.path = kept
    log(f"[fuzz] {finding.signature!r} did not repeat on {count_of(len(outcomes), 'rerun')}: the last example "
        f"tried is kept, named as not confirmed, in {kept}")


def rerun_outcome(verdict, got: str | None, oracle: Trace | None) -> str:
    """What a confirming rerun gave, when not the finding: another failure, a pass, or no
    verdict because the oracle could not run the written scenario."""
    if verdict is None:
        failure = oracle.failure if oracle is not None else None
        kind, message = (failure.kind, failure.message) if failure is not None else ("no trace", "")
        return f"the oracle could not run it ({kind}: {message})"
    if got is None:
        return f"it passed on the rerun (verdict {verdict.kind})"
    return f"got {got}"


def replay(pair: Pair, path: Path, oracle: str, out=print) -> int:
    verdict, _ = pair.judge(load_scenario(path))
    if verdict is None:
        raise FuzzError(f"{path}: the oracle could not run this scenario, so there is nothing to compare")
    out(render_verdict(verdict, oracle))
    return exit_status([verdict])


def report(finding: Finding, oracle: str, seed: int, candidate: str, against: str) -> str:
    """The gate's report of the confirming verdict, then where the scenario is and what to do."""
    lines = [render_verdict(finding.verdict, oracle) if finding.verdict else
             f"== {finding.signature}: the oracle could not run the written scenario"]
    requests = len(finding.raw["workload"]["requests"])
    lines.append(f"   found after {count_of(finding.examples, 'example')} "
                 f"({count_of(finding.first_requests, 'request')}), shrunk in {finding.shrink_runs} runs "
                 f"({duration(finding.seconds)} from the start of the search) "
                 f"to {count_of(requests, 'request')}; "
                 f"{'confirmed' if finding.confirmed else 'NOT confirmed'} on a rerun")
    if finding.first_shape:
        lines.append(f"   shape:    {finding.part} part; found at {finding.first_shape}; "
                     f"shrunk to {shape(finding.raw)}")
    lines.append(f"   scenario: {finding.path}")
    lines.append(f"   replay:   parity fuzz --replay {shlex.quote(str(finding.path))} "
                 f"--candidate {shlex.quote(candidate)} --against {against}")
    if finding.confirmed:  # an unconfirmed one is no scenario for the library
        lines.append(f"   library:  move it into scenarios/, then make goldens SCENARIOS={finding.path.stem}")
    return "\n".join(lines)


def scenario_name(sig: str, folder: Path, suffix: str = "") -> str:
    """fuzz_steps_requests_tokens for `diverged steps.requests.*.tokens` (then `suffix`); a
    free name in `folder`."""
    words = re.sub(r"[^a-z0-9]+", "_", sig.lower().replace("diverged ", "")).strip("_")
    base = f"fuzz_{words}"[:58 - len(suffix)].rstrip("_") + suffix
    name, number = base, 2
    while (folder / f"{name}.json").exists():
        name, number = f"{base}_{number}", number + 1
    return name


def describe(finding: Finding, raw: dict, seed: int, candidate: str, against: str, rerun: str = "") -> str:
    """The written scenario's description; `rerun`: what the confirming reruns gave instead,
    for a finding that did not repeat."""
    n = len(raw["workload"]["requests"])
    shrunk = f"shrunk from {finding.first_requests} to {n} request{'s' if n != 1 else ''}"
    if rerun:
        return (f"Found by `parity fuzz --seed {seed}` against vLLM {against}: during the search the candidate "
                f"{candidate} gave `{finding.signature}` on this scenario ({shrunk}), but a rerun of this file "
                f"did not repeat it: {rerun}. Not confirmed.")
    return (f"Found by `parity fuzz --seed {seed}` against vLLM {against}: the candidate "
            f"{candidate} gave `{finding.signature}` on this scenario, {shrunk}.")


def write_scenario(raw: dict, name: str, folder: Path, description: str) -> Path:
    """The raw scenario as a file in `folder`, its model paths relative to that folder;
    NotWritten (with the file's text) when it cannot be written."""
    text = scenario_text(raw, name, folder, description)
    path = folder / f"{name}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)  # never half a scenario, even after kill -9
    except OSError as exc:
        raise NotWritten(path, text, exc) from None
    return path


def scenario_text(raw: dict, name: str, folder: Path, description: str) -> str:
    """What write_scenario writes."""
    scenario = json.loads(json.dumps(raw))
    scenario["name"], scenario["description"] = name, description
    args = scenario["engine_args"]
    for obj in (args, args.get("speculative_config") or {}):
        if "model" in obj:
            obj["model"] = os.path.relpath(SCENARIO_DIR / obj["model"], folder.resolve())
    if "num_gpu_blocks_override" in args:
        scenario["rows"] = ["ENG-SCHED-CORE", "ENG-KV-CACHE"]
    return json.dumps(scenario, indent=2) + "\n"

