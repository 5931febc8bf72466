"""Plain-text report of verdicts, fit for a terminal or a pull-request comment: one verdict in
full (`render_verdict`), a list of verdicts (`render`), and the gate's report from its view.

Every line is made visible (view.visible) as the report is put together (`_join`): the
candidate's text (its label, messages, stderr, record keys and values, log lines) keeps no
control character, so it cannot move the cursor, clear the screen, set the title or overwrite
the verdict line, and a newline of its own is shown as `\\n`, never starts a line."""

from __future__ import annotations

import json
import os
import textwrap
from collections import Counter

from conformance.formats.kinds import Kind
from conformance.formats.pins import pin_label
from conformance.judging.verdict import KINDS, PASS, Verdict
from conformance.report.drift import render_drift
from conformance.report.methods_table import render_methods_rows
from conformance.report.view import FEATURES_HEAD, MAX_ROWS, GateView, by_role, visible, waiver_words  # noqa: F401

MAX_EXPLAINED = 20


def render(verdicts: list[Verdict], oracle: str) -> str:
    parts = [render_verdict(v, oracle) for v in verdicts]  # each already made visible, line by line
    parts.append(visible(render_summary(verdicts)))
    return "\n".join(parts)


def _join(lines: list[str]) -> str:
    """The report's lines as text: each line made visible, so only these newlines remain."""
    return "\n".join(visible(line) for line in lines)


def render_verdict(v: Verdict, oracle: str, blocks: dict | None = None) -> str:
    """One verdict in full. `blocks`, shared across the verdicts of one report, numbers each
    distinct block of budget log lines: a block seen before is referred to, not repeated."""
    role = {"oracle": "oracle, must reproduce its golden", "candidate": "candidate",
            "stand-in": "stand-in candidate, informational"}[v.role]
    head = f"== {v.engine} [{role}] on {v.scenario} vs oracle {pin_label(oracle)} golden: {v.kind.upper()}"
    lines = [head]
    if v.message:
        lines += ["   " + line for line in v.message.splitlines()]
    for c in v.comparisons:
        if c.equal:
            lines.append(f"   layer {c.layer}: equal ({c.expected_count} records)")
            continue
        first = c.first
        cause = f" ({CAUSES.get(c.cause, c.cause)})" if c.cause else ""
        lines.append(f"   layer {c.layer}: first divergence at {c.where}, field {first.path}: "
                     f"oracle {_show(first.expected)}, candidate {_show(first.actual)}{cause}")
        if c.evidence:
            lines.append(f"   evidence: {c.evidence}")
        width = max(len(visible(f.path)) for f in c.fields)
        lines.append(f"     {'field'.ljust(width)}  {'oracle':>12}  {'candidate':>12}")
        for f in c.fields:
            if f.path == "budget_log_lines":
                continue  # shown whole, side by side, below
            lines.append(f"     {visible(f.path).ljust(width)}  {_show(f.expected):>12}  {_show(f.actual):>12}")
        lines += _refusals(c.record, c.actual_record)
        if v.role == "stand-in":
            continue  # informational: the first divergence and its fields are enough
        lines += _per_request(_record(c.record), _record(c.actual_record))
        if c.explanation and c.layer not in ("config", "engine_config"):
            lo, hi = c.window
            explained = c.explanation.splitlines()
            lines.append(f"   explained (DeepDiff, records {lo}..{hi - 1} only):")
            lines += ["     " + e for e in explained[:MAX_EXPLAINED]]
            if len(explained) > MAX_EXPLAINED:
                lines.append(f"     ... {len(explained) - MAX_EXPLAINED} more lines")
    lines += _capacity(v)
    if v.kind != PASS and (v.expected_lines or v.actual_lines) and v.expected_lines != v.actual_lines:
        key = (tuple(v.expected_lines), tuple(v.actual_lines))
        if blocks is not None and key in blocks:
            number, first = blocks[key]
            lines.append(f"   budget log lines: as block [{number}] above ({first})")
            return _join(lines)
        if blocks is not None:
            blocks[key] = (len(blocks) + 1, f"{v.scenario}, {v.engine}")
            lines.append(f"   budget log lines [{len(blocks)}], side by side:")
        else:
            lines.append("   budget log lines, side by side:")
        for i in range(max(len(v.expected_lines), len(v.actual_lines))):
            e = v.expected_lines[i] if i < len(v.expected_lines) else "<none>"
            a = v.actual_lines[i] if i < len(v.actual_lines) else "<none>"
            mark = " " if e == a else "!"
            lines.append(f"   {mark} oracle   : {e}")
            lines.append(f"   {mark} candidate: {a}")
    return _join(lines)


