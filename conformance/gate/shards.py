"""Sharding the gate across runners: the gate's work as units, and each runner's share of them.

A unit is one engine on one scenario for one layer group. The layers an engine computes
together stay in one unit (steps and outputs come from one drive of the scheduler, the three
engine layers from one engine run), so no shard repeats another's work.

Shares are balanced by estimated cost, and every engine a shard runs costs it one cold start
(its warm worker), so each share is a consecutive piece of the plan: an engine's units stay
together, split only where balance needs it. The plan depends only on the engines, the scenarios, the layers and the shard
count, so every runner of a CI matrix computes the same plan and takes its own share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conformance.formats.errors import InputError
from conformance.formats.protocol import ENGINE_LAYERS

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


class ShardError(InputError):
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
        table = scenario.method_matrix or {}
        cost = COST["methods"] * len(table.get("rows", ())) * len(table.get("ks", ())) / 16
    else:
        cost = COST[group]
    return cost * repeat


def plan(engines: list[tuple[str, int]], scenarios: list, layers: list[str] | None,
         refused: frozenset = frozenset()) -> list[Unit]:
    """engines: (key, repeat) in run order (repeat 0: the engine is read, not run); `refused`:
    (key, group) pairs the engine is known to refuse at once. Units in plan order: engine,
    scenario, group."""
    units = []
    for key, repeat in engines:
        for scenario in scenarios:
            # --layers is a filter: each scenario's own layers among those named
            own = [x for x in scenario.layers if layers is None or x in layers]
            for group, held in layer_groups(own):
                cost = REFUSED * bool(repeat) if (key, group) in refused else unit_cost(group, scenario, repeat)
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
    # an engine whose units cost nothing (a pin read from its goldens) starts no process
    return sum(u.cost for u in units) + cold_start * len({u.engine for u in units if u.cost})
