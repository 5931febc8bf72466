"""Sharding the gate across runners: the gate's work as units, each runner's share of them, and
the results folder a shard leaves for `parity merge`.

A unit is one engine on one scenario for one layer group. The layers an engine computes
together stay in one unit (steps and outputs come from one drive of the scheduler, the three
engine layers from one engine run), so no shard repeats another's work.

Shares are balanced by estimated cost, and every engine a shard runs costs it one cold start
(its warm worker), so each share is a consecutive piece of the plan: an engine's units stay
together, split only where balance needs it. The plan depends only on the engines, the scenarios, the layers and the shard
count, so every runner of a CI matrix computes the same plan and takes its own share.

A results folder:
    manifest.json   what the run was (oracle, pins, scenario set, goldens, tool version,
                    engines, plan) and which units this shard ran, with their trace files and
                    each trace's sha256 (merge refuses a trace changed since)
    verdicts.json   each unit's own verdict, for reading (merge judges again from the traces)
    traces/         one trace per unit
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..pins import REPO_ROOT
from ..protocol import ENGINE_LAYERS
from ..trace import TraceError, dumps, load_trace

SCHEMA = "vllm-parity/results/1"
# Layers computed together by one run of an engine (engines/vllm/per_run.py).
GROUPS = {"config": ("config",), "steps": ("steps", "outputs"), "engine": ENGINE_LAYERS,
          "methods": ("methods",)}
# Cost estimates in seconds, from the progress lines of `parity gate` on the 2-core CPU
# machine (a pin's cold start 6-8 s, a whole-engine scenario 3-8 s, a stand-in scenario well
# under 1 s); only their ratios matter for balance.
COLD_START = 8.0  # a pin's worker importing vLLM: paid once per engine per shard
COST = {"config": 0.1, "methods": 1.0, "engine": 5.0}
REFUSED = 0.1  # a group the engine refuses at once (a pin without a CPU engine, on CPU)
STEP_TOKENS_PER_SECOND = 40_000  # the stand-in drive: scheduled tokens per second
# Fields every shard of one gate run has in common; merge refuses a set where any differs.
IDENTITY = ("tool", "oracle", "pins", "scenario_set", "goldens", "engines", "layers",
            "require_layers", "plan", "device", "count")


class ShardError(ValueError):
    """A bad --shard value, or a set of results folders that are not one gate run's shards."""


@dataclass(frozen=True)
class Unit:
    engine: str  # the engine's key: the same on every runner of one gate run
    scenario: str
    group: str  # a key of GROUPS
    layers: tuple[str, ...]
    cost: float  # estimated seconds, the oracle's double run included

    @property
    def key(self) -> str:
        return f"{self.engine} / {self.scenario} / {self.group}"


def parse_shard(text: str) -> tuple[int, int]:
    """'2/3' -> (2, 3)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise ShardError(f"--shard {text!r}: expected I/N, e.g. 2/3 (shard I of N, counting from 1)")
    index, count = int(match[1]), int(match[2])
    if not 1 <= index <= count:
        raise ShardError(f"--shard {text!r}: I must be between 1 and N")
    return index, count


def layer_groups(layers: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The groups of `layers`, in protocol order, each with the asked layers it holds."""
    out = []
    for group, members in GROUPS.items():
        held = tuple(layer for layer in members if layer in layers)
        if held:
            out.append((group, held))
    return out


def unit_cost(group: str, scenario, repeat: int) -> float:
    if group == "steps":
        workload = scenario.workload or {}
        tokens = sum(r.get("prompt_len", 0) + r.get("max_tokens", 0) for r in workload.get("requests", []))
        cost = 0.2 + tokens / STEP_TOKENS_PER_SECOND
    elif group == "methods":
        matrix = scenario.method_matrix or {}
        cost = COST["methods"] * len(matrix.get("rows", ())) * len(matrix.get("ks", ())) / 16
    else:
        cost = COST[group]
    return cost * repeat


def plan(engines: list[tuple[str, int]], scenarios: list, layers: list[str] | None,
         refused: frozenset = frozenset()) -> list[Unit]:
    """engines: (key, repeat) in run order; `refused`: (key, group) pairs the engine is known
    to refuse at once. Units in plan order: engine, scenario, group."""
    units = []
    for key, repeat in engines:
        for scenario in scenarios:
            # --layers is a filter: each scenario's own layers among those named
            own = [x for x in scenario.layers if layers is None or x in layers]
            for group, held in layer_groups(own):
                cost = REFUSED if (key, group) in refused else unit_cost(group, scenario, repeat)
                units.append(Unit(key, scenario.name, group, held, cost))
    return units


