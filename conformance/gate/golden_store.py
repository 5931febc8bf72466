"""Golden files: where they live, how they are written (atomically, oracle only), and checked.

goldens/<scenario name>/vllm-<release>.json holds the trace of pinned release <release> on
that scenario. Only a pinned vLLM release may write one; a candidate never does.

Whether a regenerated trace still holds its golden (`check_golden`, the one rule of both
lifecycles, `make goldens` and `parity goldens`):
  - on the machine that wrote it (same build, CPU model, ISA level and CPU flags): byte for byte;
  - on another machine or ISA level: every integer fact exactly (config, steps, engine_steps,
    token ids, finish reasons) and the engine layers' logprobs within the scenario's calibrated
    tolerance (conformance/numerics.py); a golden that holds is not rewritten, so goldens do
    not churn from machine to machine;
  - on another build (the CUDA wheel against a CPU rebuild's golden): by the numerics rules,
    where a near-tie resolved the other way is reported, not failed.
Regeneration keeps a golden that holds (`keeps`), unless its provenance does not yet name the
CPU that wrote it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..pins import REPO_ROOT
from ..trace import TraceError, dumps, load_trace

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


@dataclass(frozen=True)
class GoldenCheck:
    """Whether a regenerated trace holds its golden, by which rule, and the verdict behind it."""

    holds: bool
    rule: str  # "bytes" (the writer's machine), "tolerance" (another machine), "numerics" (another build)
    verdict: object = None  # the conformance.verdict.Verdict of a judged check
    reason: str = ""


def writer(trace: dict) -> dict:
    """What wrote a trace: the build, and the CPU's model, ISA level and flags (provenance)."""
    env = trace.get("provenance", {}).get("environment", {})
    return {"build": env.get("build"), "cpu": env.get("cpu")}


def check_golden(trace: dict, golden: dict) -> GoldenCheck:
    """The one rule by which a trace holds its golden (module doc)."""
    from .verdict import NUMERICS, PASS, judge

    theirs, ours = writer(golden), writer(trace)
    if theirs == ours and theirs["cpu"] is not None:
        same = dumps(trace) == dumps(golden)
        return GoldenCheck(same, "bytes", reason="" if same else "on the machine that wrote it, "
                           "the golden must regenerate byte for byte")
    rule = "tolerance" if theirs["build"] == ours["build"] else "numerics"
    for key in ("engine", "scenario"):
        if trace.get(key) != golden.get(key):
            return GoldenCheck(False, rule, reason=f"{key} differs: golden {golden.get(key)}, "
                               f"run {trace.get(key)}")
    verdict = judge(trace, golden, "oracle")
    holds = verdict.kind == PASS or (rule == "numerics" and verdict.kind == NUMERICS)
    return GoldenCheck(holds, rule, verdict, reason="" if holds else (
        f"written by {theirs}, run on {ours}: judged {verdict.kind}, "
        + ("integer facts exact and logprobs within the tolerance required" if rule == "tolerance"
           else "within the numerics rules required")))


def keeps(trace: dict, golden: dict) -> GoldenCheck:
    """Whether regeneration keeps a golden (both lifecycles): it holds, and its provenance
    names the CPU that wrote it (a golden from before that was recorded is rewritten once)."""
    check = check_golden(trace, golden)
    if check.holds and writer(golden)["cpu"] is None:
        return GoldenCheck(False, check.rule, check.verdict, "its provenance does not name the CPU "
                           "that wrote it (environment.cpu)")
    return check


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

    from ..compare import compare_layer

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