CAUSES = {
    "scheduling": "scheduling divergence: a decision that differs on the same state",
    "acceptance": "acceptance divergence: drafts judged differently where the oracle shows no near-tie",
    Kind.NUMERICS: "numerics: a near-tie in the oracle's own logprobs, resolved the other way",
    "logprobs": "logprob beyond the scenario's tolerance",
    "state": "state divergence: every decision equal, the state recorded after the update differs",
    "context": "only the recorded budget or worker token counts differ; every decision is equal",
    "mismatch": "mismatch: a token, length or finish reason no near-tie of the oracle explains",
}


def _capacity(v: Verdict) -> list[str]:
    """Forwards above the worker's capacity (max_num_batched_tokens), candidate and oracle."""
    lines = []
    for who, excess in (("candidate", v.capacity), ("oracle", v.oracle_capacity)):
        if who == "oracle" and not v.capacity:
            continue  # the oracle's own excess is shown beside a candidate's, not alone
        for e in excess[:10]:
            lines.append(f"   capacity: {who} step {e['step']}: a {e['forward']} forward ran "
                         f"{e['tokens']} tokens > max_num_batched_tokens {e['limit']} (excess {e['excess']})")
        if len(excess) > 10:
            lines.append(f"   capacity: {who}: {len(excess) - 10} more steps over capacity")
        if who == "oracle" and not excess:
            lines.append("   capacity: oracle: no forward above max_num_batched_tokens")
    return lines


def first_line(view: GateView) -> str:
    """The report's first line: the verdict, and what was judged (view.judged)."""
    return (f"== vllm-parity gate: {view.word} (exit status {view.status}); oracle {pin_label(view.oracle)}; "
            f"{len(view.scenarios)} scenarios x {len(view.engines)} engines; {view.judged}")


MAX_REQUESTS = 6  # request rows a first-divergence block shows (the details show every one)
MAX_BLOCKS = 8  # first-divergence blocks before the grid (the grid and details show the rest)


def to_fix(view: GateView) -> list[str]:
    """What to fix, first: each gating cell that did not pass (a scenario not run for a feature
    not required is no failure), its first divergence in one block: scenario, engine, layer,
    step, field, both values, the likely cause, the requests' states at that step. Stand-ins
    (informational) are counted here and shown in the grid and the details."""
    groups = view.to_fix()  # cells of one engine alike in status and headline field: one block
    cells = [c for alike in groups for c in alike]
    informational = [c for c in view.failing() if not c.verdict.gating]
    lines = []
    if cells:
        lines.append(f"-- what to fix: {_count(cells, 'gating cell')} did not pass, first divergences"
                     f"{' (alike ones together)' if len(groups) < len(cells) else ''}; every field below the grid")
    for number, alike in enumerate(groups[:MAX_BLOCKS], 1):
        lines += first_divergence(alike[0], number)
        if len(alike) > 1:
            lines += textwrap.wrap(f"the same field in {len(alike) - 1} more scenario{'s' if len(alike) > 2 else ''}: "
                                   + ", ".join(c.verdict.scenario for c in alike[1:]), width=GRID_WIDTH,
                                   initial_indent="    ", subsequent_indent="      ")
    if len(groups) > MAX_BLOCKS:
        lines.append(f"-- {len(groups) - MAX_BLOCKS} more kinds of failure: the grid and the details below")
    if informational:
        lines.append(f"-- {len(informational)} cells of informational stand-ins differ: the grid and the details "
                     "below say where")
    return lines


