"""The gate's report as one self-contained HTML page.

The HTML page opens with the grid of verdicts, each cell a link to its scenario. Per scenario:
scheduled tokens per step for the oracle and each candidate, each engine's token budget drawn
as a line of its own colour; a second panel with the per-step difference candidate minus
oracle; then, per candidate that diverged, a zoom on the steps around its first divergence,
every request's counts at that step and the capacity check of the engine layers. Inline SVG
and CSS, one small inline script (it opens the details a link points at): nothing fetched,
readable offline.

Every value interpolated into the page goes through `_h` (made visible, then html.escape):
a candidate's label, messages, record keys and values, a step value, a per-request caption and
the requirement row a merge manifest names are text on the page, never markup. A record that
is not an object, or a count that is not a number, is drawn as missing rather than crashing
the page.
"""


from __future__ import annotations

import html
import re

from conformance.formats.pins import pin_label
from conformance.formats.trace import Trace
from conformance.judging.verdict import FAILURE_KINDS, ORACLE, PASS, Verdict
from conformance.report.render_text import likely_cause, render_pin_tables, render_verdict, shown_pair
from conformance.report.view import FEATURES_HEAD, REASONS, Cell, GateView, visible, visible_lines, waiver_words

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
ZOOM = 6  # steps either side of a first divergence in its zoom panel


def html_report(view: GateView) -> str:
    """The page. Its first screen is what failed: the title and counts, the verdicts that did
    not pass, the waivers, then the grid folded as the terminal folds it; the tables of layers
    judged and features, and each scenario's section, below."""
    body = [f"<h1>vllm-parity gate: {_h(view.word)} (exit status {view.status})</h1>",
            f"<p class='counts'>Oracle: vLLM {_h(view.oracle)}. {len(view.scenarios)} scenarios x "
            f"{len(view.engines)} engines. {_h(view.count_line())}.</p>",
            f"<p class='judged'>Judged: {_h(view.judged)}.</p>"]
    body += _not_passing(view)
    body += _waivers(view)
    body += _matrix(view)
    body.append(f"<p class='layers'>Layers: {_h(view.layers)}.</p>")
    if view.judged_groups:
        body.append("<table class='layers'><tr><th>engine</th><th>layers judged and not judged</th>"
                    "<th>scenarios</th></tr>")
        body += [f"<tr><td><code>{_h(g['engine'])}</code></td><td>{_h(g['text'])}</td>"
                 f"<td>{len(g['scenarios'])}: {_h(', '.join(g['scenarios']))}</td></tr>"
                 for g in view.judged_groups]
        body.append("</table>")
    body += [f"<p><code>{_h(label)}</code>: command <code>{_h(command)}</code></p>"
             for label, command in view.commands.items()]
    body += _features_table(view)
    for s in view.scenarios:
        body += _scenario_section(view, s, [c for e in view.engines if (c := view.cell(s, e))])
    if view.drift is not None:
        body.append("<details class='pins'><summary>Drift across pins and per-pin tables (from the goldens)"
                    f"</summary><pre>{_h(render_pin_tables(view), lines=True)}</pre></details>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{padding:2px 8px;text-align:left}"
             "h1{margin:8px 0 4px}p{margin:4px 0}"
             "table{border-collapse:collapse}table.matrix td,table.matrix th,table.features td,table.features th,"
             "table.not-passing td,table.not-passing th{border:1px solid #ddd}"
             "table.not-passing td,table.matrix td,table.matrix th{font-size:13px;padding:1px 6px}"
             "table.not-passing td code{white-space:nowrap}table.not-passing td.cause{font-size:12px;color:#555}caption{text-align:left;font-weight:bold}p.folded{font-size:13px}"
             "div.scroll{max-width:100%;overflow-x:auto}"
             ".pass{color:#2a2}.numerics{color:#27a}.diverged{color:#c22}.waived{color:#a80}"
             "td a{color:inherit}" + "".join(f".{k}{{color:#a50}}" for k in FAILURE_KINDS) +
             "tr.differs td{background:#fde8e8}td.diff{font-weight:bold;color:#c22}"
             "pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}"
             "svg text{font-family:sans-serif}")
    # Opens the collapsed details a grid link points at; marks each row of the verdicts that did
    # not pass and each failing grid cell on the first screen (`data-seen`: what a reader sees
    # before scrolling) and whether each scrolling box fits the window's width (`data-fits`),
    # which `make report-check` reads; marks the page as scripted-ready.
    script = ("function openTarget(){var t=location.hash&&document.getElementById(location.hash.slice(1));"
              "if(t&&t.tagName==='DETAILS'){t.open=true;}}"
              "window.addEventListener('hashchange',openTarget);openTarget();"
              "document.querySelectorAll('[data-failing]').forEach(function(e){var r=e.getBoundingClientRect();"
              "e.setAttribute('data-seen',r.bottom<=window.innerHeight&&r.right<=window.innerWidth?'1':'0');});"
              "document.querySelectorAll('div.scroll').forEach(function(e){"
              "e.setAttribute('data-fits',e.getBoundingClientRect().right<=window.innerWidth?'1':'0');});"
              "document.body.setAttribute('data-ready','1');")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>vllm-parity gate</title>"
            f"<style>{style}</style></head><body>{''.join(body)}<script>{script}</script></body></html>\n")


