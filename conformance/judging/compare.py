"""Comparison: is a candidate's trace equal to the golden, and if not, where does it first differ?

Whole-layer equality is plain `==` (cheap). Only on a mismatch is the first divergent record
located, its fields listed, and a window of records around it explained with DeepDiff; DeepDiff
never sees the whole trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conformance.formats.record_schema import without_informational
from conformance.formats.refusal import record_meaning

# Fields reported first when a record differs in several: the budget comes before its causes.
PRIMARY_FIELDS = (
    "refused", "max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_seqs",
    "num_speculative_tokens", "drafting_slots_per_request", "num_lookahead_tokens",
)
WINDOW = 2  # records either side of the first divergence that are explained
# Per-step budget fields repeat the configuration on every step, so when budgets differ every
# step differs. The first divergence is looked for in the scheduling decisions first; these
# fields decide it only when nothing else differs. They are still listed at that step.
CONTEXT_FIELDS = {
    # num_common_prefix_blocks follows from the blocks every request holds (and 0.33.0 always
    # sends []): it decides a divergence only where nothing else differs
    "steps": frozenset({"token_budget", "input_budget", "drafting_slots_per_request",
                        "num_common_prefix_blocks"}),
    # the engine layers add the worker's capacity and what it ran: consequences, not decisions
    "engine_steps": frozenset({"token_budget", "input_budget", "drafting_slots_per_request",
                               "max_num_batched_tokens", "target_forward_tokens",
                               "drafter_forward_tokens"}),
}

# Recorded after a step's update (engines/PROTOCOL.md, `steps`): compared like every decision,
# so the first divergence falls on the step where the state first differs. Within that step a
# differing decision (block ids, prefix-cache hits, the drafts scheduled, admissions, aborts) is
# named first, then these in this order (the drafts accepted, then the state they led to, then
# the drafts the stand-in made after the step), the budget context last. Under async scheduling
# an update also says what became of each request's output (`delivery`: applied, stale,
# dropped) and leaves its output placeholders: named after the drafts accepted, before the
# state they led to (`iteration` and `update_iteration` rank as decisions).
AFTER_UPDATE = ("accepted_draft_tokens", "delivery", "output_placeholders", "computed_tokens",
                "output_tokens", "emitted", "kv_blocks", "kv_events", "waiting", "running", "next_draft_token_ids")


@dataclass
class FieldDiff:
    path: str
    expected: Any
    actual: Any


@dataclass
class LayerComparison:
    layer: str
    equal: bool
    index: int | None = None  # first divergent record (a step, for the steps layer)
    fields: list[FieldDiff] = field(default_factory=list)
    expected_count: int = 0
    actual_count: int = 0
    window: tuple[int, int] = (0, 0)
    record: dict | None = None  # the oracle's record at the divergence (names its step or row)
    actual_record: dict | None = None  # the candidate's record there
    # engine layers only (conformance/judging/numerics.py): why the runs differ, e.g. "scheduling",
    # "acceptance", "numerics", "logprobs", "mismatch"
    cause: str = ""
    # engine layers: the evidence behind the cause, in one sentence (an acceptance difference
    # names its step, request, draft position and the oracle's top-1 margin there)
    evidence: str = ""

    # What the window says in DeepDiff's words, made when first read: DeepDiff costs tens of
    # milliseconds a window, and most reports never show it (a stand-in's, a config layer's, drift's).
    _explanation: str = field(default="", repr=False, compare=False)
    _windows: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def explanation(self) -> str:
        if self._windows is not None:
            self._explanation, self._windows = explain(*self._windows), None
        return self._explanation

    @explanation.setter
    def explanation(self, text: str) -> None:
        self._explanation, self._windows = text, None

    def explain_later(self, expected: list, actual: list, offset: int) -> None:
        """The explanation of these windows, made by DeepDiff when it is first read."""
        self._windows = (expected, actual, offset)

    @property
    def first(self) -> FieldDiff | None:
        return self.fields[0] if self.fields else None

    @property
    def where(self) -> str:
        """Where the layer first differs, as a reader names it: a methods row like dflash/K=8, a
        step number, or the record's number (the oracle's record, else the candidate's)."""
        record = next((r for r in (self.record, self.actual_record) if isinstance(r, dict)), {})
        if "row" in record:
            return f"row {record['row']}"
        if "step" in record:
            return f"step {record['step']}"
        return f"record {self.index}"


