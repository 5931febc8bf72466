"""The adequacy report, as text: coverage per function and pin, uncovered branches with their
source lines, out-of-scope code by rule, the mutants' kill rate and every survivor's diff."""

from __future__ import annotations

from collections import defaultdict

from conformance.adequacy.engine_path import GOAL_ENGINE_KILLED
from conformance.adequacy.measure import CATALOG_TITLES, GOAL_BRANCHES, GOAL_KILLED, MutantRun, PinCoverage


def pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:5.1f}%" if b else "    -"


def render_coverage(cov: PinCoverage) -> str:
    lines = [f"== coverage of the scheduling code by the scenario library: vllm {cov.release} "
             f"({cov.seconds:.0f} s)",
             f"   {'function':58s} {'lines':>13s} {'branches':>14s}"]
    for f in cov.functions:
        if not f.statements and not f.branches:
            continue
        lines.append(f"   {f.file.rsplit('/', 1)[-1] + ':' + f.qualname:58s} "
                     f"{len(f.covered):4d}/{len(f.statements):<4d}{pct(len(f.covered), len(f.statements))} "
                     f"{len(f.covered_branches):4d}/{len(f.branches):<4d}{pct(len(f.covered_branches), len(f.branches))}")
    parts = [("TOTAL (in scope)", False)]
    if cov.part(callees=True):  # the code the scheduler calls, reported on its own line
        parts = [("TOTAL the scheduler (in scope)", False), ("TOTAL what it calls (in scope)", True)]
    for title, callees in parts:
        fs = cov.part(callees)
        cl, nl, cb, nb = cov.totals(callees)
        lines.append(f"   {title:58s} {cl:4d}/{nl:<4d}{pct(cl, nl)} {cb:4d}/{nb:<4d}{pct(cb, nb)}")
        lines.append(_all_measured("  all measured code, out of scope included", fs))
        files = sorted({f.file for f in fs})
        if len(files) > 1:  # per file: the figures stay comparable when a file joins the measure
            lines.extend(_all_measured(f"    {name.removeprefix('vllm/')}", [f for f in fs if f.file == name])
                         for name in files)
    missing = [(f, arc) for f in cov.part() + cov.part(callees=True) for arc in f.missing_branches]
    lines.append(f"   uncovered branches in scope: {len(missing)}")
    for f, (a, b) in missing:
        src = cov.sources[f.file][a - 1].strip() if 0 < a <= len(cov.sources[f.file]) else ""
        to = f"line {b}" if b > 0 else "exit"
        lines.append(f"     {f.file.rsplit('/', 1)[-1]}:{a} -> {to:9s} [{f.qualname}]  {src[:90]}")
    by_rule, called = defaultdict(list), defaultdict(int)
    for callees in (False, True):
        for f in cov.part(callees):
            for (a, b), rule in f.missing_out_branches.items():
                by_rule[rule].append(f"{f.file.rsplit('/', 1)[-1]}:{a}")
                called[rule] += callees
    total_out = sum(len(v) for v in by_rule.values())
    split = f" (the scheduler {total_out - sum(called.values())}, what it calls {sum(called.values())})" \
        if cov.part(callees=True) else ""
    lines.append(f"   uncovered branches out of scope: {total_out}{split}, by rule (adequacy_scope.toml):")
    for rule, where in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(sorted(set(where), key=lambda w: (w.split(':')[0], int(w.split(':')[1]))))
        part = f" [{called[rule]} in what it calls]" if 0 < called[rule] < len(where) else ""
        lines.append(f"     {len(where):3d}  {rule.label}: {rule.reason}{part}\n          at {shown}")
    return "\n".join(lines)


def _all_measured(title: str, fs: list) -> str:
    """Lines and branches of `fs`, in scope or not: a figure no scope rule changes."""
    nl = sum(len(f.statements) + len(f.out_lines) for f in fs)
    nb = sum(len(f.branches) + len(f.out_branches) for f in fs)
    cl = sum(len(f.covered) + len(f.executed_out) for f in fs)
    cb = sum(len(f.covered_branches) + len(f.out_branches) - len(f.missing_out_branches) for f in fs)
    return f"   {title:58s} {cl:4d}/{nl:<4d}{pct(cl, nl)} {cb:4d}/{nb:<4d}{pct(cb, nb)}"


def kill_figures(run: MutantRun, equivalent: dict[str, str]) -> tuple[int, int, int, list]:
    """(killed, non-equivalent run, equivalent run, survivors that are not equivalent)."""
    killed = sum(1 for _m, r in run.results if r["killed"])
    eq = [m for m, r in run.results if not r["killed"] and m.id in equivalent]
    survivors = [(m, r) for m, r in run.results if not r["killed"] and m.id not in equivalent]
    return killed, len(run.results) - len(eq), len(eq), survivors


