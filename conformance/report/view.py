"""The gate's result as every report shows it, computed once: the grid of verdicts (scenarios
down, engines across, in the order they ran), each verdict's status word and cell text, the
roles, the requirement rows, the counts, which layers were judged, and the exit status with its
words. The terminal report, JUnit, markdown, the HTML page and the CI annotation all render a
`GateView`, so they cannot disagree about what happened."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from conformance.formats.kinds import Kind
from conformance.formats.features import CORE, FEATURES
from conformance.formats.protocol import ENGINE_LAYERS, LAYERS
from conformance.formats.visible import SHORT_ESCAPES, visible, visible_lines  # noqa: F401 - the reports' escape
from conformance.judging.requirement_rows import GateResult, where_of
from conformance.judging.verdict import DIVERGED, KINDS, MISSING, NOT_ASKED, NOT_SERVED, NUMERICS, ORACLE, PASS, Verdict
from conformance.judging.waivers import Waiver

# The exit status: its word in a report's title, the title's explanation (markdown), and what
# the run's last log line says of it.
WORDS = ("PASS", "FAIL", "ERROR")
EXPLAINED = ("PASS", "FAIL (unwaived divergence or expired waiver)", "ERROR (a gating run could not be compared)")
MEANINGS = ("every gating verdict passes or is waived",
            "a gating engine diverged without a waiver, or a waiver expired",
            "a gating run could not be compared, or a candidate ran no scenario")
# What the per-feature table says of itself, in every report.
FEATURES_HEAD = ("by feature: per engine, the scenarios needing it that passed / that ran; `not declared`: "
                 "the engine's hello does not declare the feature, so they did not run; `not run`: they "
                 "need another feature it does not declare (failing only when required: "
                 "--require-features, REQUIRE_FEATURES=)")
# What each reason for a layer not judged says in the reports.
REASONS = {NOT_ASKED: "not asked (--layers, LAYERS=)",
           NOT_SERVED: "the engine does not serve them (its hello does not declare them)",
           MISSING: "required, but the engine does not serve them (its hello does not declare them)"}
# Every status a cell can show, in the order the count lines give them.
STATUSES = (PASS, NUMERICS, DIVERGED, "waived") + tuple(k for k in KINDS if k not in (PASS, NUMERICS, DIVERGED))
# Past this many scenarios, rows whose cells are all the same fold into one, so the grid
# still fits a screen: "steady_decode +20" reads as steady_decode and 20 more scenarios with the
# same verdicts, named just below the grid (the terminal, and the page's first screen).
MAX_ROWS = 24
CELL_WIDTH = 40  # a grid cell: the verdict and the first divergent field, cut to fit
@dataclass(frozen=True)
class FirstLine:
    """A verdict in a line, its parts raw (each report escapes them its own way): its first
    divergence (layer, record number, field, both values), else the first line of its message."""
    layer: str = ""
    index: int | None = None
    path: str = ""
    expected: object = None
    actual: object = None
    message: str = ""


@dataclass(frozen=True)
class Cell:
    """One verdict as the reports show it."""
    verdict: Verdict
    status: str  # the verdict's kind, or `waived` for a divergence a waiver covers
    text: str  # the grid cell: `pass`, or the status and where it first differs
    rows: tuple[str, ...]  # the requirement rows it is filed under (every row of its scenario)
    where: str  # layer.field of its first divergence ("" when none)
    first_line: FirstLine  # its first divergence, else the first line of its message
    waiver: Waiver | None = None
    trace: dict | None = None  # the trace judged and its golden (the HTML page draws them)
    golden: dict | None = None

    @property
    def row(self) -> str:
        """Its requirement rows, as one table cell shows them."""
        return ", ".join(self.rows)


@dataclass(frozen=True)
class FeatureCell:
    """One engine on the scenarios that need one feature (or none: `core`)."""
    needing: int  # scenarios of the run that need it, with a verdict of this engine
    passed: int
    not_run: int  # not run: they need a feature the engine does not declare
    declared: bool  # False: the engine does not declare this feature (none of them ran)

    @property
    def text(self) -> str:
        """`3/4` (passed of those run), `, 2 not run`; `5 not declared`; `-` when none needs it."""
        if not self.declared:
            return f"{self.needing} not declared"
        run = self.needing - self.not_run
        parts = [f"{self.passed}/{run}"] if run else []
        if self.not_run:
            parts.append(f"{self.not_run} not run")
        return ", ".join(parts) or "-"


@dataclass(frozen=True)
class FeatureRow:
    """A row of the per-feature table: a feature some scenario of the run needs, or `core`."""
    feature: str
    meaning: str
    required: bool  # --require-features names it
    cells: dict[str, FeatureCell]  # engine -> its cell

    @property
    def label(self) -> str:
        return f"{self.feature} (required)" if self.required else self.feature


@dataclass(frozen=True)
class GateView:
    oracle: str
    status: int  # the exit status
    verdicts: list[Verdict]  # in the order they were judged
    scenarios: list[str]  # the grid's rows, in the order they ran
    engines: list[str]  # the grid's columns, in the order they ran
    roles: dict[str, str]  # engine -> its role
    grid: dict[tuple[str, str], Cell]  # verdict key (engine, scenario) -> its cell
    requirement_rows: dict[str, list[Cell]]  # requirement row -> its cells, rows sorted
    counts: Counter  # status -> how many verdicts
    layers: str  # which layers were judged and which were not, in one clause
    judged_groups: list[dict]  # engines judged on fewer layers: scenarios by the layers judged
    commands: dict[str, str]  # engine label -> its command line, shown once
    expired: list[Waiver]
    unused: list[Waiver]
    features: list[FeatureRow] = field(default_factory=list)  # the per-feature table, `core` first
    why_unused: dict[Waiver, str] = field(default_factory=dict)  # an unused waiver -> why it covered nothing
    # for whoever bumps the oracle pin, from the goldens: the drift across pins (report/drift.py
    # rows) and the per-pin method tables (methods_table.table_rows with its releases), or None
    # when left out (a candidate's run without --drift; no method_matrix scenario)
    drift: list | None = None
    methods: tuple | None = None

    @property
    def word(self) -> str:
        return WORDS[self.status]

    @property
    def explained(self) -> str:
        return EXPLAINED[self.status]

    @property
    def meaning(self) -> str:
        return MEANINGS[self.status]

    def cell(self, scenario: str, engine: str) -> Cell | None:
        return self.grid.get((engine, scenario))

    def folded(self) -> list[list[str]]:
        """The grid's rows, scenario names grouped by identical cells, in the order they ran
        (each scenario alone when there are at most MAX_ROWS)."""
        if len(self.scenarios) <= MAX_ROWS:
            return [[s] for s in self.scenarios]
        groups: dict[tuple, list[str]] = {}
        for s in self.scenarios:
            row = tuple(c.text if (c := self.cell(s, e)) else "-" for e in self.engines)
            groups.setdefault(row, []).append(s)
        return list(groups.values())

    def applied(self) -> list[tuple[Waiver, list[Cell]]]:
        """Each waiver applied in this gate and the cells it waived, in grid order."""
        by: dict[Waiver, list[Cell]] = {}
        for s in self.scenarios:
            for e in self.engines:
                if (c := self.cell(s, e)) is not None and c.status == "waived" and c.waiver is not None:
                    by.setdefault(c.waiver, []).append(c)
        return list(by.items())

    def count_line(self) -> str:
        """`80 verdicts: 79 pass, 1 waived; gating: 79 pass, 1 waived`: the verdicts by the
        status the reports show (a waived divergence counts as waived, never as diverged)."""
        gating = Counter(c.status for c in self.grid.values() if c.verdict.gating)
        return f"{len(self.grid)} verdicts: {_counted(self.counts)}; gating: {_counted(gating)}"

    def failing(self) -> list[Cell]:
        """The cells that did not pass, in grid order (scenario by scenario)."""
        return [c for s in self.scenarios for e in self.engines
                if (c := self.cell(s, e)) is not None and c.verdict.kind != PASS]


def gate_view(result: GateResult, oracle: str, commands: dict[str, str] | None = None,
              traces: dict | None = None, features: dict[str, tuple] | None = None,
              required=(), drift: list | None = None, methods: tuple | None = None) -> GateView:
    """traces: verdict key (engine, scenario) -> (the trace judged, its golden or None);
    features: scenario -> the features it needs (the per-feature table; none without it);
    required: the features the gate requires."""
    scenarios: list[str] = []
    engines: list[str] = []
    grid: dict[tuple[str, str], Cell] = {}
    for v in result.verdicts:
        if v.scenario not in scenarios:
            scenarios.append(v.scenario)
        if v.engine not in engines:
            engines.append(v.engine)
        trace, golden = (traces or {}).get(v.key, (None, None))
        status = "waived" if v.kind == DIVERGED and v.key in result.waived else v.kind
        grid[v.key] = Cell(v, status, _cell_text(v, status), result.rows_of(v), where_of(v),
                           _first_line(v), result.waived.get(v.key), trace, golden)
    return GateView(
        oracle=oracle, status=result.status, verdicts=result.verdicts, scenarios=scenarios,
        engines=engines, roles={v.engine: v.role for v in result.verdicts}, grid=grid,
        requirement_rows={row: [grid[v.key] for v in verdicts]
                          for row, verdicts in result.by_requirement_row().items()},
        counts=Counter(c.status for c in grid.values()), layers=layers_headline(result.verdicts),
        judged_groups=judged_groups(result.verdicts), commands=dict(commands or {}),
        expired=list(result.expired), unused=list(result.unused), why_unused=dict(result.why_unused),
        features=feature_rows(grid, engines, features, required) if features is not None else [],
        drift=drift, methods=methods)


def _counted(counts: Counter) -> str:
    return ", ".join(f"{counts[k]} {k}" for k in STATUSES if counts[k]) or "none"


def waiver_words(w: Waiver) -> str:
    """`(owner kit-team, expires 2027-12-31): reason`: what every report says of an applied waiver."""
    return f"(owner {w.owner}, expires {w.expires}): {w.reason}"


def feature_rows(grid: dict[tuple[str, str], Cell], engines: list[str], features: dict[str, tuple],
                 required=()) -> list[FeatureRow]:
    """The per-feature table: `core` (the scenarios needing no feature), then each feature some
    scenario needs, in formats/features.py's order; per engine, its scenarios needing it, those
    that passed and those not run because they need a feature it does not declare."""
    names = [CORE] + [f for f in FEATURES if any(f in needs for needs in features.values())]
    names += sorted({f for needs in features.values() for f in needs} - set(names))
    rows = []
    for name in names:
        cells = {}
        for engine in engines:
            mine = [c for (e, s), c in grid.items() if e == engine and s in features
                    and (name in features[s] if name != CORE else not features[s])]
            cells[engine] = FeatureCell(len(mine), sum(_passed(c) for c in mine),
                                        sum(bool(c.verdict.missing_features) for c in mine),
                                        not any(name in c.verdict.missing_features for c in mine))
        meaning = "scenarios that need no feature" if name == CORE else FEATURES.get(name, "")
        rows.append(FeatureRow(name, meaning, name in required, cells))
    return rows


def _passed(cell: Cell) -> bool:
    """Passed as the exit status counts it (a candidate's numerics passes; the oracle's on the
    build that wrote the golden does not)."""
    v = cell.verdict
    return cell.status == PASS or (cell.status == NUMERICS and not (v.role == ORACLE and v.same_build))


def _cell_text(v: Verdict, status: str) -> str:
    """pass, or the verdict and where it first differs: `diverged config.max_num_scheduled_tokens`."""
    if status == PASS:  # judged on fewer layers than the scenario has: which ones
        return f"{Kind.PASS} [{','.join(v.judged)}]" if v.not_judged else Kind.PASS
    if v.missing_features:  # not run: the features the engine does not declare
        text = f"{status} {','.join(v.missing_features)}"
        return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 3] + "..."
    if v.failure:  # diverged, then the engine failed: both, the divergence's field first
        status = f"{status}+{v.failure}"
    text = f"{status} {where_of(v)}".strip()
    return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 3] + "..."


def _first_line(v: Verdict) -> FirstLine:
    for c in v.comparisons:
        if not c.equal and c.first is not None:
            f = c.first
            return FirstLine(c.layer, c.index, f.path, f.expected, f.actual)
    return FirstLine(message=v.message.splitlines()[0] if v.message else "")


def layer_names(layers) -> str:
    """config, steps, outputs; the three engine layers together as `the engine layers`."""
    layers = [layer for layer in LAYERS if layer in layers] + [x for x in layers if x not in LAYERS]
    if all(layer in layers for layer in ENGINE_LAYERS):
        at = layers.index(ENGINE_LAYERS[0])
        layers = [x for x in layers if x not in ENGINE_LAYERS]
        layers.insert(at, "the engine layers")
    return ", ".join(layers) or "no layer"


def layers_headline(verdicts: list[Verdict]) -> str:
    """Which layers were judged and which were not, and why, in one clause: for the
    candidates when there are any (the porter's question), else for every engine."""
    chosen = [v for v in verdicts if v.role == "candidate"] or verdicts
    engines: dict[str, str] = {}
    for v in chosen:
        if v.engine not in engines:
            engines[v.engine] = _judged_clause([w for w in chosen if w.engine == v.engine])
    clauses = set(engines.values())
    if clauses == {""}:
        return "every layer of every scenario judged"
    if len(clauses) == 1:
        return clauses.pop()
    return "; ".join(f"{engine}: {clause or 'every layer judged'}" for engine, clause in engines.items())


def _judged_clause(verdicts: list[Verdict]) -> str:
    """`judged on config; the engine layers not judged: <why>`; empty when nothing was left out."""
    reasons: dict[str, set] = {}
    for v in verdicts:
        for layer, reason in v.not_judged.items():
            reasons.setdefault(reason, set()).add(layer)
    if not reasons:
        return ""
    text = f"judged on {layer_names({layer for v in verdicts for layer in v.judged})}"
    for reason, layers in reasons.items():
        text += f"; {layer_names(layers)} not judged: {REASONS.get(reason, reason)}"
    return text


def judged_groups(verdicts: list[Verdict]) -> list[dict]:
    """Per engine that was not judged on every layer, its scenarios grouped by the layers
    judged and not judged (with why): the candidates' when there are any. Engines judged
    alike on the same scenarios share one group (`engines`; `engine` names them all), so ten
    candidates judged on the same layers are said once."""
    verdicts = [v for v in verdicts if v.role == "candidate"] or verdicts
    partial = {v.engine for v in verdicts if v.not_judged}
    groups: dict[tuple, dict] = {}
    for v in verdicts:
        if v.engine not in partial:
            continue
        text = _judged_clause([v]) or f"judged on {layer_names(v.judged)}"
        groups.setdefault((v.engine, text), {"engine": v.engine, "text": text,
                                             "scenarios": []})["scenarios"].append(v.scenario)
    shared: dict[tuple, dict] = {}
    for g in groups.values():
        shared.setdefault((g["text"], tuple(g["scenarios"])), dict(g, engines=[]))["engines"].append(g["engine"])
    return [dict(g, engine=", ".join(g["engines"])) for g in shared.values()]