def compare_layer(layer: str, expected: list[dict], actual: list[dict]) -> LayerComparison:
    # a refused configuration is compared by its meaning (conformance/formats/refusal.py): the
    # exception vLLM raised and vLLM's words, whatever wrapper either side kept
    expected, actual = _meanings(expected), _meanings(actual)
    if layer in LOOKAHEAD_LAYERS:
        actual = _lookahead(expected, actual)
    result = LayerComparison(layer, expected == actual, expected_count=len(expected),
                             actual_count=len(actual))
    if result.equal:  # the cheap path: plain equality of the whole layer
        return result
    context = CONTEXT_FIELDS.get(layer, frozenset())
    index = _first(layer, expected, actual, context)
    by_decision = index is not None
    if index is None:
        index = _first(layer, expected, actual, frozenset())
    if index is None:
        result.equal = True  # only informational wording differs
        return result
    result.index = index
    result.record = expected[index] if index < len(expected) else None
    result.actual_record = actual[index] if index < len(actual) else None
    if index < min(len(expected), len(actual)):
        result.fields = field_diffs(expected[index], actual[index], layer=layer)
        if by_decision:  # the decision that differs first, then what followed, the budget last
            result.fields.sort(key=lambda f: _rank(f.path, context))
    else:
        which = "candidate" if len(actual) > len(expected) else "oracle"
        result.fields = [FieldDiff("<record count>", len(expected), len(actual))]
        extra = max(len(expected), len(actual)) - index
        result.explanation = f"the {which} has {extra} more record{'s' if extra != 1 else ''}, from #{index} on"
    lo, hi = max(0, index - WINDOW), index + WINDOW + 1
    result.window = (lo, hi)
    if not result.explanation:
        result.explain_later(expected[lo:hi], actual[lo:hi], lo)
    return result


# `num_lookahead_tokens` is the scheduler's lookahead slots per request; an engine with none may
# send null (engines/PROTOCOL.md), which means 0 slots, vLLM's value without a drafter: equal to 0.
LOOKAHEAD_LAYERS = ("config", "engine_config")


def _lookahead(expected: list, actual: list) -> list:
    """The candidate's records, a null `num_lookahead_tokens` read as 0 where the oracle's is 0
    (any other difference is shown as sent)."""
    def read(e, a):
        if (isinstance(e, dict) and isinstance(a, dict) and type(e.get("num_lookahead_tokens")) is int
                and e["num_lookahead_tokens"] == 0
                and "num_lookahead_tokens" in a and a["num_lookahead_tokens"] is None):
            return dict(a, num_lookahead_tokens=0)
        return a
    return [read(e, a) for e, a in zip(expected, actual)] + actual[len(expected):]


def _meanings(records: list) -> list:
    if not any(isinstance(r, dict) and isinstance(r.get("refused"), dict) for r in records):
        return records
    return [record_meaning(r) if isinstance(r, dict) else r for r in records]


def field_diffs(expected: Any, actual: Any, path: str = "", layer: str = "") -> list[FieldDiff]:
    """Leaf-level differences between two records, primary budget fields first; with `layer`,
    without the fields its schema declares informational (formats/record_schema.py)."""
    out: list[FieldDiff] = []
    if layer:
        expected, actual = without_informational(layer, expected), without_informational(layer, actual)
    _walk(expected, actual, path, out)
    rank = {name: i for i, name in enumerate(PRIMARY_FIELDS)}
    return sorted(out, key=lambda d: (rank.get(d.path.split(".")[0].split("[")[0], len(rank)), d.path))




def _rank(path: str, context: frozenset) -> int:
    top, leaf = path.split(".")[0].split("[")[0], path.rsplit(".", 1)[-1].split("[")[0]
    if top in context:
        return len(AFTER_UPDATE) + 1
    name = top if top in AFTER_UPDATE else leaf
    return 1 + AFTER_UPDATE.index(name) if name in AFTER_UPDATE else 0


def _first(layer: str, expected: list, actual: list, skip: frozenset) -> int | None:
    """Index of the first record that differs outside `skip` (top-level context fields) and the
    fields the layer's schema declares informational."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e != a and _compared(layer, e, skip) != _compared(layer, a, skip):
            return i
    return min(len(expected), len(actual)) if len(expected) != len(actual) else None


def _compared(layer: str, record: Any, skip: frozenset) -> Any:
    record = without_informational(layer, record)
    if isinstance(record, dict) and skip:
        return {k: v for k, v in record.items() if k not in skip}
    return record


def _walk(e: Any, a: Any, path: str, out: list[FieldDiff]) -> None:
    if e == a:
        return
    if isinstance(e, dict) and isinstance(a, dict):
        for key in sorted(set(e) | set(a)):
            _walk(e.get(key, "<absent>"), a.get(key, "<absent>"), f"{path}.{key}" if path else key, out)
    elif isinstance(e, list) and isinstance(a, list) and len(e) == len(a) and not _is_lines(e):
        for i, (x, y) in enumerate(zip(e, a)):
            _walk(x, y, f"{path}[{i}]", out)
    else:
        out.append(FieldDiff(path or "<record>", e, a))


def _is_lines(value: list) -> bool:
    # Log lines are compared as one list, so the report can show them side by side.
    return bool(value) and all(isinstance(v, str) for v in value)


def explain(expected: list, actual: list, offset: int) -> str:
    """DeepDiff of a small window only; index paths are shifted to the trace's own numbering."""
    from deepdiff import DeepDiff

    diff = DeepDiff({offset + i: r for i, r in enumerate(expected)},
                    {offset + i: r for i, r in enumerate(actual)}, verbose_level=2)
    return diff.pretty()
