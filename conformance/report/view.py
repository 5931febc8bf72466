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
from conformance.formats.trace import Trace
from conformance.formats.visible import SHORT_ESCAPES, visible, visible_lines  # noqa: F401 - the reports' escape
from conformance.judging.requirement_rows import GateResult, where_of
from conformance.judging.compare import LayerComparison
from conformance.judging.judging import GATE_CONFIGURATION, prints_log_lines
from conformance.judging.verdict import (CANDIDATE, DIVERGED, KINDS, MISSING, NOT_ASKED, NOT_SERVED, NUMERICS, ORACLE,
                                         PASS, Verdict)
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
EVERYTHING = "every layer of every scenario judged"  # said only when every gating engine ran every scenario
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
    trace: Trace | None = None  # the trace judged and its golden (the HTML page draws them)
    golden: Trace | None = None
    # the config fields that differ but change no scheduling decision, when they are all its
    # config layer differs in (the headline is then the steps' or outputs' first divergence)
    bookkeeping: tuple[str, ...] = ()
    headline: LayerComparison | None = None  # the comparison its headline names, if any

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
class Coverage:
    """How many scenarios one gating engine was judged on, and why the rest were not run."""
    engine: str
    role: str
    total: int  # scenarios with a verdict of this engine
    declined: int  # not run: they need features its hello does not declare
    required: int  # of those, needing a feature the gate requires (failing)
    missing_required: tuple[str, ...]  # the required features it does not declare
    unserved: int  # run, but none of the layers asked is served
    log_lines: bool = True  # judged on vLLM's log lines (its hello lists no features, or vllm_log_lines)

    @property
    def judged(self) -> int:
        return self.total - self.declined - self.unserved

    @property
    def text(self) -> str:
        """`port judged on 4 of 113 scenarios: 109 need features it does not declare (24 of them
        the required spec:dflash, async_scheduling)`."""
        text = f"{self.engine} judged on {self.judged} of {self.total} scenario{'s' if self.total != 1 else ''}"
        why = []
        if self.declined:
            why.append(f"{self.declined} need features it does not declare" + (
                f" ({self.required} of them the required {', '.join(self.missing_required)})" if self.required else ""))
        if self.unserved:
            why.append(f"{self.unserved} ask only layers it does not serve")
        text += ": " + ", ".join(why) if why else ""
        if not self.log_lines:
            text += " (without vLLM's log lines: its hello does not declare vllm_log_lines)"
        return text


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
    coverage: list[Coverage] = field(default_factory=list)  # per gating engine, in grid order
    required: tuple[str, ...] | None = None  # the features a candidate must declare (None: not said)
    required_by_default: bool = False  # they are the gate configuration's (no --require-features)

    @property
    def judged(self) -> str:
        """What was judged, in one clause for the first line: per gating engine judged on fewer
        scenarios than the run has, how many and why not the rest; which layers; and, with a
        candidate, the features required. `every layer of every scenario judged` only when so."""
        partial = [c for c in self.coverage if c.judged < c.total or not c.log_lines]
        whole = [c for c in self.coverage if c not in partial]
        if not partial and self.layers == EVERYTHING:
            clauses = [EVERYTHING]
        else:
            clauses = [c.text for c in partial]
            if partial and whole:
                clauses.append(", ".join(f"{c.engine} on all {c.total}" for c in whole))
            clauses.append(self.layers if self.layers != EVERYTHING else "every layer of the scenarios run judged")
        if self.required is not None and any(r == CANDIDATE for r in self.roles.values()):
            clauses.append(self.requirement)
        return "; ".join(clauses)

    @property
    def requirement(self) -> str:
        """The features a candidate must declare to pass, and why those."""
        if not self.required:
            return ("features required: none (--require-features none, REQUIRE_FEATURES=none: the gate "
                    "configuration's features are not required)")
        names = ", ".join(self.required)
        if self.required_by_default:
            return (f"features required: {names} (by default, those of the gate configuration's "
                    f"scenarios {GATE_CONFIGURATION}; --require-features none opts out)")
        return f"features required: {names} (--require-features, REQUIRE_FEATURES=)"

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
        """`80 verdicts; candidate: 39 pass, 1 waived; oracle self-check: 40 pass`: the verdicts
        by role, never summed across roles (the oracle reproducing its goldens is no pass of the
        candidate's), each by the status the reports show (a waived divergence counts as waived,
        never as diverged)."""
        return f"{len(self.grid)} verdicts; " + by_role(list(self.grid.values()))

    def failing(self) -> list[Cell]:
        """The cells that did not pass, in grid order (scenario by scenario)."""
        return [c for s in self.scenarios for e in self.engines
                if (c := self.cell(s, e)) is not None and c.verdict.kind != PASS]

    def to_fix(self) -> list[list[Cell]]:
        """The gating cells that did not pass (a scenario not run for a feature not required is
        no failure), alike ones together: one engine, the same cell text and headline field. In
        grid order, each group in the order its first cell comes."""
        groups: dict[tuple, list[Cell]] = {}
        for c in self.failing():
            if c.verdict.gating and not c.verdict.declined:
                groups.setdefault((c.verdict.engine, c.text, c.where or c.first_line.message), []).append(c)
        return list(groups.values())



# Each role as the count lines name it, in their order.
ROLE_WORDS = {CANDIDATE: "candidate", ORACLE: "oracle self-check", "stand-in": "stand-ins (informational)"}


def by_role(cells: list[Cell]) -> str:
    """`candidate: 0 pass, 55 diverged; oracle self-check: 55 pass`: cells counted per role."""
    parts = []
    for role, words in ROLE_WORDS.items():
        mine = Counter(c.status for c in cells if c.verdict.role == role)
        if mine:
            parts.append(f"{words}: {_counted(mine)}")
    return "; ".join(parts) or "none"


