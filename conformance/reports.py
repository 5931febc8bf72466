"""The gate's three reports from one run: JUnit XML, a markdown summary, a self-contained HTML.

The HTML has, per scenario, a plot of scheduled tokens per step for the oracle and each
candidate, with the first divergence marked. Inline SVG: no script, nothing fetched.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree as ET

from .gate import GateResult, where_of
from .report import render_verdict
from .verdict import DIVERGED, KINDS, NUMERICS, ORACLE, PASS, Verdict

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def write_reports(out: Path, result: GateResult, traces: dict, oracle: str) -> list[Path]:
    """traces: (engine label, scenario) -> (trace, golden or None)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "junit.xml", out / "summary.md", out / "report.html"]
    paths[0].write_text(junit(result, oracle))
    paths[1].write_text(markdown(result, oracle))
    paths[2].write_text(html_report(result, traces, oracle))
    return paths


def _status(result: GateResult, v: Verdict) -> str:
    if v.kind == DIVERGED and id(v) in result.waived:
        return "waived"
    return v.kind


def junit(result: GateResult, oracle: str) -> str:
    suites = ET.Element("testsuites", name="vllm-parity")
    for row, verdicts in result.by_row().items():
        suite = ET.SubElement(suites, "testsuite", name=row, tests=str(len(verdicts)))
        failures = errors = skipped = 0
        for v in verdicts:
            case = ET.SubElement(suite, "testcase", classname=f"{row}.{v.scenario}", name=v.engine)
            status = _status(result, v)
            text = render_verdict(v, oracle)
            if status == PASS:
                continue
            if status == NUMERICS and v.role != ORACLE:  # passes; what arithmetic explained is kept
                ET.SubElement(case, "system-out").text = text
                continue
            if status == "waived" or not v.gating:
                skipped += 1
                reason = (f"waived: {result.waived[id(v)].reason}" if status == "waived"
                          else f"informational stand-in: {v.kind}")
                ET.SubElement(case, "skipped", message=reason).text = text
            elif v.kind in (DIVERGED, NUMERICS):  # NUMERICS here: the oracle, not byte for byte
                failures += 1
                ET.SubElement(case, "failure", type="divergence", message=where_of(v)).text = text
            else:
                errors += 1
                ET.SubElement(case, "error", type=v.kind, message=v.message[:200]).text = text
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def markdown(result: GateResult, oracle: str) -> str:
    verdict_word = {0: "PASS", 1: "FAIL (unwaived divergence or expired waiver)",
                    2: "ERROR (a gating run could not be compared)"}[result.status]
    lines = [f"## vllm-parity gate: {verdict_word}", "",
             f"Oracle: vLLM {oracle}. Exit status {result.status}.", "",
             "| row | scenario | engine | role | verdict | first divergence |",
             "|---|---|---|---|---|---|"]
    for row, verdicts in result.by_row().items():
        for v in verdicts:
            lines.append(f"| {row} | {v.scenario} | `{v.engine}` | {v.role} | {_status(result, v)} | "
                         f"{_md(_first_line(v))} |")
    counts = Counter(_status(result, v) for v in result.verdicts)
    lines += ["", "Counts: " + ", ".join(f"{counts[k]} {k}" for k in KINDS + ("waived",) if counts[k])]
    for w in result.expired:
        lines.append(f"- **expired waiver** {w.row} / {w.scenario} / `{w.field}` (owner {w.owner}, "
                     f"expired {w.expires}): renew or remove it")
    for w in result.unused:
        lines.append(f"- unused waiver {w.row} / {w.scenario} / `{w.field}` (owner {w.owner})")
    return "\n".join(lines) + "\n"