def first_divergence(cell, number: int) -> list[str]:
    """One cell's first divergence as a block of lines (made visible by the caller's _join)."""
    v, c = cell.verdict, cell.headline
    lines = [f"[{number}] {v.scenario}, {v.engine} ({v.role}): {cell.status}"
             + (f"+{v.failure}" if v.failure else "")]
    if cell.waiver is not None:
        lines.append(f"    waived by {cell.waiver.name} {waiver_words(cell.waiver)}")
    if c is None:  # could not be compared: the first line of what happened
        lines.append(f"    {cell.first_line.message or v.kind}")
        return lines
    f = c.first
    lines.append(f"    {c.layer}, {c.where}, field {f.path}: {_pair(f.expected, f.actual)}")
    if cell.bookkeeping:
        lines.append(f"    (its config differs only in {', '.join(cell.bookkeeping)}, which no scheduling decision "
                     "reads: the headline is its behaviour)")
    cause = likely_cause(c)
    if cause:
        lines.append(f"    likely cause: {cause}")
    expected, actual = _record(c.record), _record(c.actual_record)
    head, rows = _request_rows(expected, actual)
    differing = [line for differs, _, line in rows if differs][:MAX_REQUESTS]
    if differing:  # the requests whose states differ at this step, up to MAX_REQUESTS
        lines += [" " + line for line in head] + [" " + line for line in differing]
        if len(rows) > len(differing):
            lines.append(f"        ... {len(rows) - len(differing)} more requests (alike on both sides, or past "
                         f"{MAX_REQUESTS}: the details list every one)")
    elif rows:
        lines.append(f"    {_count(rows, 'request')} at this step, alike on both sides (the details list "
                     f"{'them' if len(rows) > 1 else 'it'})")
    queues = _queues(expected, actual)
    if any(line.startswith("   !") for line in queues):
        lines += [" " + line for line in queues[:2]] + [" " + line for line in queues[2:] if line.startswith("   !")]
    return lines


# What the suite knows of a field's first divergence, where the comparison names no cause.
FIELD_CAUSES = {
    "max_num_scheduled_tokens": "the scheduler's token budget resolved differently (how speculative "
                                "decoding's drafting slots are reserved: drafting_reservation)",
    "max_num_batched_tokens": "the worker's token capacity resolved differently",
    "max_num_seqs": "the running-request cap resolved differently",
    "refused": "one side refused the configuration, the other accepted it (or refused it otherwise)",
    "tokens": "a scheduling decision: the tokens a request was given at this step",
    "draft_tokens": "the drafts scheduled for a request at this step",
    "new": "admission: which requests were admitted at this step",
    "preempted": "preemption: which request was evicted, or when",
    "finished": "a request finished at another step (its stop, length or abort)",
    "block_ids": "the KV blocks a request was given (allocation or the free queue's order)",
    "kv_blocks": "the KV blocks held after the step (allocation or freeing)",
    "waiting": "the waiting queue's order after the step",
    "running": "the running queue's order after the step",
}


def likely_cause(c) -> str:
    """The comparison's own cause (engine layers), else what the suite knows of its field."""
    if c.cause:
        return CAUSES.get(c.cause, c.cause)
    path = c.first.path
    leaf = path.rsplit(".", 1)[-1].split("[")[0]
    top = path.split(".")[0].split("[")[0]
    return FIELD_CAUSES.get(top) or FIELD_CAUSES.get(leaf, "")