def assign(units: list[Unit], count: int, cold_start: float = COLD_START) -> list[list[Unit]]:
    """Deterministic, balanced shares: the plan order cut into `count` consecutive pieces so
    that the costliest piece, cold starts included, is as cheap as it can be. Consecutive
    pieces keep each engine's units together: a cut inside an engine's units costs one more
    cold start, so the whole run pays at most engines + count - 1 of them. (A linear-partition
    dynamic programme; the earliest cut wins a tie, so every runner computes the same shares.)"""
    n = len(units)
    prefix = [0.0]
    for u in units:
        prefix.append(prefix[-1] + u.cost)
    changes = [0]  # changes[i]: how many times the engine changes within units[:i]
    for i in range(1, n + 1):
        changes.append(changes[-1] + (i > 1 and units[i - 1].engine != units[i - 2].engine))

    def piece(j: int, i: int) -> float:  # units[j:i]: their costs and one cold start per engine
        if i == j:
            return 0.0
        return prefix[i] - prefix[j] + cold_start * (changes[i] - changes[j + 1] + 1)

    best = [piece(0, i) for i in range(n + 1)]  # best[i]: the first i units in one piece
    cuts: list[list[int]] = [[0] * (n + 1)]
    for _ in range(1, count):
        new, cut = [0.0] * (n + 1), [0] * (n + 1)
        for i in range(n + 1):
            new[i], cut[i] = min((max(best[j], piece(j, i)), j) for j in range(i + 1))
        best = new
        cuts.append(cut)
    bounds, i = [], n
    for k in range(count - 1, -1, -1):
        j = cuts[k][i] if k else 0
        bounds.append((j, i))
        i = j
    return [units[j:i] for j, i in reversed(bounds)]


def share_cost(units: list[Unit], cold_start: float = COLD_START) -> float:
    return sum(u.cost for u in units) + cold_start * len({u.engine for u in units})


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def tool_identity() -> dict:
    """The harness's version and a digest of its sources and the worker's: two runners on the
    same commit agree, a runner with edited code does not."""
    files = sorted(p for root in ("conformance", "engines/vllm") for p in (REPO_ROOT / root).rglob("*.py"))
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return {"version": __version__, "sources": h.hexdigest()[:16]}


def goldens_digest(names: list[str], releases: tuple[str, ...]) -> str:
    """Every golden the verdicts and the drift report read, by content."""
    from .golden_store import GOLDENS

    return GOLDENS.digest(names, releases)


def write_results(folder: Path, manifest: dict, done: list[tuple[Unit, dict, dict]]) -> None:
    """done: (unit, its trace, its verdict summary) for each unit of this shard's share."""
    traces = folder / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    for stale in traces.glob("*.json"):  # a folder reused from an earlier run holds only this one's
        stale.unlink()
    entries, verdicts = [], []
    for number, (unit, trace, summary) in enumerate(done, 1):
        name = f"traces/{number:04d}-{_slug(unit.key)}.json"
        data = dumps(trace).encode()
        (folder / name).write_bytes(data)
        # merge checks each trace against its digest: a trace rewritten later is refused
        entries.append({"key": unit.key, "engine": unit.engine, "scenario": unit.scenario,
                        "group": unit.group, "layers": list(unit.layers), "trace": name,
                        "sha256": hashlib.sha256(data).hexdigest()})
        verdicts.append(dict(summary, unit=unit.key))
    (folder / "verdicts.json").write_text(json.dumps(verdicts, indent=2, sort_keys=True) + "\n")
    manifest = dict(manifest, schema=SCHEMA, units=entries)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:100]


