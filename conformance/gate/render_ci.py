"""The gate's reports for CI: JUnit XML, and a markdown summary (GitHub's step summary, the
Buildkite annotation).

Each format escapes in one place: JUnit's every text and attribute is made visible
(view.visible) once the tree is built, so a candidate's control characters, which XML 1.0
cannot hold, are shown as escapes and the file parses; ElementTree escapes the markup.
"""

from __future__ import annotations

from collections import Counter
from xml.etree import ElementTree as ET

from .render_text import render_verdict
from .verdict import KINDS, MISSING, ORACLE, PASS
from .view import REASONS, GateView, visible_lines


def junit(view: GateView) -> str:
    """One test case per verdict and layer, named `row / scenario / engine / layer` so CI
    views group them; a run that could not be compared is one case for all its layers."""
    from ..numerics import NUMERICS_CAUSES

    suites = ET.Element("testsuites", name="vllm-parity")
    properties = ET.SubElement(suites, "properties")
    ET.SubElement(properties, "property", name="layers", value=view.layers)
    for row, cells in view.requirement_rows.items():
        suite = ET.SubElement(suites, "testsuite", name=row)
        counts = Counter()
        for cell in cells:
            v, status = cell.verdict, cell.status
            text = render_verdict(v, view.oracle)
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
                    reason = (f"waived: {cell.waiver.reason}" if status == "waived"
                              else f"informational stand-in: {v.kind}")
                    ET.SubElement(case, "skipped", message=reason).text = text
                elif c is not None:
                    counts["failures"] += 1
                    first = f"{c.layer}.{c.first.path}" if c.first else cell.where
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
    _visible_tree(suites)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _visible_tree(root: ET.Element) -> None:
    """Every text and attribute of the tree made visible: the one place JUnit escapes what
    XML cannot hold (NUL, ESC, BEL, U+FFFE, lone surrogates) and what a reader should not obey."""
    for element in root.iter():
        if element.text:
            element.text = visible_lines(element.text)
        for key, value in list(element.attrib.items()):
            element.set(key, visible_lines(value))


def markdown(view: GateView) -> str:
    """The summary for a pull request, $GITHUB_STEP_SUMMARY and a Buildkite annotation: the
    grid, then one table row per verdict that did not pass."""
    lines = [f"## vllm-parity gate: {view.explained}", "",
             f"Oracle: vLLM {view.oracle}. Exit status {view.status}. Layers: {view.layers}.", ""]
    lines += [f"- `{_md(label)}`: command `{_md(command)}`" for label, command in view.commands.items()]
    if view.judged_groups:
        lines += ["", "| engine | layers judged and not judged | scenarios |", "|---|---|---|"]
        lines += [f"| `{_md(g['engine'])}` | {_md(g['text'])} | {len(g['scenarios'])}: "
                  f"{', '.join(g['scenarios'])} |" for g in view.judged_groups]
    lines += ["", "| scenario | " + " | ".join(f"`{_md(e)}` ({view.roles[e]})" for e in view.engines) + " |",
              "|---|" + "---|" * len(view.engines)]
    for s in view.scenarios:
        row = [_md(c.text) if (c := view.cell(s, e)) else "-" for e in view.engines]
        lines.append(f"| {s} | " + " | ".join(row) + " |")
    failing = [(row, c) for row, cells in view.requirement_rows.items() for c in cells if c.verdict.kind != PASS]
    if failing:
        lines += ["", "| row | scenario | engine | role | verdict | first divergence |",
                  "|---|---|---|---|---|---|"]
        for row, c in failing:
            v = c.verdict
            lines.append(f"| {row} | {v.scenario} | `{_md(v.engine)}` | {v.role} | {c.status} | "
                         f"{_md(c.first_line)} |")
    lines += ["", "Counts: " + ", ".join(f"{view.counts[k]} {k}" for k in KINDS + ("waived",) if view.counts[k])]
    for w in view.expired:
        lines.append(f"- **expired waiver** {w.row} / {w.scenario} / `{w.field}` (owner {w.owner}, "
                     f"expired {w.expires}): renew or remove it")
    for w in view.unused:
        lines.append(f"- unused waiver {w.row} / {w.scenario} / `{w.field}` (owner {w.owner})")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]
