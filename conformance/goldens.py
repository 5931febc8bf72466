"""Golden files: where they live, how they are written (atomically, oracle only), and checked.

goldens/<scenario name>/vllm-<release>.json holds the trace of pinned release <release> on
that scenario. Only a pinned vLLM release may write one; a candidate never does.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .pins import REPO_ROOT
from .trace import TraceError, dumps, load_trace

GOLDEN_DIR = REPO_ROOT / "goldens"


class GoldenRefused(PermissionError):
    """Someone asked a candidate engine to write a golden."""


def golden_path(scenario: str, release: str, root: Path = GOLDEN_DIR) -> Path:
    return root / scenario / f"vllm-{release}.json"


def load_golden(path: Path) -> dict:
    trace = load_trace(path)
    if "failure" in trace:
        raise TraceError(f"{path}: a golden must come from a finished oracle run, this one records "
                         f"a failure ({trace['failure'].get('kind')})")
    return trace


def write_golden(path: Path, trace: dict, release: str | None) -> bool:
    """Write atomically (old file or new file, never half); True when the bytes changed."""
    if release is None:
        raise GoldenRefused(f"refusing to write {path}: goldens are written only by a pinned "
                            "vLLM oracle, never by a candidate engine")
    if "failure" in trace:
        raise GoldenRefused(f"refusing to write {path}: the run failed ({trace['failure']['kind']})")
    return write_text_atomic(path, dumps(trace))


def write_text_atomic(path: Path, text: str) -> bool:
    """Old file or new file, never half of either; True when the bytes changed."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private; a golden is a plain reviewable file
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def orphans(scenario_names: set[str], releases: tuple[str, ...], root: Path = GOLDEN_DIR) -> list[Path]:
    """Golden files with no scenario or no pinned release behind them."""
    expected = {golden_path(s, r, root) for s in scenario_names for r in releases}
    return sorted(p for p in root.glob("**/*.json") if p not in expected)


def change_summary(path: Path, old_text: str | None, trace: dict) -> str:
    """One line saying what regenerating `path` changes, shown before it is written."""
    import json

    from .compare import compare_layer

    rel = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    if old_text is None:
        return f"[goldens] new: {rel}"
    try:
        old = json.loads(old_text)
        parts = []
        for layer, records in trace["layers"].items():
            c = compare_layer(layer, old.get("layers", {}).get(layer, []), records)
            if not c.equal:
                f = c.first
                parts.append(f"{layer} record {c.index} {f.path}: {f.expected!r} -> {f.actual!r}"
                             f" ({len(c.fields)} field(s))")
        return f"[goldens] changed: {rel}: " + ("; ".join(parts) or "metadata only (engine or provenance)")
    except (ValueError, AttributeError, TypeError):
        return f"[goldens] changed: {rel} (the old file was unreadable)"
