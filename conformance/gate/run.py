"""A gate run put together, stage by stage: plan (gate/plan.py), run the share
(gate/execute.py), then either write a shard's results folder (gate/results.py) or judge every
trace and report (`finish`: `judge_all`, then `report`).

`parity gate` runs every unit and finishes; `parity gate --shard I/N` runs its share and writes
a results folder; `parity merge` reads every shard's folder and finishes. Both ways end in
`finish`, fed the same unit traces in the same plan order, so a merge gives the verdicts, exit
status and reports one unsharded run gives.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.files import claim_folder
from conformance.formats.trace import Trace, checked
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
        traces = with_oracle_windows(traces, scenarios, context.pins, context.log, sessions=context.sessions)
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


def finish(context: RunContext, manifest: RunManifest, traces: dict[str, Trace]) -> int:
    """Judge every unit's trace, then report; the exit status."""
    return report(context, manifest, traces, judge_all(context, manifest, traces))


@dataclass(frozen=True)
class Judged:
    """Every engine's verdict on every scenario of a gate run, the candidates' first."""

    verdicts: list[Verdict]
    traces: dict  # verdict key -> (the trace as judged, its golden on the layers judged, or None)
    by_unit: dict[tuple[str, str], Verdict]  # (engine key, scenario) -> its verdict


def judge_all(context: RunContext, manifest: RunManifest, traces: dict[str, Trace]) -> Judged:
    """Each engine's units of a scenario put together into one trace (assemble), judged on the
    layers it was asked and serves. A porter reads its own verdicts first: the candidates'
    before the oracle's."""
    engines, units = manifest.engines, manifest.units
    served = served_layers(engines, units, traces)
    judged = Judged([], {}, {})
    assembled = assemble(engines, [s["name"] for s in manifest.scenarios], units, traces)
    for engine, trace in sorted(assembled, key=lambda p: p[0].role != CANDIDATE):
        own = next(s for s in manifest.scenarios if s["name"] == trace.scenario_name)
        trace = checked(trace)  # the reports read the records as judged: declared fields only
        verdict, golden = judge_layers(trace, engine, own, units, manifest, context.pins, served[engine.key])
        judged.verdicts.append(verdict)
        judged.traces[verdict.key] = (trace, golden)
        judged.by_unit[(engine.key, verdict.scenario)] = verdict
    return judged


def report(context: RunContext, manifest: RunManifest, traces: dict[str, Trace], judged: Judged) -> int:
    """The verdicts reported: a whole run given a results folder writes it (each unit with its
    engine's verdict on its scenario), then the view is printed and the reports written; the
    exit status. With a candidate configured, the drift across pins and the per-pin tables (for
    whoever bumps the oracle pin) come only with `drift`."""
    units = manifest.units
    if context.results is not None:
        _write_results(context, manifest, units, traces, [
            _unit_summary(u, traces[u.key], judged.by_unit[(u.engine, u.scenario)]) for u in units])
    view = _view(context, manifest, traces, judged)
    context.out(render_gate(view))
    context.out(render_requirement_rows(view))
    context.out(render_pin_tables(view))
    return _write_reports(context, view)


def _view(context: RunContext, manifest: RunManifest, traces: dict[str, Trace], judged: Judged):
    """The gate's view of its verdicts (report/view.py), waivers applied."""
    pins, engines, scenarios = context.pins, manifest.engines, manifest.scenarios
    names = [s["name"] for s in scenarios]
    result = apply_gate(judged.verdicts, {s["name"]: tuple(s["rows"]) for s in scenarios}, context.waivers)
    commands = {label: e.command for e, label in report_labels(engines, manifest.units, traces).items()
                if e.command}
    candidates = any(e.role == CANDIDATE for e in engines)
    drift = drift_rows(names, pins.releases) if context.drift or not candidates else None
    methods = ((pins.releases, *table_rows(pins.releases))
               if drift is not None and any(s["method_matrix"] for s in scenarios) else None)
    required = manifest.require_features
    return gate_view(result, pins.oracle, commands, judged.traces,
                     {s["name"]: tuple(s["features"]) for s in scenarios}, required, drift, methods,
                     required_by_default=required is not None
                     and required == gate_configuration_features(pins.oracle))


def _write_reports(context: RunContext, view) -> int:
    """The report files and CI summaries written; the exit status (2 when they cannot be)."""
    log = context.log
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


def _write_results(context: RunContext, manifest: RunManifest, share: list[Unit], traces: dict[str, Trace],
                   summaries: list[dict]) -> None:
    index, count = context.shard or (1, 1)
    write_results(context.results, manifest, index, [(u, traces[u.key], s) for u, s in zip(share, summaries)])
    context.log(f"[gate] results of shard {index}/{count} written to {context.results}")


def _judge_unit(unit: Unit, trace: Trace, role: str, context: RunContext) -> Verdict:
    """A shard's unit judged alone, with its engine's role, against the golden's same layers."""
    return judge_unit(trace, unit.scenario, context.pins.oracle, trace.served(unit.layers), role)


def _unit_summary(unit: Unit, trace: Trace, verdict: Verdict) -> dict:
    """A unit and its verdict, for reading a results folder (verdicts.json) and a shard's output."""
    first = where_of(verdict) or next(iter(verdict.message.splitlines()), "")[:200]
    summary = {"engine": unit.engine, "scenario": unit.scenario, "layers": list(unit.layers),
               "kind": verdict.kind, "first": first}
    served = trace.served(unit.layers)
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
             traces: dict[str, Trace]) -> list[tuple[EngineRef, Trace]]:
    """One trace per engine and scenario, its units' layers together (Trace.joined, which
    keeps every part), labelled for the report."""
    labels = report_labels(engines, units, traces)
    out = []
    for engine in engines:
        for name in names:
            parts = [traces[u.key] for u in units if u.engine == engine.key and u.scenario == name]
            if parts:
                out.append((engine, Trace.joined(parts, labels[engine])))
    return out


__all__ = ["gate", "merge"]
