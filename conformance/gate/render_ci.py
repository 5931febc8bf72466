"""The gate's reports for CI: JUnit XML, and a markdown summary (GitHub's step summary, the
Buildkite annotation)."""

from __future__ import annotations

from collections import Counter
from xml.etree import ElementTree as ET

from .render_text import REASONS, cell, layer_groups, layers_headline, matrix, render_verdict, status_of
from .requirement_rows import GateResult, where_of
from .verdict import KINDS, MISSING, ORACLE, PASS, Verdict


def junit(result: GateResult, oracle: str) -> str:
    """One test case per verdict and layer, named `row / scenario / engine / layer` so CI
    views group them; a run that could not be compared is one case for all its layers."""
    from ..numerics import NUMERICS_CAUSES

    suites = ET.Element("testsuites", name="vllm-parity")
    properties = ET.SubElement(suites, "properties")
    ET.SubElement(properties, "property", name="layers", value=layers_headline(result.verdicts))
    for row, verdicts in result.by_row().items():
        suite = ET.SubElement(suites, "testsuite", name=row)
        counts = Counter()
        for v in verdicts:
            status = status_of(result, v)
            text = render_verdict(v, oracle)
            layers = [(c.layer, c) for c in v.comparisons] or [("all layers", None)]
            for layer, c in layers:
                case = ET.SubElement(suite, "testcase", classname=row,
                                     name=f"{row} / {v.scenario} / {v.engine} / {layer}")
                counts["tests"] += 1
                if c is not None and c.equal:
                    continue
                numerics = c is not None and c.cause in NUMERICS_CAUSES
                if status == PASS or (numerics and not (v.role == ORACLE and v.same_build)):
                    if numerics:  # passes; what arithmetic explained is kept
                        ET.SubElement(case, "system-out").text = text
                    continue
                if status == "waived" or not v.gating:
                    counts["skipped"] += 1
                    reason = (f"waived: {result.waived[v.key].reason}" if status == "waived"
                              else f"informational stand-in: {v.kind}")
                    ET.SubElement(case, "skipped", message=reason).text = text
                elif c is not None:
                    counts["failures"] += 1
                    first = f"{c.layer}.{c.first.path}" if c.first else where_of(v)
                    ET.SubElement(case, "failure", type="divergence", message=first).text = text
                else:
                    counts["errors"] += 1
                    ET.SubElement(case, "error", type=v.kind, message=v.message[:200]).text = text
            for layer, reason in v.not_judged.items():  # a layer not judged is said, never passed
                case = ET.SubElement(suite, "testcase", classname=row,
                                     name=f"{row} / {v.scenario} / {v.engine} / {layer}")
                counts["tests"] += 1
                said = f"{layer} not judged: {REASONS.get(reason, reason)}"
                if reason == MISSING and v.gating:  # a required layer the engine does not serve
                    counts["errors"] += 1
                    ET.SubElement(case, "error", type="unsupported", message=said).text = text
                else:
                    counts["skipped"] += 1
                    ET.SubElement(case, "skipped", message=said)
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def markdown(result: GateResult, oracle: str, commands: dict[str, str] | None = None) -> str:
    """The summary for a pull request, $GITHUB_STEP_SUMMARY and a Buildkite annotation: the
    matrix, then one table row per verdict that did not pass."""
    verdict_word = {0: "PASS", 1: "FAIL (unwaived divergence or expired waiver)",
                    2: "ERROR (a gating run could not be compared)"}[result.status]
    scenarios, engines, cells = matrix(result)
    roles = {v.engine: v.role for v in result.verdicts}
    lines = [f"## vllm-parity gate: {verdict_word}", "",
             f"Oracle: vLLM {oracle}. Exit status {result.status}. Layers: {layers_headline(result.verdicts)}.", ""]
    lines += [f"- `{_md(label)}`: command `{_md(command)}`" for label, command in (commands or {}).items()]
    groups = layer_groups(result.verdicts)
    if groups:
        lines += ["", "| engine | layers judged and not judged | scenarios |", "|---|---|---|"]
        lines += [f"| `{_md(g['engine'])}` | {_md(g['text'])} | {len(g['scenarios'])}: "
                  f"{', '.join(g['scenarios'])} |" for g in groups]
    lines += ["", "| scenario | " + " | ".join(f"`{_md(e)}` ({roles[e]})" for e in engines) + " |",
              "|---|" + "---|" * len(engines)]
    for s in scenarios:
        row = [_md(cell(result, cells[(s, e)])) if (s, e) in cells else "-" for e in engines]
        lines.append(f"| {s} | " + " | ".join(row) + " |")
    failing = [(row, v) for row, verdicts in result.by_row().items() for v in verdicts if v.kind != PASS]
    if failing:
        lines += ["", "| row | scenario | engine | role | verdict | first divergence |",
                  "|---|---|---|---|---|---|"]
        for row, v in failing:
            lines.append(f"| {row} | {v.scenario} | `{_md(v.engine)}` | {v.role} | {status_of(result, v)} | "
                         f"{_md(_first_line(v))} |")
    counts = Counter(status_of(result, v) for v in result.verdicts)
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