def render_gate(view: GateView) -> str:
    """The gate's terminal report, what to fix first: the verdict and what was judged (one
    line), then each failing cell's first divergence in one block (`to_fix`), then one compact
    grid (scenarios down, engines across, each cell the verdict and its headline field), the
    layers judged, the per-feature table and the counts, then every field of every cell that
    did not pass, each distinct block of budget log lines printed once. A grid of more than
    LABELLED engines wider than GRID_WIDTH (many candidates) names its columns by short codes,
    with a legend, and is cut into grids of at most GRID_WIDTH columns."""
    scenarios, engines = view.scenarios, view.engines
    lines = [first_line(view)] + to_fix(view)
    # measured as shown: a candidate's escaped text keeps the columns aligned
    texts = {s: tuple(visible(c.text) if (c := view.cell(s, e)) else "-" for e in engines) for s in scenarios}
    folded = view.folded()
    first = max([len("scenario")] + [len(_label(names)) for names in folded])
    widths = [max([len(visible(e)), len(view.roles[e]) + 2] + [len(row[i]) for row in texts.values()])
              for i, e in enumerate(engines)]
    wide = len(engines) > LABELLED and first + sum(1 + w for w in widths) > GRID_WIDTH
    column = _codes(view) if wide else {e: e for e in engines}  # engine -> its column's name
    lines.append("-- the grid: scenarios down, engines across; each cell the verdict and its headline field")
    if wide:  # the legend: each column's code, engine, role and command line
        lines += [f"   {column[e]} = {e} ({view.roles[e]})" + (f": command {view.commands[e]}" if e in view.commands
                                                             else "") for e in engines]
    if wide:
        lines += _grids(folded, texts, first, [column[e] for e in engines])
    else:
        lines.append(" ".join([" " * first] + [visible(e).ljust(w) for e, w in zip(engines, widths)]).rstrip())
        lines.append(" ".join(["scenario".ljust(first)] + [f"({view.roles[e]})".ljust(w) for e, w in zip(engines, widths)]).rstrip())
        for names in folded:
            lines.append(" ".join([_label(names).ljust(first)] + [c.ljust(w) for c, w in
                                                                  zip(texts[names[0]], widths)]).rstrip())
    for names in folded:
        if len(names) > 1:  # every scenario is still named before the details
            lines += textwrap.wrap(f"{_label(names)}: {', '.join(names[1:])}", width=GRID_WIDTH,
                                   initial_indent="   ", subsequent_indent="     ")
    if not wide:
        lines += [f"   {label}: command {command}" for label, command in view.commands.items()]
    for group in view.judged_groups:
        who = ", ".join(column.get(e, e) for e in group["engines"])
        lines += textwrap.wrap(f"{who}: {group['text']} ({_count(group['scenarios'])}): "
                               f"{', '.join(group['scenarios'])}", width=GRID_WIDTH,
                               initial_indent="   ", subsequent_indent="     ")
    lines += _features(view, [column[e] for e in engines], wide)
    lines.append(f"-- {view.count_line()}")
    return _join(lines + _details(view))


def _details(view: GateView) -> list[str]:
    """Every field of every cell that did not pass, each distinct block of budget log lines
    printed once, a failure said alike on another scenario referred to."""
    lines = []
    # a scenario not run for a feature the engine does not declare is said by its cell and the
    # per-feature table; unless the feature is required it is no failure to detail
    failing = [c.verdict for c in view.failing() if not c.verdict.declined]
    if failing:
        lines.append(f"-- details of the {len(failing)} cells that did not pass")
    blocks: dict = {}
    messages: dict[str, str] = {}
    for v in failing:
        text = render_verdict(v, view.oracle, blocks)
        head, _, body = text.partition("\n")
        waiver = view.grid[v.key].waiver
        if waiver is not None:  # said first, under the verdict's head
            body = f"   waived by {visible(waiver.name)} {waiver_words(waiver)}" + (f"\n{body}" if body else "")
            text = f"{head}\n{body}"
        said = body.replace(visible(v.scenario), "<scenario>")  # the same failure on another scenario
        if body and not v.comparisons and said in messages:  # said once, then referred to
            text = f"{head}\n   as {messages[said]} above"
        elif body and not v.comparisons:
            messages[said] = f"{v.scenario}, {v.engine}"
        lines += text.split("\n")
    return lines