def gate_view(result: GateResult, oracle: str, commands: dict[str, str] | None = None,
              traces: dict | None = None, features: dict[str, tuple] | None = None,
              required=(), drift: list | None = None, methods: tuple | None = None,
              required_by_default: bool = False) -> GateView:
    """traces: verdict key (engine, scenario) -> (the trace judged, its golden or None);
    features: scenario -> the features it needs (the per-feature table; none without it);
    required: the features the gate requires (None: the run did not say);
    required_by_default: they are the gate configuration's, no --require-features given."""
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
        headline, bookkeeping = headline_of(v)
        grid[v.key] = Cell(v, status, _cell_text(v, status, headline), result.rows_of(v), _where(headline),
                           _first_line(v, headline), result.waived.get(v.key), trace, golden,
                           bookkeeping, headline)
    return GateView(
        oracle=oracle, status=result.status, verdicts=result.verdicts, scenarios=scenarios,
        engines=engines, roles={v.engine: v.role for v in result.verdicts}, grid=grid,
        requirement_rows={row: [grid[v.key] for v in verdicts]
                          for row, verdicts in result.by_requirement_row().items()},
        counts=Counter(c.status for c in grid.values()), layers=layers_headline(result.verdicts),
        judged_groups=judged_groups(result.verdicts), commands=dict(commands or {}),
        expired=list(result.expired), unused=list(result.unused), why_unused=dict(result.why_unused),
        features=feature_rows(grid, engines, features, required or ()) if features is not None else [],
        drift=drift, methods=methods, coverage=coverage(result.verdicts, engines, traces or {}, required or ()),
        required=None if required is None else tuple(required), required_by_default=required_by_default)


def coverage(verdicts: list[Verdict], engines: list[str], traces: dict | None = None,
             required_features=()) -> list[Coverage]:
    """Per gating engine (the grid's order): its scenarios, those not run for features it does
    not declare (and those of them a required feature fails), those serving no layer asked, and
    whether it was judged on vLLM's log lines (traces: verdict key -> (trace, golden))."""
    out = []
    for engine in engines:
        mine = [v for v in verdicts if v.engine == engine]
        if not mine or not mine[0].gating:
            continue
        declined = [v for v in mine if v.missing_features]
        required = [v for v in declined if v.required_features]
        missing = {f for v in required for f in v.required_features}
        unserved = [v for v in mine if not v.missing_features and not v.judged and v.not_judged]
        said = [(traces or {}).get(v.key, (None, None))[0] for v in mine]
        quiet = any(t is not None and not prints_log_lines(t, required_features) for t in said)
        out.append(Coverage(engine, mine[0].role, len(mine), len(declined), len(required),
                            tuple(f for f in FEATURES if f in missing) + tuple(sorted(missing - set(FEATURES))),
                            len(unserved), not quiet))
    return out


def _counted(counts: Counter) -> str:
    return ", ".join(f"{counts[k]} {k}" for k in STATUSES if counts[k]) or "none"


def waiver_words(w: Waiver) -> str:
    """`(owner kit-team, expires 2027-12-31): reason`: what every report says of an applied waiver,
    made visible: a reason's newline must not start a line of its own (one that reads like the
    gate's header) in a report that splits its text into lines."""
    return visible(f"(owner {w.owner}, expires {w.expires}): {w.reason}")


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


# Config fields no scheduling decision reads: the log lines vLLM printed while resolving, and
# the lookahead slots where there is no drafter. A cell whose config differs only in these is
# headlined by its behaviour (steps, outputs); a budget value stays the headline.
LOG_FIELDS = ("budget_log_lines", "async_log_lines")


def headline_of(v: Verdict) -> tuple[LayerComparison | None, tuple[str, ...]]:
    """The comparison that headlines a verdict, and the bookkeeping fields it passed over: the
    first that differs, unless that is a config layer differing only in fields no scheduling
    decision reads and a later layer differs too."""
    differing = [c for c in v.comparisons if not c.equal and c.first is not None]
    if not differing:
        return None, ()
    first = differing[0]
    if first.layer not in ("config", "engine_config"):
        return first, ()
    record = first.record if isinstance(first.record, dict) else {}
    quiet = set(LOG_FIELDS) | ({"num_lookahead_tokens"} if record.get("speculative_method") is None else set())
    paths = [f.path.split("[")[0].split(".")[0] for f in first.fields]
    if not paths or not set(paths) <= quiet:
        return first, ()
    said = tuple(dict.fromkeys(paths))
    return (differing[1] if len(differing) > 1 else first), said


def _where(c: LayerComparison | None) -> str:
    return f"{c.layer}.{c.first.path}" if c is not None and c.first is not None else ""


def _cell_text(v: Verdict, status: str, headline: LayerComparison | None = None) -> str:
    """pass, or the verdict and where it first differs: `diverged config.max_num_scheduled_tokens`."""
    if status == PASS:  # judged on fewer layers than the scenario has: which ones
        return f"{Kind.PASS} [{','.join(v.judged)}]" if v.not_judged else Kind.PASS
    if v.missing_features:  # not run: the features the engine does not declare
        text = f"{status} {','.join(v.missing_features)}"
        return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 3] + "..."
    if v.failure:  # diverged, then the engine failed: both, the divergence's field first
        status = f"{status}+{v.failure}"
    text = f"{status} {_where(headline) if headline is not None else where_of(v)}".strip()
    return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 3] + "..."


def _first_line(v: Verdict, headline: LayerComparison | None = None) -> FirstLine:
    if headline is not None:
        f = headline.first
        return FirstLine(headline.layer, headline.index, f.path, f.expected, f.actual)
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
        return EVERYTHING
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