def render_mutants(run: MutantRun, sources: dict[str, str], equivalent: dict[str, str],
                   not_run: list = ()) -> str:
    """The catalog's figures; `not_run`: the engine path's mutants on lines no scenario runs."""
    killed, counted, n_eq, survivors = kill_figures(run, equivalent)
    kinds = defaultdict(int)
    for _m, r in run.results:
        if r["killed"]:
            kinds[r["kind"]] += 1
    engine = run.what == "engine path"
    by_function = defaultdict(int)
    for m in not_run:
        by_function[f"{m.file.rsplit('/', 1)[-1]}:{m.function}"] += 1
    title = "engine-path mutants" if engine else f"generated mutants of {CATALOG_TITLES.get(run.what, run.what)}"
    lines = [f"== {title}: vllm {run.release}, judged against its goldens ({run.seconds:.0f} s, "
             f"{run.cached} from the cache)",
             f"   on {run.scenarios} scenarios ("
             + ("the engine-layer ones, in order, judged on engine_config, engine_steps, engine_outputs"
                if engine else "the stand-in ones" + (", then for a survivor the engine-layer tier"
                                                      if run.tier else ""))
             + f"), scenario-set hash {run.set_hash}",
             f"   generated {run.generated}, run {len(run.results)}"
             + (" (a deterministic seeded sample)" if len(run.results) < run.generated else "")
             + (f"; not run: {len(not_run)} more on lines the engine scenarios never run on this "
                f"device (coverage.py), in {len(by_function)} functions" if engine else ""),
             f"   caught {killed} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
             f"equivalent {n_eq}; surviving {len(survivors)}",
             f"   kill rate of the non-equivalent mutants: {killed}/{counted} = {pct(killed, counted).strip()}"]
    for m, r in run.results:
        if not r["killed"] and m.id in equivalent:
            lines.append(f"   equivalent {m.name}: {equivalent[m.id]}")
    if by_function:
        lines.append("   not run, by function: " + ", ".join(f"{k} {v}" for k, v in sorted(by_function.items())))
    for m, r in survivors:
        lines.append(f"   SURVIVED {m.name} ({r['kind']})")
        lines.extend("     " + line for line in m.diff(sources[m.file]).rstrip("\n").splitlines())
    return "\n".join(lines)


def render_goals(coverages: list[PinCoverage], runs: list[MutantRun], equivalent: dict[str, str],
                 engine_run: MutantRun | None = None, engine_equivalent: dict[str, str] | None = None
                 ) -> tuple[str, bool]:
    """One line per goal: in-scope branches of the scheduler and of what it calls, per pin;
    each generated catalog's kill rate (`runs`); the engine path's."""
    lines, ok = ["== goals"], True
    for cov in coverages:
        parts = [("", False)] + ([(" of what the scheduler calls", True)] if cov.part(callees=True) else [])
        for what, callees in parts:
            _cl, _nl, cb, nb = cov.totals(callees)
            met = nb and 100.0 * cb / nb >= GOAL_BRANCHES
            ok &= bool(met)
            lines.append(f"   {'met ' if met else 'MISS'} branch coverage in scope{what} >= {GOAL_BRANCHES:.0f}% "
                         f"on vllm {cov.release}: {cb}/{nb} = {pct(cb, nb).strip()}")
    for run in runs:
        killed, counted, _eq, _s = kill_figures(run, equivalent)
        met = counted and 100.0 * killed / counted >= GOAL_KILLED
        ok &= bool(met)
        lines.append(f"   {'met ' if met else 'MISS'} non-equivalent mutants of {CATALOG_TITLES[run.what]} "
                     f"caught >= {GOAL_KILLED:.0f}% on vllm {run.release}: {killed}/{counted} = "
                     f"{pct(killed, counted).strip()}")
    if engine_run is not None:
        killed, counted, _eq, _s = kill_figures(engine_run, engine_equivalent or {})
        met = counted and 100.0 * killed / counted >= GOAL_ENGINE_KILLED
        ok &= bool(met)
        lines.append(f"   {'met ' if met else 'MISS'} non-equivalent engine-path mutants caught on the engine "
                     f"layers >= {GOAL_ENGINE_KILLED:.0f}% on vllm {engine_run.release}: "
                     f"{killed}/{counted} = {pct(killed, counted).strip()}")
    return "\n".join(lines), ok
