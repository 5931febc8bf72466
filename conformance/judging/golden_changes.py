"""What regenerating a golden changes, in `make goldens`' and goldens-check's words: one line
per golden before it is written (`change_summary`), and why one does not hold (`explain`)."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.formats.pins import REPO_ROOT
from conformance.formats.trace import Trace
from conformance.judging.compare import compare_layer, field_diffs
from conformance.judging.digest_compare import compare_digest_layer


def explain(update) -> str:
    """Why a regenerated golden (a GoldenUpdate) does not hold, in goldens-check's words: per
    layer, what the golden (its path from the repository root) says and what the oracle run now
    gives."""
    shown = shown_path(update.path)
    rule = f" ({update.check.rule} rule)" if update.check else ""
    verdict = update.check.verdict if update.check else None
    differing = [c for c in (verdict.comparisons if verdict else []) if not c.equal and c.first]
    if not differing:
        detail = f": {verdict.message}" if verdict is not None and verdict.message else ""
        return f"{shown} does not hold{rule}: {update.reason}{detail}"
    lines = [f"{shown} does not hold{rule}: {update.reason}"]
    lines += [f"  {c.layer} {c.where}, {said(c.first.path, c.first.expected, c.first.actual, shown)}"
              + (f" ({len(c.fields)} fields differ there)" if len(c.fields) > 1 else "")
              + (f"; {c.evidence}" if c.evidence else "") for c in differing]
    return "\n".join(lines)


def change_summary(path: Path, old_text: str | None, trace: Trace) -> str:
    """One line saying what regenerating `path` changes, shown before it is written."""
    rel = shown_path(path)
    if old_text is None:
        held = ", ".join(f"{layer} {len(records)} record(s)" for layer, records in trace.layers.items())
        return f"[goldens] new: {rel}: {held or 'no layer'}"
    try:
        old_json = json.loads(old_text)  # plain JSON: the old file need not be a valid trace
        parts = []
        for layer, form in trace.forms.items():
            c = compare_digest_layer(layer, old_json.get("digests", {}).get(layer) or {"records": []}, form)
            if not c.equal:
                parts.append(f"{layer} record {c.index} (by its digest; {c.expected_count} -> {c.actual_count} "
                             f"records{_checkpoint_change(layer, old_json.get('digests', {}).get(layer) or {}, form)})")
        for layer, records in trace.layers.items():
            c = compare_layer(layer, old_json.get("layers", {}).get(layer, []), records)
            if not c.equal:
                f = c.first
                parts.append(f"{layer} {c.where}, {said(f.path, f.expected, f.actual)}"
                             f" ({len(c.fields)} field(s))")
        return f"[goldens] changed: {rel}: " + ("; ".join(parts) or "metadata only (engine or provenance)")
    except (ValueError, AttributeError, TypeError, KeyError):
        return f"[goldens] changed: {rel} (the old file was unreadable)"


def _checkpoint_change(layer: str, old: dict, new: dict) -> str:
    """The first checkpoint kept in both forms that changed, and its first field."""
    old_points, new_points = old.get("checkpoints", {}), new.get("checkpoints", {})
    for key in sorted(set(old_points) & set(new_points), key=int):
        diffs = field_diffs(old_points[key], new_points[key])
        if diffs:
            return f"; checkpoint {key}: {diffs[0].path}: {diffs[0].expected!r} -> {diffs[0].actual!r}"
    return ""


def said(field_path: str, golden, run, shown: str = "") -> str:
    """A field as goldens-check words it: the golden's value, then the fresh oracle run's."""
    where = f" ({shown})" if shown else ""
    return (f"{field_path}: golden{where} says {_value(golden)}, "
            f"the oracle run now gives {_value(run)}")


def shown_path(path: Path) -> str:
    """A golden's path as a reader finds it: from the repository root."""
    path = Path(path)
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _value(value) -> str:
    text = json.dumps(value, sort_keys=True)  # control characters escaped: shown, never obeyed
    return text if len(text) <= 200 else text[:197] + "..."