def _not_passing(view: GateView) -> list[str]:
    """The verdicts that did not pass: the page's first table. Verdicts alike (one engine, one
    status, the same first divergent field) share a row naming their scenarios, each linked to
    its details, so a gate with dozens of them still shows every one on the first screen. (A
    scenario not run for a feature not declared, not required, is said by its cell.)"""
    groups: dict[tuple, list[Cell]] = {}
    for c in view.failing():
        if not c.verdict.declined:
            status = f"{c.status}+{c.verdict.failure}" if c.verdict.failure else c.status  # diverged, then crashed
            groups.setdefault((c.verdict.engine, c.verdict.role, status, c.where or c.first_line.message), []).append(c)
    if not groups:
        return ["<p class='not-passing'>Every verdict judged passed (what was judged: the line above).</p>"]
    count = sum(len(cells) for cells in groups.values())
    body = [f"<table class='not-passing'><caption>what to fix: the first divergence of the {count} verdicts that "
            "did not pass</caption><tr><th>engine</th><th>verdict</th><th>first divergence</th><th>likely cause</th>"
            "<th>scenarios</th></tr>"]
    for (engine, role, status, where), cells in groups.items():
        said = _first(cells[0])
        cause = likely_cause(cells[0].headline) if cells[0].headline is not None else ""
        if cells[0].bookkeeping:
            cause += f" (its config differs only in {', '.join(cells[0].bookkeeping)})"
        # the first scenarios linked (the first one's values are shown), the rest counted: the
        # grid below names every one
        links = ", ".join(f"<a href='#{_anchor(c.verdict.scenario, engine)}'>{_h(c.verdict.scenario)}</a>"
                          for c in cells[:LINKED])
        if len(cells) > LINKED:
            links += f" and {len(cells) - LINKED} more alike (the grid)"
        body.append(f"<tr data-failing='1'><td><code>{_h(engine)}</code> ({_h(role)})</td>"
                    f"<td class='{_h(status.split('+')[0])}'>{_h(status)}</td><td>{_h(said)}</td>"
                    f"<td class='cause'>{_h(cause)}</td><td>{len(cells)}: {links}</td></tr>")
    body.append("</table>")
    return body


def _first(cell: Cell) -> str:
    """`steps #0 total_num_scheduled_tokens: oracle 4036, candidate 4096` (values cut), else
    the first line of the verdict's message (cut)."""
    f, h = cell.first_line, cell.headline
    if not f.layer or h is None:
        return _cut(f.message, 2 * VALUE_CUT)
    said, expected, actual = shown_pair(f.expected, f.actual)
    return f"{f.layer}.{f.path} ({h.where}): {said}oracle {_cut(expected, VALUE_CUT)}, candidate {_cut(actual, VALUE_CUT)}"


VALUE_CUT = 60  # characters of a value the first table shows (the details show it whole)
LINKED = 3  # scenarios a row of the first table links; its values are the first one's


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."


