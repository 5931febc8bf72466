"""The drafting-slot table and refusals per pin, side by side, from the committed goldens.

Cells that change from the previous pin are marked with '*'.
"""

from __future__ import annotations

from conformance.judging.goldens import GOLDENS

SCENARIO = "method_matrix"


def table_rows(releases: tuple[str, ...], scenario: str = SCENARIO) -> tuple[list[str], dict, dict]:
    """(row labels, {release: {row: slots cell}}, {release: {row: refusal cell}})."""
    slots: dict[str, dict[str, str]] = {}
    refusals: dict[str, dict[str, str]] = {}
    labels: list[str] = []
    for release in releases:
        present = GOLDENS.exists(scenario, release)
        records = GOLDENS.load(scenario, release).layers.get("methods", []) if present else []
        slots[release], refusals[release] = {}, {}
        for r in records:
            row = r["row"]
            if "probe" in r:
                base = row.rsplit("/", 1)[0]
                mark = "refused" if r["refused"] else "ok"
                cell = refusals[release].setdefault(base, {})
                cell[r["probe"]] = f"{r['max_num_batched_tokens']}:{mark}"
                continue
            if row not in labels:
                labels.append(row)
            slots[release][row] = (str(r["drafting_slots_per_request"]) if r.get("constructible")
                                   else f"not constructible ({r.get('refusal_kind')})")
    flat = {rel: {row: " ".join(cell[p] for p in ("below", "at", "above") if p in cell)
                  for row, cell in cells.items()} for rel, cells in refusals.items()}
    return labels, slots, flat


def render_methods_table(releases: tuple[str, ...]) -> str:
    return render_methods_rows(releases, *table_rows(releases))


def render_methods_rows(releases: tuple[str, ...], labels: list[str], slots: dict, refusals: dict) -> str:
    """The tables of `table_rows`' rows (a gate's view holds them)."""
    if not labels:
        return f"-- drafting-slot table: no {SCENARIO} goldens"
    lines = ["-- drafting slots per request, per pin (* = changed from the previous pin)"]
    lines += _grid(labels, slots, releases, 24)
    lines.append("-- refusal probes at max_num_batched_tokens = R-1 / R / R+1 (R: the pin's reservation)")
    lines += _grid(labels, refusals, releases, 34)
    return "\n".join(lines)


def _grid(labels: list[str], cells: dict, releases: tuple[str, ...], width: int) -> list[str]:
    out = ["   " + "row".ljust(18) + "".join(r.ljust(width) for r in releases)]
    for row in labels:
        values, prev, line = [cells[r].get(row, "-") for r in releases], None, "   " + row.ljust(18)
        for value in values:
            text = value + (" *" if prev is not None and value != prev else "")
            line += text.ljust(width)
            prev = value
        out.append(line.rstrip())
    return out