GRID_WIDTH = 117


# Up to this many engines the grid's columns keep their labels, however wide (one candidate
# beside the oracle); past it a grid wider than GRID_WIDTH is named by codes and cut.
LABELLED = 2
CODES = {"candidate": "C", "stand-in": "S"}  # a wide grid's column codes by role: C1, C2, ...; the oracle's is O


def _codes(view: GateView) -> dict[str, str]:
    """engine -> its column code in a wide grid: C1.. for candidates, S1.. for stand-ins, O."""
    codes: dict[str, str] = {}
    for e in view.engines:
        prefix = CODES.get(view.roles[e], "O")
        number = sum(1 for c in codes.values() if c.startswith(prefix)) + 1
        codes[e] = prefix if prefix == "O" and number == 1 else f"{prefix}{number}"
    return codes


def _features(view: GateView, columns: list[str], wide: bool) -> list[str]:
    """The per-feature table, its columns named as the grid's (codes, cut into grids, when wide)."""
    if not view.features:
        return []
    texts = {row.label: tuple(row.cells[e].text for e in view.engines) for row in view.features}
    first = max([len("feature")] + [len(visible(label)) for label in texts])
    head = textwrap.wrap(f"-- {FEATURES_HEAD}", width=GRID_WIDTH, subsequent_indent="   ")
    if wide:
        return head + _grids([[label] for label in texts], texts, first, columns, "feature")
    widths = [max([len(visible(c))] + [len(row[i]) for row in texts.values()]) for i, c in enumerate(columns)]
    lines = [" ".join(["feature".ljust(first)] + [visible(c).ljust(w) for c, w in zip(columns, widths)])]
    lines += [" ".join([visible(label).ljust(first)] + [t.ljust(w) for t, w in zip(row, widths)])
              for label, row in texts.items()]
    return head + ["   " + line.rstrip() for line in lines]


def _grids(folded: list[list[str]], texts: dict[str, tuple], first: int, codes: list[str],
           head: str = "scenario") -> list[str]:
    """The grid cut into grids of at most GRID_WIDTH columns (at least one engine each), the
    scenario column repeated in each, the engines named by their codes."""
    widths = [max([len(code)] + [len(row[i]) for row in texts.values()]) for i, code in enumerate(codes)]
    cuts: list[list[int]] = [[]]
    used = first
    for i, w in enumerate(widths):
        if cuts[-1] and used + 1 + w > GRID_WIDTH:
            cuts.append([])
            used = first
        cuts[-1].append(i)
        used += 1 + w
    lines = []
    for columns in cuts:
        lines.append(" ".join([head.ljust(first)] + [codes[i].ljust(widths[i]) for i in columns]).rstrip())
        for names in folded:
            row = texts[names[0]]
            lines.append(" ".join([_label(names).ljust(first)] + [row[i].ljust(widths[i]) for i in columns]).rstrip())
    return lines


def _count(names: list, what: str = "scenario") -> str:
    return f"{len(names)} {what}{'s' if len(names) != 1 else ''}"


def _pair(expected, actual) -> str:
    """Both values of a field; two lists of lines (log lines) from their first differing line."""
    said, e, a = shown_pair(expected, actual)
    return f"{said}oracle {e}, candidate {a}"


def shown_pair(expected, actual) -> tuple[str, str, str]:
    """Both values of a field as a report shows them (cut), and what precedes them: two lists of
    lines (log lines) are shown from their first differing line, from a little before where
    the two lines part."""
    if isinstance(expected, list) and isinstance(actual, list) and all(isinstance(x, str) for x in expected + actual):
        at = next((i for i, (e, a) in enumerate(zip(expected, actual)) if e != a), min(len(expected), len(actual)))
        pair = [side[at] if at < len(side) else "" for side in (expected, actual)]
        cut = max(0, len(os.path.commonprefix(pair)) - 20)
        line = lambda side: _show(("..." if cut else "") + side[at][cut:]) if at < len(side) else "<none>"  # noqa: E731
        return (f"{len(expected)} vs {len(actual)} lines, first differing at line {at + 1}: ",
                line(expected), line(actual))
    return "", _refusal_or_show(expected), _refusal_or_show(actual)