def _waivers(view: GateView) -> list[str]:
    """Each waiver applied (to which engines, its owner, expiry and reason), each expired one
    and each unused one with why it covered nothing."""
    items = [f"<li>waiver applied: {_h(w.name)} to {_h(', '.join(c.verdict.engine for c in cells))} "
             f"{_h(waiver_words(w))}</li>" for w, cells in view.applied()]
    items += [f"<li class='expired'>EXPIRED waiver: {_h(w.name)} (owner {_h(w.owner)}, expired "
              f"{_h(w.expires)}): renew or remove it</li>" for w in view.expired]
    items += [f"<li>unused waiver: {_h(w.name)} (owner {_h(w.owner)}): {_h(view.why_unused.get(w, ''))}</li>"
              for w in view.unused]
    if not items:
        return []
    return [f"<ul class='waivers'><li class='head'>waivers applied, expired and unused in this gate:</li>"
            f"{''.join(items)}</ul>"]


def _matrix(view: GateView) -> list[str]:
    """The grid, scenarios down and engines across, folded as the terminal folds it: past
    MAX_ROWS scenarios, rows of identical cells are one row (`name +N`), every scenario still
    named below it."""
    folded = view.folded()
    body = ["<table class='matrix'><tr><th>scenario</th>" + "".join(
        f"<th><code>{_h(e)}</code><br>({_h(view.roles[e])})</th>" for e in view.engines) + "</tr>"]
    for names in folded:
        s = names[0]
        label = _h(s) if len(names) == 1 else f"{_h(s)} +{len(names) - 1}"
        row = [f"<th><a href='#{_anchor(s)}'>{label}</a></th>"]
        for e in view.engines:
            c = view.cell(s, e)
            if c is None:
                row.append("<td>-</td>")
                continue
            failing = c.verdict.kind != PASS and not c.verdict.declined
            target = _anchor(s, e) if c.verdict.kind != PASS else _anchor(s)
            mark = " data-failing='1'" if failing else ""
            row.append(f"<td class='{_h(c.status)}'{mark}>"
                       f"<a href='#{target}'>{_h(c.text)}</a></td>")
        body.append("<tr>" + "".join(row) + "</tr>")
    body.append("</table>")
    for names in folded:
        if len(names) > 1:
            body.append(f"<p class='folded'>{_h(names[0])} +{len(names) - 1}: " + ", ".join(
                f"<a href='#{_anchor(n)}'>{_h(n)}</a>" for n in names[1:]) + "</p>")
    return body


def _scenario_section(view: GateView, scenario: str, cells: list[Cell]) -> list[str]:
    body = [f"<section id='{_anchor(scenario)}'><h2>{_h(scenario)}</h2>"]
    golden = next((c.golden for c in cells if c.golden), None)
    layer, oracle_steps = _steps(golden)
    series = []  # (label, steps records, first divergent step or None)
    if oracle_steps:
        series.append((f"oracle {pin_label(view.oracle)} (golden)", oracle_steps, None))
    for cell in cells:
        v = cell.verdict
        _, steps = _steps(cell.trace)
        if steps and v.role != ORACLE:
            c = next((c for c in v.comparisons if c.layer == layer and not c.equal), None)
            series.append((v.engine, steps, c.index if c is not None else None))
    if len(series) > 1 or (series and not oracle_steps):
        body.append(_plot(series, "scheduled tokens per step, each engine's token budget as a line",
                          "plot-steps"))
        if oracle_steps:
            body.append(_diff_plot(series))
    elif not series:
        body.append("<p>(no per-step layer in this scenario)</p>")
    body.append("<table class='verdicts'><tr><th>engine</th><th>role</th><th>row</th><th>verdict</th>"
                "<th>layers judged</th><th>not judged</th></tr>")
    for cell in cells:
        v = cell.verdict
        body.append(f"<tr><td><code>{_h(v.engine)}</code></td><td>{_h(v.role)}</td>"
                    f"<td>{_h(cell.row)}</td><td class='{_h(cell.status)}'>{_h(cell.status)}</td>"
                    f"<td>{_h(', '.join(v.judged) or '-')}</td><td>{_h(_not_judged(v))}</td></tr>")
    body.append("</table>")
    for cell in cells:
        v = cell.verdict
        if v.kind == PASS:
            continue
        opened = "" if v.declined else " open"  # not run for a feature not declared: no failure
        body.append(f"<details id='{_anchor(scenario, v.engine)}'{opened}><summary>{_h(v.engine)}: "
                    f"{_h(cell.status)} {_h(cell.where)}</summary>")
        if cell.waiver is not None:
            body.append(f"<p class='waiver'>waived by {_h(cell.waiver.name)} {_h(waiver_words(cell.waiver))}</p>")
        steps_c = next((c for c in v.comparisons if c.layer == layer and not c.equal), None)
        own = next((s for label, s, _ in series if label == v.engine), None)
        if steps_c is not None and oracle_steps and own:
            body.append(_plot([series[0], (v.engine, own, steps_c.index)],
                              f"zoom: steps around the first divergence (step {steps_c.index}), "
                              "tokens near its values", "plot-zoom",
                              window=(max(0, steps_c.index - ZOOM), steps_c.index + ZOOM + 1),
                              focus=steps_c.index, clip=_anchor(scenario, v.engine) + "-zoom"))
        for c in v.comparisons:
            if not c.equal and isinstance((_record(c.record) or _record(c.actual_record)).get("requests"), dict):
                body.append(f"<div class='scroll'>{_request_table(c)}</div>")  # scrolls in its box
                break
        body.append(_capacity_table(v))
        body.append(f"<pre>{_h(render_verdict(v, view.oracle), lines=True)}</pre></details>")
    body.append("</section>")
    return body


