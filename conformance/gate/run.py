"""A gate run put together, stage by stage: plan (gate/plan.py), run the share
(gate/execute.py), then either write a shard's results folder (gate/results.py) or judge every
trace and report (`finish`).

`parity gate` runs every unit and finishes; `parity gate --shard I/N` runs its share and writes
a results folder; `parity merge` reads every shard's folder and finishes. Both ways end in
`finish`, fed the same unit traces in the same plan order, so a merge gives the verdicts, exit
status and reports one unsharded run gives.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace
from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.files import claim_folder
from conformance.formats.trace import checked
from conformance.gate.context import RunContext
from conformance.gate.engines import report_labels
from conformance.gate.execute import run_share
from conformance.gate.plan import RunManifest, shard_plan
from conformance.gate.replay import with_oracle_windows
from conformance.gate.results import read_results, write_results
from conformance.gate.shards import Unit, share_cost
from conformance.judging.judging import gate_configuration_features, judge_layers, judge_unit, served_layers
from conformance.judging.requirement_rows import apply_gate, where_of
from conformance.judging.verdict import CANDIDATE, PASS, Verdict
from conformance.process.progress import duration
from conformance.report.ci import check_summary_target, ci_summaries
from conformance.report.drift import drift_rows
from conformance.report.methods_table import table_rows
from conformance.report.render_text import render_gate, render_pin_tables, render_requirement_rows
from conformance.report.report_files import claimed, write_reports
from conformance.report.view import gate_view, visible


def gate(context: RunContext, scenarios, engines: list[EngineRef]) -> int:
    """Run the gate, or with `context.shard` one shard of it; the exit status (a shard's is 0:
    the gate's verdict comes from `parity merge`)."""
    if context.shard and context.reports:
        context.log("[gate] --reports is for the whole gate: pass it to `parity merge`; this shard "
                    "writes its results folder only")
        context = replace(context, reports=None)
    if not context.shard:
        check_summary_target()
    # both folders checked and locked before any engine runs, held until written
    with claimed(context.reports), claim_folder(context.results, "--results", "results"):
        manifest, share = shard_plan(context, scenarios, engines)
        if context.shard:
            index, count = context.shard
            context.log(f"[gate] shard {index}/{count}: {len(share)} of {len(manifest.units)} units, "
                        f"estimated {duration(share_cost(share))} (engines: "
                        f"{', '.join(sorted({u.engine for u in share})) or 'none'})")
        traces = run_share(context, engines, scenarios, share,
                           {s["name"]: tuple(s["features"]) for s in manifest.scenarios})
        # a production run that differs: the oracle's records there, replayed live
        traces = with_oracle_windows(traces, scenarios, context.pins, context.log)
        if not context.shard:
            return finish(context, manifest, traces)
        roles = {e.key: e.role for e in engines}
        summaries = [_unit_summary(u, traces[u.key], _judge_unit(u, traces[u.key], roles[u.engine], context))
                     for u in share]
        if context.results is not None:
            _write_results(context, manifest, share, traces, summaries)
        return _shard_report(context, share, summaries)


def merge(context: RunContext, folders: list[Path]) -> int:
    """Every shard's results folder judged and reported as one gate run."""
    check_summary_target()
    with claimed(context.reports):
        manifest, traces = read_results(folders, context.pins)
        context.log(f"[merge] {len(folders)} shard{'s' if len(folders) != 1 else ''}, {len(manifest.units)} units")
        return finish(context, manifest, traces)


def finish(context: RunContext, manifest: RunManifest, traces: dict[str, dict]) -> int:
    """Judge the assembled traces, print the report, write the reports; the exit status.
    With a candidate configured, its verdicts come first, and the drift across pins and the
    per-pin tables (for whoever bumps the oracle pin) only with `drift`. A whole run given a
    results folder writes it too, each unit with its engine's verdict on its scenario."""
    pins, log, out, units = context.pins, context.log, context.out, manifest.units
    engines = manifest.engines
    candidates = any(e.role == CANDIDATE for e in engines)
    scenarios = manifest.scenarios
    names = [s["name"] for s in scenarios]
    verdicts: list[Verdict] = []
    judged: dict = {}
    by_engine: dict[tuple[str, str], Verdict] = {}  # (engine key, scenario) -> its verdict
    served = served_layers(engines, units, traces)
    # a porter reads its own verdicts first: the candidates' columns before the oracle's
    for engine, trace in sorted(assemble(engines, names, units, traces), key=lambda p: p[0].role != CANDIDATE):
        own = next(s for s in scenarios if s["name"] == trace["scenario"]["name"])
        trace = checked(trace)  # the reports read the records as judged: declared fields only
        verdict, golden = judge_layers(trace, engine, own, units, manifest, pins, served[engine.key])
        verdicts.append(verdict)
        judged[verdict.key] = (trace, golden)
        by_engine[(engine.key, verdict.scenario)] = verdict
    if context.results is not None:
        _write_results(context, manifest, units, traces, [
            _unit_summary(u, traces[u.key], by_engine[(u.engine, u.scenario)]) for u in units])
    result = apply_gate(verdicts, {s["name"]: tuple(s["rows"]) for s in scenarios}, context.waivers)
    commands = {label: e.command for e, label in report_labels(engines, units, traces).items() if e.command}
    drift = drift_rows(names, pins.releases) if context.drift or not candidates else None
    methods = ((pins.releases, *table_rows(pins.releases))
               if drift is not None and any(s["method_matrix"] for s in scenarios) else None)
    required = manifest.require_features
    view = gate_view(result, pins.oracle, commands, judged, {s["name"]: tuple(s["features"]) for s in scenarios},
                     required, drift, methods,
                     required_by_default=required is not None and required == gate_configuration_features(pins.oracle))
    out(render_gate(view))
    out(render_requirement_rows(view))
    out(render_pin_tables(view))
    try:
        if context.reports:
            for path in write_reports(context.reports, view):
                log(f"[gate] wrote {path}")
        ci_summaries(view, context.reports, log)
    except OSError as exc:  # checked up front; a disk that fills meanwhile still ends here
        log(f"[gate] error: cannot write the reports: {exc}")
        log(f"[gate] exit status 2 (the reports are incomplete; the verdict above alone gives "
            f"{view.status})")
        return 2
    log(f"[gate] exit status {view.status} ({view.meaning})")
    return view.status


def _write_results(context: RunContext, manifest: RunManifest, share: list[Unit], traces: dict[str, dict],
                   summaries: list[dict]) -> None:
    index, count = context.shard or (1, 1)
    write_results(context.results, manifest, index, [(u, traces[u.key], s) for u, s in zip(share, summaries)])
    context.log(f"[gate] results of shard {index}/{count} written to {context.results}")


def _judge_unit(unit: Unit, trace: dict, role: str, context: RunContext) -> Verdict:
    """A shard's unit judged alone, with its engine's role, against the golden's same layers."""
    served = [layer for layer in unit.layers if layer not in trace.get("not_served", [])]
    return judge_unit(trace, unit.scenario, context.pins.oracle, served, role)


def _unit_summary(unit: Unit, trace: dict, verdict: Verdict) -> dict:
    """A unit and its verdict, for reading a results folder (verdicts.json) and a shard's output."""
    first = where_of(verdict) or next(iter(verdict.message.splitlines()), "")[:200]
    summary = {"engine": unit.engine, "scenario": unit.scenario, "layers": list(unit.layers),
               "kind": verdict.kind, "first": first}
    served = [layer for layer in unit.layers if layer not in trace.get("not_served", [])]
    if len(served) < len(unit.layers):  # judged by `parity merge` against --require-layers
        summary["not_served"] = [layer for layer in unit.layers if layer not in served]
        if not served:
            summary.update(kind="not served", first="its hello does not declare these layers")
    return summary


def _shard_report(context: RunContext, share: list[Unit], summaries: list[dict]) -> int:
    """A shard prints what it ran; the gate's verdict comes from `parity merge`."""
    index, count = context.shard
    kinds = Counter(s["kind"] for s in summaries)
    context.out(f"-- shard {index}/{count}: {len(share)} units: "
                + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"))
    for unit, s in zip(share, summaries):
        if s["kind"] != PASS:
            context.out(visible(f"   {unit.key}: {s['kind']} {s['first'] or ''}".rstrip()))  # the engine's words, shown
    context.out(f"-- the gate's verdict and reports come from `parity merge` over every shard's results"
                + (f" ({context.results})" if context.results else ""))
    return 0


def assemble(engines: list[EngineRef], names: list[str], units: list[Unit],
             traces: dict[str, dict]) -> list[tuple[EngineRef, dict]]:
    """One trace per engine and scenario, its units' layers together, labelled for the report."""
    labels = report_labels(engines, units, traces)
    out = []
    for engine in engines:
        for name in names:
            parts = [traces[u.key] for u in units if u.engine == engine.key and u.scenario == name]
            if not parts:
                continue
            base = next((p for p in parts if p["engine"].get("name")), parts[0])
            trace = {k: copy.deepcopy(v) for k, v in base.items()
                     if k not in ("layers", "digests", "failure", "not_served", "capabilities", "features",
                                  "unsupported_features")}
            trace["layers"] = {}
            for part in parts:
                trace["layers"].update(part["layers"])
                if part.get("digests"):  # a production run's steps and outputs, digested as they came
                    trace.setdefault("digests", {}).update(part["digests"])
                if "failure" in part and "failure" not in trace:
                    trace["failure"] = part["failure"]
                if part.get("not_served"):
                    trace.setdefault("not_served", []).extend(part["not_served"])
                if "capabilities" in part:
                    trace["capabilities"] = part["capabilities"]
                if "features" in part:
                    trace["features"] = part["features"]
                if part.get("unsupported_features"):  # not run: every unit of the scenario alike
                    trace["unsupported_features"] = part["unsupported_features"]
            trace["engine"]["label"] = labels[engine]
            out.append((engine, trace))
    return out


__all__ = ["gate", "merge"]
