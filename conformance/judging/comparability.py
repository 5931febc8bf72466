"""Benchmark comparability guard: two engines' throughput figures may be compared only when
they ran the same scenario under equal per-step token budgets.

The seed's DFlash throughput rows compared the port (4096 tokens per step) with vLLM 0.27.1
(4036): a comparison this guard refuses, with the reason.
"""

from __future__ import annotations

from conformance.formats.trace import Trace

BUDGET_FIELDS = ("max_num_batched_tokens", "max_num_scheduled_tokens")
STEP_BUDGET_FIELDS = ("token_budget", "input_budget")


class NotComparable(ValueError):
    """The two runs' throughput figures must not be compared; the message says why."""


def check_comparable(a: Trace, b: Trace) -> None:
    """Raise NotComparable unless traces a and b share the scenario and per-step budgets."""
    name_a, name_b = a.label, b.label
    if a.sha256 != b.sha256:
        raise NotComparable(f"{name_a} ran scenario {a.scenario_name} and {name_b} ran "
                            f"{b.scenario_name} (different scenario hashes)")
    config_a = (a.layers.get("config") or [{}])[0]
    config_b = (b.layers.get("config") or [{}])[0]
    for field in BUDGET_FIELDS:
        if config_a.get(field) != config_b.get(field):
            raise NotComparable(f"unequal per-step token budgets on {a.scenario_name}: "
                                f"{field} is {config_a.get(field)} for {name_a} and "
                                f"{config_b.get(field)} for {name_b}")
    steps_a, steps_b = a.layers.get("steps") or [], b.layers.get("steps") or []
    for sa, sb in zip(steps_a, steps_b):
        for field in STEP_BUDGET_FIELDS:
            if sa.get(field) != sb.get(field):
                raise NotComparable(f"unequal per-step token budgets on {a.scenario_name} at "
                                    f"step {sa.get('step')}: {field} is {sa.get(field)} for {name_a} "
                                    f"and {sb.get(field)} for {name_b}")