def _refusal_or_show(value) -> str:
    """A refusal as `Type: message` (cut), any other value as _show does."""
    if isinstance(value, dict) and set(value) == {"type", "message"}:
        return _show(f"{value['type']}: {value['message']}")
    return _show(value)


def _label(names: list[str]) -> str:
    name = visible(names[0])
    return name if len(names) == 1 else f"{name} +{len(names) - 1}"


def render_summary(verdicts: list[Verdict]) -> str:
    counts = Counter(v.kind for v in verdicts)
    gating = Counter(v.kind for v in verdicts if v.gating)
    cells = ", ".join(f"{counts[k]} {k}" for k in KINDS if counts[k])
    gate = ", ".join(f"{gating[k]} {k}" for k in KINDS if gating[k]) or "none"
    return f"-- {len(verdicts)} verdicts: {cells or 'none'}; gating: {gate}"


def _per_request(expected: dict | None, actual: dict | None) -> list[str]:
    """At a divergent step: every request's scheduled and draft tokens on both sides, the
    state each side recorded after the update, and the queues and KV blocks."""
    head, rows = _request_rows(expected, actual)
    if not rows and not head:
        return []
    return head + [line for _, _, line in rows] + _queues(expected or {}, actual or {})


def _request_rows(expected: dict | None, actual: dict | None) -> tuple[list[str], list[tuple[bool, str, str]]]:
    """The per-request table at a step: its head lines, and per request (whether the sides
    differ, its id, its line)."""
    e_reqs = (expected or {}).get("requests")
    a_reqs = (actual or {}).get("requests")
    if not isinstance(e_reqs, dict) and not isinstance(a_reqs, dict):
        return [], []
    e_reqs, a_reqs = e_reqs or {}, a_reqs or {}
    entries = [r for r in list(e_reqs.values()) + list(a_reqs.values()) if isinstance(r, dict)]
    accepted = any("accepted_draft_tokens" in r for r in entries)
    state = any(key in r for r in entries for key in STATE_KEYS)
    what = "tokens / draft tokens / accepted drafts" if accepted else "tokens / draft tokens"
    rows = []
    for rid in sorted(set(e_reqs) | set(a_reqs)):
        e = _mark(expected, rid) + _counts(e_reqs.get(rid))
        a = _mark(actual, rid) + _counts(a_reqs.get(rid))
        rows.append((rid, e, a))
    width = max([len("oracle")] + [max(len(e), len(a)) for _, e, a in rows])
    rid_width = max([len("request")] + [len(rid) for rid, _, _ in rows])
    out = [f"   per request at this step ({what}):"]
    if state:
        out.append("     -> after the update: computed tokens / output tokens / KV blocks held; "
                   "new / resumed: admitted at this step")
    out.append(f"     {'request':<{rid_width}}  {'oracle':<{width}}  candidate")
    return out, [(e != a, rid, f"   {' ' if e == a else '!'} {rid:<{rid_width}}  {e:<{width}}  {a}")
                 for rid, e, a in rows]


# Per-request fields recorded after a step's update (engines/PROTOCOL.md, `steps`).
STATE_KEYS = ("computed_tokens", "output_tokens", "kv_blocks")


def _mark(record: dict | None, rid: str) -> str:
    """`new` or `resumed` where that side admitted the request at this step."""
    for key in ("new", "resumed"):
        admitted = (record or {}).get(key)
        if isinstance(admitted, list) and rid in admitted:
            return f"{key} "
    return ""


def _record(record) -> dict:
    """A record as the report reads it: a candidate's record that is not an object reads as
    empty here (its divergence is still shown, field by field)."""
    return record if isinstance(record, dict) else {}