def _first_line(v: Verdict) -> str:
    for c in v.comparisons:
        if not c.equal and c.first is not None:
            f = c.first
            return f"{c.layer} #{c.index} `{f.path}`: oracle {f.expected!r}, candidate {f.actual!r}"
    return v.message.splitlines()[0] if v.message else ""


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def html_report(result: GateResult, traces: dict, oracle: str) -> str:
    body = [f"<h1>vllm-parity gate: exit status {result.status}</h1>",
            f"<p>Oracle: vLLM {html.escape(oracle)}.</p>"]
    by_scenario: dict[str, list[Verdict]] = {}
    for v in result.verdicts:
        by_scenario.setdefault(v.scenario, []).append(v)
    for scenario, verdicts in by_scenario.items():
        body.append(f"<h2>{html.escape(scenario)}</h2>")
        golden = next((g for v in verdicts if (g := traces.get((v.engine, scenario), (None, None))[1])), None)
        series, marks = [], []
        if golden and _steps(golden)[1]:
            series.append((f"oracle vllm-{oracle} (golden)", _tokens(_steps(golden)[1])))
        for v in verdicts:
            trace = traces.get((v.engine, scenario), (None, None))[0]
            layer, steps = _steps(trace or {})
            if steps and v.role != "oracle":
                series.append((v.engine, _tokens(steps)))
                c = next((c for c in v.comparisons if c.layer == layer and not c.equal), None)
                if c is not None:
                    marks.append((c.index, v.engine))
        if len(series) > 1 or (series and marks):
            body.append(_svg(series, marks))
        elif not series:
            body.append("<p>(no per-step layer in this scenario)</p>")
        body.append("<table><tr><th>engine</th><th>role</th><th>row</th><th>verdict</th></tr>")
        for v in verdicts:
            body.append(f"<tr><td><code>{html.escape(v.engine)}</code></td><td>{v.role}</td>"
                        f"<td>{result.row_of(v)}</td><td class='{_status(result, v)}'>{_status(result, v)}</td></tr>")
        body.append("</table>")
        for v in verdicts:
            if v.kind != PASS:
                body.append(f"<details><summary>{html.escape(v.engine)}: {v.kind}</summary>"
                            f"<pre>{html.escape(render_verdict(v, oracle))}</pre></details>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{padding:2px 8px}"
             ".pass{color:#2a2}.numerics{color:#27a}.diverged{color:#c22}.waived{color:#a80}pre{background:#f6f6f6;"
             "padding:8px;overflow-x:auto}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>vllm-parity gate</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def _steps(trace: dict) -> tuple[str, list[dict]]:
    """The per-step layer of a trace: the whole engine's where it ran, else the stand-in's."""
    layers = trace.get("layers", {})
    for layer in ("engine_steps", "steps"):
        if layers.get(layer):
            return layer, layers[layer]
    return "steps", []


def _tokens(steps: list[dict]) -> list[int]:
    return [s.get("total_num_scheduled_tokens", 0) for s in steps]


def _svg(series: list[tuple[str, list[int]]], marks: list[tuple[int, str]]) -> str:
    w, h, pad = 1000, 300, 40
    n = max(len(s) for _, s in series) or 1
    top = max(max(s or [0]) for _, s in series) or 1
    x = lambda i: pad + (w - 2 * pad) * i / max(n - 1, 1)  # noqa: E731
    y = lambda v: h - pad - (h - 2 * pad) * v / top  # noqa: E731
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h + 20 * len(series)}' "
             "role='img' aria-label='scheduled tokens per step'>",
             f"<line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#888'/>",
             f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{h - pad}' stroke='#888'/>",
             f"<text x='{pad}' y='{pad - 8}' font-size='12'>scheduled tokens per step (max {top})</text>",
             f"<text x='{w - pad}' y='{h - pad + 16}' font-size='12' text-anchor='end'>step {n - 1}</text>"]
    for i, (label, values) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{x(j):.1f},{y(v):.1f}" for j, v in enumerate(values))
        dash = "" if i == 0 else " stroke-dasharray='6 3'"
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.5'{dash} points='{points}'/>")
        parts.append(f"<text x='{pad}' y='{h + 14 + 20 * i}' font-size='12' fill='{color}'>"
                     f"{html.escape(label)}</text>")
    for i, (step, engine) in enumerate(marks):
        parts.append(f"<line x1='{x(step):.1f}' y1='{pad}' x2='{x(step):.1f}' y2='{h - pad}' "
                     "stroke='#c22' stroke-width='2'/>")
        parts.append(f"<text x='{x(step) + 4:.1f}' y='{pad + 12 + 14 * i}' font-size='12' fill='#c22'>"
                     f"first divergence: step {step} ({html.escape(engine)})</text>")
    parts.append("</svg>")
    return "".join(parts)