def _features_table(view: GateView) -> list[str]:
    """The per-feature table: per engine, the scenarios needing each feature that passed / ran."""
    if not view.features:
        return []
    body = [f"<p class='features'>{_h(FEATURES_HEAD[0].upper() + FEATURES_HEAD[1:])}.</p>",
            "<table class='features'><tr><th>feature</th>" + "".join(
                f"<th><code>{_h(e)}</code></th>" for e in view.engines) + "</tr>"]
    for row in view.features:
        body.append(f"<tr><th title='{_h(row.meaning)}'><code>{_h(row.label)}</code></th>" + "".join(
            f"<td>{_h(row.cells[e].text)}</td>" for e in view.engines) + "</tr>")
    body.append("</table>")
    return body


def _not_judged(v: Verdict) -> str:
    return "; ".join(f"{layer}: {REASONS.get(reason, reason)}" for layer, reason in v.not_judged.items()) or "-"


def _anchor(scenario: str, engine: str | None = None) -> str:
    text = scenario if engine is None else f"{scenario}--{engine}"
    return "s-" + re.sub(r"[^A-Za-z0-9_-]+", "_", text)


def _h(value, lines: bool = False) -> str:
    """The one escape of the page: any value as HTML text or an attribute's value (quotes
    escaped), its control characters and newlines shown as escapes (view.visible); with
    `lines`, a block of text for <pre>, its newlines kept."""
    return html.escape((visible_lines if lines else visible)(str(value)))


def _record(record) -> dict:
    """A record as the page reads it: one that is not an object reads as empty."""
    return record if isinstance(record, dict) else {}


def _steps(trace: Trace | None) -> tuple[str, list[dict]]:
    """The per-step layer of a trace: the whole engine's where it ran, else the stand-in's."""
    layers = trace.layers if trace is not None else {}
    for layer in ("engine_steps", "steps"):
        if layers.get(layer) and isinstance(layers[layer], list):
            return layer, [_record(r) for r in layers[layer]]
    return "steps", []