def _refusals(expected, actual) -> list[str]:
    """Where a refusal differs: both whole, as compared (conformance/formats/refusal.py). A side whose
    record is missing or not an object says so (`_refusal_words`)."""
    e, a = (_record(expected).get("refused"), _record(actual).get("refused"))
    if e == a or not (isinstance(e, dict) or isinstance(a, dict)):
        return []
    out = ["   refusal, whole (exception type and vLLM's words, pydantic's wrapper removed):"]
    for who, record in (("oracle   ", expected), ("candidate", actual)):
        out += [f"     {who}: {line}" if i == 0 else f"                {line}"
                for i, line in enumerate(_refusal_words(record).splitlines() or [""])]
    return out


def _refusal_words(record) -> str:
    """What one side's record at the divergence says of the configuration, and nothing more:
    a side with no record there has neither accepted nor refused anything in it."""
    if not isinstance(record, dict):
        return "sent no record here"
    refused = record.get("refused")
    if isinstance(refused, dict):
        return f"{refused.get('type')}: {refused.get('message')}"
    if refused is None:
        return "accepted the configuration"
    return f"refused = {_show(refused)} (not a {{type, message}} refusal)"


def _counts(entry) -> str:
    if not isinstance(entry, dict):
        return "-"
    counts = f"{entry.get('tokens')} / {entry.get('draft_tokens')}"
    if "accepted_draft_tokens" in entry:  # what the target accepted
        counts += f" / {entry['accepted_draft_tokens']}"
    if any(key in entry for key in STATE_KEYS):
        counts += " -> " + " / ".join(str(entry.get(key, "-")) for key in STATE_KEYS)
    return counts


def _queues(expected: dict, actual: dict) -> list[str]:
    """The step's state after the update, oracle beside candidate: KV blocks and queues."""
    shown = {"kv_blocks": "KV blocks free / used", "waiting": "waiting (in order)",
             "running": "running (in order)"}
    if not any(key in record for record in (expected, actual) for key in shown):
        return []
    rows = [(label, _state(expected.get(key)), _state(actual.get(key))) for key, label in shown.items()]
    width = max([len("oracle")] + [len(e) for _, e, _ in rows])
    out = ["   state after the update at this step:", f"     {'':<21}  {'oracle':<{width}}  candidate"]
    for label, e, a in rows:
        out.append(f"   {' ' if e == a else '!'} {label:<21}  {e:<{width}}  {a}")
    return out


def _state(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):  # kv_blocks
        return f"{value.get('free', '-')} / {value.get('used', '-')}"  # engine_steps may lack free
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "(empty)"
    return str(value)


def _show(value) -> str:
    if isinstance(value, str):
        value = visible(value)
        return value if len(value) <= 60 else value[:57] + "..."
    return visible(json.dumps(value, sort_keys=True))[:60]


def render_pin_tables(view: GateView) -> str:
    """The drift across pins and the per-pin method tables the view holds (every report shows
    them), or the line saying they were left out."""
    if view.drift is None:
        return "-- drift across pins and per-pin tables left out (the oracle pin's concern): --drift shows them"
    parts = [render_drift(view.drift)]
    if view.methods is not None:
        parts.append(render_methods_rows(*view.methods))
    return "\n".join(parts)


def render_requirement_rows(view: GateView) -> str:
    """Verdicts grouped by requirement row (the engine-matrix rows), with waivers applied."""
    lines = ["-- by engine-matrix row"]
    for row, cells in view.requirement_rows.items():  # per role, never summed across roles
        lines.append(f"   {row:<18} {by_role(cells)}")
    for w in view.expired:
        lines.append(f"   EXPIRED waiver: {w.row} / {w.scenario} / {w.field} (owner {w.owner}, expired {w.expires})")
    for w, cells in view.applied():
        lines.append(f"   waiver applied: {w.name} to {', '.join(c.verdict.engine for c in cells)} {waiver_words(w)}")
    for w in view.unused:
        lines.append(f"   unused waiver: {w.name} (owner {w.owner}): {view.why_unused.get(w, '')}")
    return _join(lines)
