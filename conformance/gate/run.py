"""Running the gate: its engines, its units of work (all of them, or one shard's share), the
verdicts, and the reports.

`parity gate` runs every unit and judges; `parity gate --shard I/N` runs its share and writes
a results folder; `parity merge` reads every shard's folder. Both ways end in `finish`, fed
the same unit traces in the same plan order, so a merge gives the verdicts, exit status and
reports one unsharded run gives.
"""

from __future__ import annotations

import copy
import functools
import datetime as dt
import json
from dataclasses import replace
from pathlib import Path

from . import golden_store as golden_files
from ..drift import drift_rows, render_drift
from ..engine import resolve_engine
from .requirement_rows import apply_gate, where_of
from ..methods_table import render_methods_table
from ..pins import Pins
from ..progress import EngineProgress, Progress, duration
from .ci import check_summary_target, ci_summaries
from .render_text import render_gate, render_requirement_rows
from .report_files import claimed, write_reports
from .view import gate_view
from ..runner import run_units, side_by_side
from .shards import COLD_START, GROUPS, ShardError, Unit, assign, digest, goldens_digest, load_results, plan, share_cost, tool_identity, write_results
from .engines import GateEngine, _labels, _refused
from .judging import judge_against, judge_layers, served_layers
from .verdict import CANDIDATE, ORACLE, PASS, Verdict

def scenario_info(scenarios) -> list[dict]:
    """What the verdicts and reports need of each scenario, kept in the manifest."""
    return [{"name": s.name, "sha256": s.sha256, "rows": list(s.rows), "layers": s.layers,
             "method_matrix": s.method_matrix is not None} for s in scenarios]


def identity(pins: Pins, scenarios, engines: list[GateEngine], layers, units: list[Unit],
             count: int, require_layers=None) -> dict:
    """What every shard of one gate run shares (shards.IDENTITY)."""
    from ..envs import device_mode

    info = scenario_info(scenarios)
    return {
        "tool": tool_identity(), "oracle": pins.oracle, "pins": list(pins.releases),
        "scenario_set": digest(info), "scenarios": info,
        "goldens": goldens_digest([s.name for s in scenarios], pins.releases),
        "engines": [e.to_json() for e in engines], "layers": layers, "require_layers": require_layers,
        "plan": digest([[u.key, list(u.layers)] for u in units]), "planned": len(units),
        "device": device_mode(), "count": count,
    }


def run_share(engines: list[GateEngine], scenarios, units: list[Unit], pins: Pins, log,
              parallel: int = 1) -> dict[str, dict]:
    """Run `units` (in plan order), one warm worker per engine, up to `parallel` engines side by
    side (runner.side_by_side); unit key -> its trace."""
    by_name = {s.name: s for s in scenarios}
    traces: dict[str, dict] = {}
    with Progress(share_cost(units), log) as progress:
        def run_engine(number: int, engine: GateEngine, mine: list[Unit]):
            progress.say(f"[gate] engine {number}/{len(engines)}: {engine.key} ({engine.role}), "
                         f"{len(mine)} unit{'s' if len(mine) != 1 else ''}")
            # named by its key while it runs (a command line can be long); the report names it
            # by its NAME or its hello
            spec = replace(resolve_engine(engine.engine, pins, log), label=engine.key)
            # a candidate is asked only for the layers its hello declares (judge_layers)
            return run_units(spec, [(by_name[u.scenario], list(u.layers)) for u in mine], log,
                             repeat=2 if engine.role == ORACLE else 1,
                             declared_only=engine.role == CANDIDATE,
                             progress=EngineProgress(progress, "gate", engine.key,
                                                     [(u.scenario, u.layers, u.cost) for u in mine], COLD_START))

        shares = [(number, engine, [u for u in units if u.engine == engine.key])
                  for number, engine in enumerate(engines, 1)]
        shares = [share for share in shares if share[2]]
        runs = side_by_side([functools.partial(run_engine, *share) for share in shares], parallel)
        for (_, _, mine), run in zip(shares, runs):
            traces.update((u.key, t) for u, t in zip(mine, run.traces))
        log(f"[gate] cold starts: {sum(run.cold_starts for run in runs)} for {len(shares)} engines "
            f"({min(parallel, max(len(shares), 1))} side by side); {len(units)} units in "
            f"{duration(progress.elapsed())}")
    return traces