def _count(value) -> int | float | None:
    """A count as the plots draw it: a finite number in the 64-bit range, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if abs(value) < 2 ** 63 and value == value else None  # NaN != NaN


def _tokens(steps: list[dict]) -> list[int]:
    return [_count(s.get("total_num_scheduled_tokens", 0)) or 0 for s in steps]


def _budgets(steps: list[dict]) -> list[int | None]:
    return [s.get("token_budget") if isinstance(s.get("token_budget"), int) and _count(s.get("token_budget")) is not None
            else None for s in steps]


def _frame(w: int, h: int, pad: int, lo: int, hi: int, bottom: float, top: float, title: str, cls: str,
           extra_height: int):
    x = lambda i: pad + (w - 2 * pad) * (i - lo) / max(hi - 1 - lo, 1)  # noqa: E731
    y = lambda v: h - pad - (h - 2 * pad) * (v - bottom) / ((top - bottom) or 1)  # noqa: E731
    parts = [f"<svg class='{cls}' xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h + extra_height}' "
             f"role='img' aria-label='{_h(title)}'>",
             f"<line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#888'/>",
             f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{h - pad}' stroke='#888'/>",
             f"<text x='{pad}' y='{pad - 22}' font-size='13'>{_h(title)}</text>",
             f"<text x='{pad - 4}' y='{pad + 4}' font-size='11' text-anchor='end'>{top:g}</text>",
             f"<text x='{pad - 4}' y='{h - pad + 4}' font-size='11' text-anchor='end'>{bottom:g}</text>",
             f"<text x='{pad}' y='{h - pad + 16}' font-size='11'>step {lo}</text>",
             f"<text x='{w - pad}' y='{h - pad + 16}' font-size='11' text-anchor='end'>step {hi - 1}</text>"]
    return x, y, parts


def _polyline(points: list[tuple[float, float]], color: str, cls: str, dash: str = "") -> str:
    text = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    dash = f" stroke-dasharray='{dash}'" if dash else ""
    return f"<polyline class='{cls}' fill='none' stroke='{color}' stroke-width='1.5'{dash} points='{text}'/>"


def _plot(series: list[tuple[str, list[dict], int | None]], title: str, cls: str,
          window: tuple[int, int] | None = None, focus: int | None = None, clip: str = "") -> str:
    """Scheduled tokens per step (solid for the oracle, dashed for candidates), each engine's
    token budget as a dotted line of the same colour with its value at the right, first
    divergences marked. With `focus`, the token axis spans only the values at that step
    (a zoom; lines leaving it are clipped)."""
    w, h, pad = 1000, 300, 50
    n = max(len(s) for _, s, _ in series) or 1
    lo, hi = window or (0, n)
    hi = min(hi, n)
    near = [v for _, s, _ in series if focus is not None and focus < len(s)
            for v in (_tokens(s)[focus], _budgets(s)[focus]) if v is not None]
    if near:
        margin = max(8.0, 0.3 * (max(near) - min(near)))
        bottom, top = max(0.0, min(near) - margin), max(near) + margin
    else:
        values = [v for _, s, _ in series for v in _tokens(s)[lo:hi] + [b for b in _budgets(s)[lo:hi] if b]]
        bottom, top = 0, max(values or [1]) or 1
    x, y, parts = _frame(w, h, pad, lo, hi, bottom, top, title, cls, 34 * len(series))
    if clip:
        parts.append(f"<clipPath id='{clip}'><rect x='{pad}' y='{pad}' width='{w - 2 * pad}' "
                     f"height='{h - 2 * pad}'/></clipPath><g clip-path='url(#{clip})'>")
    ends: list[tuple[float, int, str]] = []  # each budget line's last value, labelled at the right
    for i, (label, steps, first) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        tokens = _tokens(steps)
        parts.append(_polyline([(x(j), y(tokens[j])) for j in range(lo, min(hi, len(tokens)))], color,
                               "tokens", "" if i == 0 else "6 3"))
        budgets = _budgets(steps)
        drawn = [(j, budgets[j]) for j in range(lo, min(hi, len(budgets))) if budgets[j] is not None]
        if drawn:
            parts.append(_polyline([(x(j), y(b)) for j, b in drawn], color, "budget", "2 3"))
            ends.append((y(drawn[-1][1]), drawn[-1][1], color))
        if focus is not None and focus < len(tokens):  # the values at the divergence, marked
            parts.append(f"<circle class='marker' cx='{x(focus):.1f}' cy='{y(tokens[focus]):.1f}' r='4' "
                         f"fill='{color}'/><text class='marker-value' x='{x(focus) + 8:.1f}' "
                         f"y='{y(tokens[focus]) + 16:.1f}' font-size='12' fill='{color}'>"
                         f"{_h(tokens[focus])} scheduled</text>")
    if clip:
        parts.append("</g>")
    parts += _budget_values(sorted(ends), w - pad, pad)
    for i, (label, steps, first) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        shown = sorted({b for b in _budgets(steps)[lo:hi] if b is not None})
        budget = (f"token budget {shown[0]}" if len(shown) == 1 else
                  f"token budget {shown[0]}..{shown[-1]}" if shown else "no token budget recorded")
        parts.append(f"<text class='legend' x='{pad}' y='{h + 14 + 34 * i}' font-size='12' fill='{color}'>"
                     f"{_h(label)}: scheduled tokens ({'solid' if i == 0 else 'dashed'})</text>")
        parts.append(f"<text class='budget-label' x='{pad + 20}' y='{h + 28 + 34 * i}' font-size='12' "
                     f"fill='{color}'>{_h(budget)} (dotted)</text>")
        if first is not None and lo <= first < hi:
            parts.append(f"<line x1='{x(first):.1f}' y1='{pad}' x2='{x(first):.1f}' y2='{h - pad}' "
                         "stroke='#c22' stroke-width='2' stroke-opacity='0.5'/>")
            if focus is None:  # a zoom names its step in its title, its values at the markers
                parts.append(f"<text class='divergence' x='{x(first) + 4:.1f}' y='{h - pad - 8 - 14 * i}' "
                             f"font-size='12' fill='#c22'>first divergence: step {_h(first)} ({_h(label)})</text>")
    parts.append("</svg>")
    return "".join(parts)


LABEL_GAP = 13  # px between two budget values at the right of a plot: one line of 11 px text


def _budget_values(ends: list[tuple[float, int, str]], right: float, pad: int) -> list[str]:
    """Each budget line's value at the right end of its line, top to bottom. Lines closer than
    a label's height (4036 and 4096 are 3 px apart on a 0..4096 axis) get their values moved
    apart, each tied to its line by a short leader, and the plot says how close they are."""
    parts, last, close = [], None, []
    for at, value, color in ends:
        placed = at if last is None else max(at, last + LABEL_GAP)
        if placed != at:
            parts.append(f"<line class='budget-leader' x1='{right:.1f}' y1='{at:.1f}' x2='{right + 3:.1f}' "
                         f"y2='{placed:.1f}' stroke='{color}'/>")
        parts.append(f"<text class='budget-value' x='{right + 4}' y='{placed + 4:.1f}' font-size='11' "
                     f"fill='{color}'>{_h(value)}</text>")
        last = placed
    for (a, low, _), (b, high, _) in zip(ends, ends[1:]):
        if b - a < LABEL_GAP and low != high:
            close.append(f"{_h(low)} and {_h(high)} are {b - a:.0f} px apart")
    if close:
        parts.append(f"<text class='budget-note' x='{pad}' y='{pad - 8}' font-size='11' fill='#555'>budget lines "
                     f"{'; '.join(close)}: their values are labelled apart at the right</text>")
    return parts


def _diff_plot(series: list[tuple[str, list[dict], int | None]]) -> str:
    """Per step: each candidate's scheduled tokens minus the oracle's (steps both have)."""
    w, h, pad = 1000, 200, 50
    oracle = _tokens(series[0][1])
    diffs = [(label, [a - b for a, b in zip(_tokens(steps), oracle)], len(steps))
             for label, steps, _ in series[1:]]
    n = max([len(d) for _, d, _ in diffs] + [1])
    values = [v for _, d, _ in diffs for v in d] + [0]
    bottom, top = min(values), max(values)
    if bottom == top:
        bottom, top = bottom - 1, top + 1
    x, y, parts = _frame(w, h, pad, 0, n, bottom, top, "difference per step: candidate minus oracle "
                         "(scheduled tokens)", "plot-diff", 18 * len(diffs))
    parts.append(f"<line x1='{pad}' y1='{y(0):.1f}' x2='{w - pad}' y2='{y(0):.1f}' stroke='#bbb'/>")
    for i, (label, d, length) in enumerate(diffs, 1):
        color = COLORS[i % len(COLORS)]
        parts.append(_polyline([(x(j), y(v)) for j, v in enumerate(d)], color, "difference"))
        nonzero = [v for v in d if v]
        text = (f"{label}: {len(nonzero)} of {len(d)} steps differ, from {min(nonzero):+d} to {max(nonzero):+d}"
                if nonzero else f"{label}: no difference in scheduled tokens")
        if length != len(oracle):
            text += f"; {length} steps against the oracle's {len(oracle)}"
        parts.append(f"<text class='legend' x='{pad}' y='{h + 14 + 18 * (i - 1)}' font-size='12' "
                     f"fill='{color}'>{_h(text)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _request_table(c) -> str:
    """Every request's counts at the first divergent step, oracle beside candidate: what was
    scheduled, then the state after the update; newly admitted and resumed requests marked;
    then the step's budgets, KV blocks and queues."""
    e_rec, a_rec = _record(c.record), _record(c.actual_record)
    e_reqs = _record(e_rec.get("requests"))
    a_reqs = _record(a_rec.get("requests"))
    entries = [r for r in [*e_reqs.values(), *a_reqs.values()] if isinstance(r, dict)]
    fields = [f for f in REQUEST_FIELDS if f in ("tokens", "draft_tokens") or any(f in r for r in entries)]
    step = (e_rec or a_rec).get("step", c.index)
    names = "".join(f"<th>{f}</th>" for f in fields)
    rows = [f"<table class='per-request'><caption>every request at step {_h(step)} ({_h(c.layer)}); "
            "computed_tokens, output_tokens and kv_blocks after the step's update</caption>"
            f"<tr><th></th><th colspan='{len(fields) + 1}'>oracle</th>"
            f"<th colspan='{len(fields) + 1}'>candidate</th></tr>"
            f"<tr><th>request</th><th>admitted</th>{names}<th>admitted</th>{names}</tr>"]
    for rid in sorted(set(e_reqs) | set(a_reqs)):
        e, a = _record(e_reqs.get(rid)), _record(a_reqs.get(rid))
        e_mark, a_mark = _admitted(e_rec, rid), _admitted(a_rec, rid)
        differs = e_mark != a_mark or any(e.get(f) != a.get(f) for f in fields)
        cells = (f"<td>{e_mark}</td>" + "".join(f"<td>{_num(e.get(f))}</td>" for f in fields)
                 + f"<td class='{'diff' if e_mark != a_mark else ''}'>{a_mark}</td>" + "".join(
                     f"<td class='{'diff' if e.get(f) != a.get(f) else ''}'>{_num(a.get(f))}</td>" for f in fields))
        rows.append(f"<tr class='{'differs' if differs else 'same'}'><td>{_h(rid)}</td>{cells}</tr>")
    span = len(fields) + 1
    for key in ("total_num_scheduled_tokens", "token_budget", "input_budget", "kv_blocks", "waiting", "running"):
        e, a = e_rec.get(key), a_rec.get(key)
        if e is not None or a is not None:
            rows.append(f"<tr class='{'differs' if e != a else 'same'}'><td><i>{key}</i></td>"
                        f"<td colspan='{span}'>{_state(e)}</td><td colspan='{span}'>{_state(a)}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


# Per request at a step: what schedule() gave it, then its state after the update.
REQUEST_FIELDS = ("tokens", "draft_tokens", "accepted_draft_tokens", "computed_tokens", "output_tokens",
                  "kv_blocks")


def _admitted(record: dict, rid: str) -> str:
    """`new` or `resumed` where that side admitted the request at this step, else empty."""
    return next((key for key in ("new", "resumed") if isinstance(record.get(key), list) and rid in record[key]), "")


def _state(value) -> str:
    if isinstance(value, dict):  # kv_blocks
        return _h(", ".join(f"{k} {value[k]}" for k in ("free", "used") if k in value))
    if isinstance(value, list):  # a queue, in its order
        return _h(" ".join(str(v) for v in value)) or "(empty)"
    return _num(value)


def _capacity_table(v: Verdict) -> str:
    """Forwards above max_num_batched_tokens, candidate and oracle (engine layers only)."""
    if not any(c.layer == "engine_steps" for c in v.comparisons):
        return ""
    rows = ["<table class='capacity'><caption>capacity check: forwards above max_num_batched_tokens"
            "</caption><tr><th>engine</th><th>step</th><th>forward</th><th>tokens</th><th>limit</th>"
            "<th>excess</th></tr>"]
    for who, excess in (("candidate", v.capacity), ("oracle", v.oracle_capacity)):
        for e in excess[:20]:
            rows.append(f"<tr><td>{who}</td><td>{_h(e['step'])}</td><td>{_h(e['forward'])}</td>"
                        f"<td>{_h(e['tokens'])}</td><td>{_h(e['limit'])}</td><td>{_h(e['excess'])}</td></tr>")
        if not excess:
            rows.append(f"<tr><td>{who}</td><td colspan='5'>no forward above max_num_batched_tokens</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _num(value) -> str:
    return "-" if value is None else _h(value)