def load_results(folders: list[Path]) -> tuple[dict, dict[str, dict]]:
    """Check that `folders` are every shard of one gate run, once each; return the common
    manifest (its `units` those of every shard) and each unit's trace by unit key. Anything else is a ShardError saying which
    folder and what."""
    if not folders:
        raise ShardError("no results folders given")
    manifests = [(folder, _manifest(folder)) for folder in folders]
    first_folder, first = manifests[0]
    for folder, manifest in manifests[1:]:
        for key in IDENTITY:
            if manifest.get(key) != first.get(key):
                raise ShardError(
                    f"{folder} and {first_folder} are not shards of one gate run: they differ in "
                    f"{_IDENTITY_WORDS.get(key, key)} ({_difference(first.get(key), manifest.get(key))}); "
                    "merge the shards of one run, all made by the same commit")
    count = first["count"]
    seen: dict[int, Path] = {}
    for folder, manifest in manifests:
        index = manifest["index"]
        if index in seen:
            raise ShardError(f"shard {index}/{count} given twice: {seen[index]} and {folder}")
        seen[index] = folder
    missing = [i for i in range(1, count + 1) if i not in seen]
    if missing:
        raise ShardError(f"shard{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(f'{i}/{count}' for i in missing)} missing: a merge needs every "
                         f"shard of the run (given: {', '.join(f'{i}/{count}' for i in sorted(seen))})")
    traces: dict[str, dict] = {}
    for folder, manifest in manifests:
        for entry in manifest["units"]:
            if entry["key"] in traces:
                raise ShardError(f"{folder}: unit {entry['key']} was also run by another shard")
            _check_digest(folder / entry["trace"], entry["sha256"])
            try:
                traces[entry["key"]] = load_trace(folder / entry["trace"])
            except TraceError as exc:
                raise ShardError(f"{folder}: unit {entry['key']}: {exc}") from None
    if len(traces) != first["planned"]:
        raise ShardError(f"the shards hold {len(traces)} units; the plan has {first['planned']}")
    merged = dict(first, units=[u for _, m in manifests for u in m["units"]])
    merged.pop("index", None)
    return merged, traces


_IDENTITY_WORDS = {"tool": "tool version", "oracle": "oracle", "pins": "pins",
                   "scenario_set": "scenario set", "goldens": "goldens", "engines": "engines",
                   "layers": "layers", "require_layers": "required layers", "plan": "plan", "device": "device", "count": "shard count"}


def _manifest(folder: Path) -> dict:
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{folder}: not a shard's results folder (no manifest.json); "
                         "make one with `parity gate --shard I/N --results FOLDER`") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ShardError(f"{path}: cannot be read as JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        got = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise ShardError(f"{path}: expected schema {SCHEMA!r}, got {got!r}")
    for key in IDENTITY + ("index", "planned", "units", "scenarios"):
        if key not in manifest:
            raise ShardError(f"{path}: field {key!r} is missing")
    for key in ("index", "count", "planned"):
        if not isinstance(manifest[key], int) or isinstance(manifest[key], bool):
            raise ShardError(f"{path}: field {key!r} must be an integer")
    if not isinstance(manifest["units"], list) or not all(
            isinstance(u, dict) and isinstance(u.get("key"), str) and isinstance(u.get("trace"), str)
            and not Path(u["trace"]).is_absolute() and ".." not in Path(u["trace"]).parts
            and isinstance(u.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", u["sha256"])
            for u in manifest["units"]):
        raise ShardError(f"{path}: field 'units' must list {{key, trace, sha256}} objects with relative "
                         "trace paths and the sha256 of each trace")
    return manifest


def _check_digest(path: Path, expected: str) -> None:
    try:
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise ShardError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if actual != expected:
        raise ShardError(f"{path}: changed after its shard wrote it (sha256 {actual[:16]}..., the "
                         f"manifest says {expected[:16]}...): merge only what the shards wrote")


def _difference(a, b) -> str:
    """Where two manifest values differ, shortly: the first differing item of a list (an
    engine, say) and its differing fields, else both values."""
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                if isinstance(x, dict) and isinstance(y, dict):
                    fields = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                    name = x.get("key") or y.get("key") or f"#{i + 1}"
                    return f"{name}: " + "; ".join(f"{k} {_pair(x.get(k), y.get(k))}" for k in fields)
                return f"item {i + 1}: {_pair(x, y)}"
        if len(a) != len(b):
            longer = a if len(a) > len(b) else b
            return f"{len(a)} vs {len(b)} items; the first unmatched: {_short(longer[min(len(a), len(b))])}"
    return _pair(a, b)


def _pair(a, b) -> str:
    """Two values side by side; two long strings from a little before where they part."""
    if isinstance(a, str) and isinstance(b, str) and max(len(a), len(b)) > 70:
        cut = max(0, len(os.path.commonprefix([a, b])) - 20)
        if cut:
            a, b = "..." + a[cut:], "..." + b[cut:]
    return f"{_short(a)} vs {_short(b)}"


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