def gate(pins: Pins, scenarios, engines: list[GateEngine], layers, waivers, reports: Path | None,
         shard: tuple[int, int] | None, results: Path | None, log, out=print, parallel: int = 1,
         require_layers: list[str] | None = None, drift: bool = False) -> int:
    """`layers`: the layers asked (None: every layer of each scenario); `require_layers`: the
    layers a candidate must serve to pass (None: the layers asked); `drift`: print the drift
    across pins and the per-pin tables even when a candidate is configured."""
    if shard and reports:
        log("[gate] --reports is for the whole gate: pass it to `parity merge`; this shard writes "
            "its results folder only")
        reports = None
    if not shard:
        check_summary_target()
    with claimed(reports):  # checked before any engine runs, held until the reports are written
        return _gate(pins, scenarios, engines, layers, waivers, reports, shard, results, log, out, parallel,
                     require_layers, drift)


def _gate(pins: Pins, scenarios, engines: list[GateEngine], layers, waivers, reports: Path | None,
          shard: tuple[int, int] | None, results: Path | None, log, out, parallel: int,
          require_layers: list[str] | None, drift: bool) -> int:
    units = plan([(e.key, 2 if e.role == ORACLE else 1) for e in engines], scenarios, layers,
                 _refused(engines, pins))
    index, count = shard or (1, 1)
    if count > max(len(units), 1):  # a share would be empty, and balancing them takes count x units^2
        raise ShardError(f"--shard {index}/{count}: this gate has {len(units)} units of work, so at most "
                         f"{len(units)} shards; use N <= {len(units)}")
    share = assign(units, count)[index - 1] if shard else units
    if shard:
        log(f"[gate] shard {index}/{count}: {len(share)} of {len(units)} units, estimated "
            f"{duration(share_cost(share))} (engines: {', '.join(sorted({u.engine for u in share})) or 'none'})")
    traces = run_share(engines, scenarios, share, pins, log, parallel)
    manifest = identity(pins, scenarios, engines, layers, units, count, require_layers)
    summaries = [_unit_summary(u, traces[u.key], pins) for u in share] if shard or results else []
    if results is not None:
        manifest.update(index=index, created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        write_results(results, manifest, [(u, traces[u.key], s) for u, s in zip(share, summaries)])
        log(f"[gate] results of shard {index}/{count} written to {results}")
    if shard:
        return _shard_report(index, count, share, summaries, results, out)
    return finish(pins, manifest, units, traces, waivers, reports, log, out, drift)


def merge(folders: list[Path], pins: Pins, waivers, reports: Path | None, log, out=print,
          drift: bool = False) -> int:
    check_summary_target()
    with claimed(reports):
        return _merge(folders, pins, waivers, reports, log, out, drift)


def _merge(folders: list[Path], pins: Pins, waivers, reports: Path | None, log, out, drift: bool) -> int:
    manifest, traces = load_results(folders)
    here = {"tool": tool_identity(), "oracle": pins.oracle, "pins": list(pins.releases),
            "goldens": goldens_digest([s["name"] for s in manifest["scenarios"]], pins.releases)}
    for key, value in here.items():
        if manifest[key] != value:
            raise ValueError(f"the shards were made with another {key} than this checkout's "
                             f"({json.dumps(manifest[key])} vs {json.dumps(value)}): merge them "
                             "in a checkout of the commit that made them")
    if digest(manifest["scenarios"]) != manifest["scenario_set"]:
        raise ValueError("the shards' manifests list other scenarios than their scenario set's digest")
    try:
        engines = [GateEngine(**e) for e in manifest["engines"]]
    except TypeError as exc:
        raise ValueError(f"the shards' manifests list engines in another form: {exc}") from None
    units = plan_from_manifest(engines, manifest)
    log(f"[merge] {len(folders)} shard{'s' if len(folders) != 1 else ''}, {len(units)} units")
    return finish(pins, manifest, units, traces, waivers, reports, log, out, drift)


def plan_from_manifest(engines: list[GateEngine], manifest: dict) -> list[Unit]:
    """The units in plan order, rebuilt from what the shards ran and checked against the
    digest of the plan every shard computed."""
    order_e = {e.key: i for i, e in enumerate(engines)}
    order_s = {s["name"]: i for i, s in enumerate(manifest["scenarios"])}
    order_g = {g: i for i, g in enumerate(GROUPS)}
    try:
        units = sorted((Unit(e["engine"], e["scenario"], e["group"], tuple(e["layers"]), 0.0)
                        for e in manifest["units"]),
                       key=lambda u: (order_e[u.engine], order_s[u.scenario], order_g[u.group]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the shards' manifests name a unit outside their plan ({exc})") from None
    if digest([[u.key, list(u.layers)] for u in units]) != manifest["plan"]:
        raise ValueError("the shards' units do not make up the plan their manifests name")
    return units


def finish(pins: Pins, manifest: dict, units: list[Unit], traces: dict[str, dict], waivers,
           reports: Path | None, log, out=print, drift: bool = False) -> int:
    """Judge the assembled traces, print the report, write the reports; the exit status.
    With a candidate configured, its verdicts come first, and the drift across pins and the
    per-pin tables (for whoever bumps the oracle pin) only with `drift`."""
    engines = [GateEngine(**e) for e in manifest["engines"]]
    candidates = any(e.role == CANDIDATE for e in engines)
    scenarios = manifest["scenarios"]
    names = [s["name"] for s in scenarios]
    verdicts: list[Verdict] = []
    judged: dict = {}
    served = served_layers(engines, units, traces)
    # a porter reads its own verdicts first: the candidates' columns before the oracle's
    for engine, trace in sorted(assemble(engines, names, units, traces), key=lambda p: p[0].role != CANDIDATE):
        own = next(s for s in scenarios if s["name"] == trace["scenario"]["name"])
        verdict, golden = judge_layers(trace, engine, own, units, manifest, pins, served[engine.key])
        verdicts.append(verdict)
        judged[(verdict.engine, verdict.scenario)] = (trace, golden)
    result = apply_gate(verdicts, {s["name"]: tuple(s["rows"]) for s in scenarios}, waivers)
    commands = {label: e.command for e, label in _labels(engines, units, traces).items() if e.command}
    view = gate_view(result, pins.oracle, commands, judged)
    out(render_gate(view))
    out(render_requirement_rows(view))
    if drift or not candidates:
        out(render_drift(drift_rows(names, pins.releases)))
        if any(s["method_matrix"] for s in scenarios):
            out(render_methods_table(pins.releases))
    else:
        out("-- drift across pins and per-pin tables left out (the oracle pin's concern): --drift shows them")
    try:
        if reports:
            for path in write_reports(reports, view):
                log(f"[gate] wrote {path}")
        ci_summaries(view, reports, log)
    except OSError as exc:  # checked up front; a disk that fills meanwhile still ends here
        log(f"[gate] error: cannot write the reports: {exc}")
        log(f"[gate] exit status 2 (the reports are incomplete; the verdict above alone gives "
            f"{view.status})")
        return 2
    log(f"[gate] exit status {view.status} ({view.meaning})")
    return view.status


def _unit_summary(unit: Unit, trace: dict, pins: Pins) -> dict:
    """A unit's own verdict against the golden's same layers, for reading a shard alone."""
    path = golden_files.golden_path(unit.scenario, pins.oracle)
    served = [layer for layer in unit.layers if layer not in trace.get("not_served", [])]
    verdict, _ = judge_against(trace, path, ORACLE, layers=served)
    first = where_of(verdict) or next(iter(verdict.message.splitlines()), "")[:200]
    summary = {"engine": unit.engine, "scenario": unit.scenario, "layers": list(unit.layers),
               "kind": verdict.kind, "first": first}
    if len(served) < len(unit.layers):  # judged by `parity merge` against --require-layers
        summary["not_served"] = [layer for layer in unit.layers if layer not in served]
        if not served:
            summary.update(kind="not served", first="its hello does not declare these layers")
    return summary


def _shard_report(index: int, count: int, share: list[Unit], summaries: list[dict],
                  results: Path | None, out) -> int:
    """A shard prints what it ran; the gate's verdict comes from `parity merge`."""
    from collections import Counter

    kinds = Counter(s["kind"] for s in summaries)
    out(f"-- shard {index}/{count}: {len(share)} units: "
        + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"))
    for unit, s in zip(share, summaries):
        if s["kind"] != PASS:
            out(f"   {unit.key}: {s['kind']} {s['first'] or ''}".rstrip())
    out(f"-- the gate's verdict and reports come from `parity merge` over every shard's results"
        + (f" ({results})" if results else ""))
    return 0


def assemble(engines: list[GateEngine], names: list[str], units: list[Unit],
             traces: dict[str, dict]) -> list[tuple[GateEngine, dict]]:
    """One trace per engine and scenario, its units' layers together, labelled for the report."""
    labels = _labels(engines, units, traces)
    out = []
    for engine in engines:
        for name in names:
            parts = [traces[u.key] for u in units if u.engine == engine.key and u.scenario == name]
            if not parts:
                continue
            base = next((p for p in parts if p["engine"].get("name")), parts[0])
            trace = {k: copy.deepcopy(v) for k, v in base.items()
                     if k not in ("layers", "failure", "not_served", "capabilities")}
            trace["layers"] = {}
            for part in parts:
                trace["layers"].update(part["layers"])
                if "failure" in part and "failure" not in trace:
                    trace["failure"] = part["failure"]
                if part.get("not_served"):
                    trace.setdefault("not_served", []).extend(part["not_served"])
                if "capabilities" in part:
                    trace["capabilities"] = part["capabilities"]
            trace["engine"]["label"] = labels[engine]
            out.append((engine, trace))
    return out


__all__ = ["gate", "merge"]
