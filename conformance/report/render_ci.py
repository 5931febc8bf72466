"""The gate's reports for CI: JUnit XML, and a markdown summary (GitHub's step summary, the
Buildkite annotation).

Each format escapes in one place: JUnit's every text and attribute is made visible
(view.visible) once the tree is built, so a candidate's control characters, which XML 1.0
cannot hold, are shown as escapes and the file parses; ElementTree escapes the markup. In
markdown every value goes through `_text` or `_code`, so a candidate's name or message cannot
add a heading, HTML, a link, an image or emphasis, nor break a table.
"""

from __future__ import annotations

import re
from collections import Counter
from xml.etree import ElementTree as ET

from conformance.formats.kinds import Kind
from conformance.judging.verdict import MISSING, ORACLE, PASS
from conformance.report.render_text import likely_cause, render_pin_tables, render_verdict, shown_pair, to_fix
from conformance.report.view import (FEATURES_HEAD, REASONS, FirstLine, GateView, visible, visible_lines,
                                     waiver_words)


def junit(view: GateView) -> str:
    """One test case per verdict and layer, named `row / scenario / engine / layer` so CI
    views group them; a run that could not be compared is one case for all its layers."""
    suites = ET.Element("testsuites", name="vllm-parity")
    properties = ET.SubElement(suites, "properties")
    ET.SubElement(properties, "property", name="judged", value=view.judged)  # the first line's clause
    ET.SubElement(properties, "property", name="layers", value=view.layers)
    for row in view.features:  # the per-feature table: per engine, passed / ran (FEATURES_HEAD)
        ET.SubElement(properties, "property", name=f"feature {row.label}",
                      value="; ".join(f"{e}: {row.cells[e].text}" for e in view.engines))
    for row, cells in view.requirement_rows.items():
        suite = ET.SubElement(suites, "testsuite", name=row)
        counts = Counter()
        for cell in cells:
            _cases(suite, row, cell, view.oracle, counts)
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
    _visible_tree(suites)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _cases(suite: ET.Element, row: str, cell, oracle: str, counts: Counter) -> None:
    """A verdict's test cases under its requirement row: one per layer compared (or one for all
    its layers when it could not be compared), one per layer not judged; counted in `counts`."""
    from conformance.judging.numerics import NUMERICS_CAUSES

    v, status = cell.verdict, cell.status
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
        if status == "waived" or not v.gating or v.declined:
            counts["skipped"] += 1
            reason = (f"waived by {cell.waiver.name} {waiver_words(cell.waiver)}" if status == "waived" else
                      v.message if v.declined else f"informational stand-in: {v.kind}")
            ET.SubElement(case, "skipped", message=reason).text = text
        elif c is not None:
            counts["failures"] += 1
            first = cell.where
            if c.first:  # where, and both values
                said, expected, actual = shown_pair(c.first.expected, c.first.actual)
                first = (f"{c.layer}.{c.first.path} at {c.where}: {said}oracle {expected}, "
                         f"candidate {actual}")
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
            ET.SubElement(case, "error", type=Kind.UNSUPPORTED, message=said).text = text
        else:
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message=said)


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
    grid, then one table row per verdict that did not pass. Every value interpolated goes
    through `_text` (markdown text) or `_code` (a code span)."""
    lines = [f"## vllm-parity gate: {view.explained}", "",
             f"Oracle: vLLM {_text(view.oracle)}. Exit status {view.status}. Judged: {_text(view.judged)}.", ""]
    lines += _to_fix(view)
    lines += ["### The grid", "", f"Layers: {_text(view.layers)}.", ""]
    lines += [f"- {_code(label)}: command {_code(command)}" for label, command in view.commands.items()]
    if view.judged_groups:
        lines += ["", "| engine | layers judged and not judged | scenarios |", "|---|---|---|"]
        lines += [f"| {_code(g['engine'], table=True)} | {_text(g['text'])} | {len(g['scenarios'])}: "
                  f"{_text(', '.join(g['scenarios']))} |" for g in view.judged_groups]
    lines += ["", "| scenario | " + " | ".join(f"{_code(e, table=True)} ({view.roles[e]})" for e in view.engines) + " |",
              "|---|" + "---|" * len(view.engines)]
    for s in view.scenarios:
        row = [_text(c.text) if (c := view.cell(s, e)) else "-" for e in view.engines]
        lines.append(f"| {_text(s)} | " + " | ".join(row) + " |")
    if view.features:
        lines += ["", _text(FEATURES_HEAD[0].upper() + FEATURES_HEAD[1:].replace("`", "")) + ".", "",
                  "| feature | " + " | ".join(_code(e, table=True) for e in view.engines) + " |",
                  "|---|" + "---|" * len(view.engines)]
        lines += [f"| {_code(row.label, table=True)} | " + " | ".join(_text(row.cells[e].text) for e in view.engines)
                  + " |" for row in view.features]
    # a scenario not run for a feature the engine does not declare, not required: its cell says it
    failing = [(row, c) for row, cells in view.requirement_rows.items() for c in cells
               if c.verdict.kind != PASS and not c.verdict.declined]
    if failing:
        lines += ["", "| row | scenario | engine | role | verdict | first divergence |",
                  "|---|---|---|---|---|---|"]
        for row, c in failing:
            v = c.verdict
            lines.append(f"| {_text(row)} | {_text(v.scenario)} | {_code(v.engine, table=True)} | {v.role} | "
                         f"{c.status} | {_first_line(c.first_line)} |")
    lines += ["", f"Counts: {_text(view.count_line())}"]
    for w in view.expired:
        lines.append(f"- **expired waiver** {_text(w.row)} / {_text(w.scenario)} / {_code(w.field)} "
                     f"(owner {_text(w.owner)}, expired {w.expires}): renew or remove it")
    for w, cells in view.applied():
        lines.append(f"- waiver applied: {_text(w.row)} / {_text(w.scenario)} / {_code(w.field)} to "
                     f"{', '.join(_code(c.verdict.engine) for c in cells)} (owner {_text(w.owner)}, expires "
                     f"{w.expires}): {_text(w.reason)}")
    for w in view.unused:
        lines.append(f"- unused waiver {_text(w.row)} / {_text(w.scenario)} / {_code(w.field)} (owner {_text(w.owner)}): "
                     f"{_text(view.why_unused.get(w, ''))}")
    if view.drift is not None:  # as the terminal shows them, in a fence longer than any backtick run in them
        text = visible_lines(render_pin_tables(view))
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
        lines += ["", "### Drift across pins and per-pin tables", "", fence + "text", text, fence]
    return "\n".join(lines) + "\n"


def _to_fix(view: GateView) -> list[str]:
    """What to fix, first, for a pull request's reader: one table row per gating cell that did
    not pass (alike ones together, as the terminal groups them), its first divergence with both
    values and the likely cause; then each block as the terminal prints it (the requests'
    states at that step), in a fence."""
    blocks = to_fix(view)
    if not blocks:
        return []
    groups = view.to_fix()
    lines = ["### What to fix: first divergences", ""]
    if groups:
        lines += ["| scenario | engine | verdict | layer | where | field | oracle | candidate | likely cause |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for alike in groups[:MD_ROWS]:
            c = alike[0]
            h, v = c.headline, c.verdict
            status = c.status + (f"+{v.failure}" if v.failure else "")
            scenario = _text(v.scenario) + (f" and {len(alike) - 1} more alike" if len(alike) > 1 else "")
            if h is None:
                lines.append(f"| {scenario} | {_code(v.engine, table=True)} | {status} | | | | | | "
                             f"{_text(c.first_line.message)} |")
                continue
            f = h.first
            said, expected, actual = shown_pair(f.expected, f.actual)
            lines.append(f"| {scenario} | {_code(v.engine, table=True)} | {status} | {_text(h.layer)} | "
                         f"{_text(h.where)} | {_code(f.path, table=True)}{(' ' + _text(said.rstrip(': '))) if said else ''} | "
                         f"{_text(expected)} | {_text(actual)} | {_text(likely_cause(h))}"
                         + (f" (config differs only in {_text(', '.join(c.bookkeeping))})" if c.bookkeeping else "")
                         + " |")
        if len(groups) > MD_ROWS:
            lines.append(f"| {len(groups) - MD_ROWS} more kinds | | | | | | | | the grid below |")
        lines += ["", "The same with the requests' states at each step, as the terminal shows them:", ""]
    text = visible_lines("\n".join(blocks))
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return lines + [fence + "text", text, fence, ""]


MD_ROWS = 30  # rows of the first-divergence table (the grid and the terminal's details hold the rest)


def _first_line(f: FirstLine) -> str:
    """`steps #3 `requests.r1.tokens`: oracle 1036, candidate 1096`, each part escaped, the
    values as the terminal shows them (JSON: `null`, never Python's `None`)."""
    if not f.layer:
        return _text(f.message)
    said, expected, actual = shown_pair(f.expected, f.actual)
    return (f"{_text(f.layer)} #{f.index} {_code(f.path, table=True)}: {_text(said)}oracle {_text(expected, 100)}, "
            f"candidate {_text(actual, 100)}")


# Markdown text: the characters that open something inline (emphasis, code, HTML, entities,
# tables, strikethrough, GitHub's math) are backslash-escaped. Nothing interpolated starts a
# line, and newlines are escaped, so headings, lists and quotes cannot start either.
MD_ESCAPED = set("\\`*~<&|$")
MD_CUT = 300  # characters of one value shown


def _text(text: str, cut: int = MD_CUT) -> str:
    """A value as markdown text: made visible, cut, then escaped (never cut after escaping:
    a trailing backslash would escape the table's next `|`). `_` is escaped unless it sits
    inside a word, where CommonMark gives it no meaning; `]` before `(` or `[` so no link or
    image can close."""
    text = visible(text)[:cut]
    out = []
    for i, c in enumerate(text):
        before, after = text[i - 1:i], text[i + 1:i + 2]
        if (c in MD_ESCAPED or (c == "_" and not (before.isalnum() and after.isalnum()))
                or (c == "]" and after in ("(", "["))):
            out.append("\\")
        out.append(c)
    return "".join(out)


def _code(text: str, table: bool = False) -> str:
    """A value as a code span: made visible and cut; fenced by one backtick more than its
    longest run of backticks (padded where it starts or ends with one); in a table, `|` as
    `\\|`, which GFM reads back as `|` even inside a code span."""
    text = visible(text)[:MD_CUT]
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip()) else ""
    if table:
        text = text.replace("|", "\\|")
    return f"{fence}{pad}{text}{pad}{fence}"
