"""The comparator of a layer kept in the digest form (conformance/formats/digest.py): a
production-scale run's `steps` and `outputs`.

The first record whose digest differs from the golden's is the first differing record: every
record before it is equal, field for field (the digest covers what the comparison compares).
Where every digest agrees, the context runs (the budgets a step repeats) decide, as the full
form's comparison lets them decide last. That index is found in microseconds and is exact.

The fields at that record need both sides' records there. The candidate's are in its trace: the
harness kept them as they arrived (`window`), told the golden's digests. The oracle's come from
the golden's checkpoints, or from a live replay of the pinned oracle up to that step
(`oracle_window`, attached by conformance/gate/replay.py), each record checked against the
golden's digest at its place, so the records shown are provably the golden's oracle's. Then the
full form's comparison (compare.compare_layer) runs on the window and names the field, both
values and every request's state. Without the oracle's records, the comparison still names the
record and says what it takes to see its fields.
"""

from __future__ import annotations

from conformance.formats.digest import WINDOW, digest, digest_of, expand_context
from conformance.judging.compare import FieldDiff, LayerComparison, compare_layer

REPLAY = ("the oracle's records there need a live replay of the pinned oracle up to that step "
          "(`parity compare --replay`, on a machine with the oracle's environment; the gate replays "
          "it by itself)")


def compare_digest_layer(layer: str, expected: dict, actual: dict) -> LayerComparison:
    """The golden's digest form of `layer` against a run's."""
    e = [digest_of(x) for x in expected["records"]]
    a = [digest_of(x) for x in actual["records"]]
    result = LayerComparison(layer, False, expected_count=len(e), actual_count=len(a))
    index = next((i for i, (x, y) in enumerate(zip(e, a)) if x != y), None)
    if index is None and len(e) != len(a):
        index = min(len(e), len(a))
    window_name, context = "window", None
    if index is None:  # every record equal but its context, perhaps
        ec, ac = (expand_context(f.get("context", []), len(e)) for f in (expected, actual))
        index = next((i for i, (x, y) in enumerate(zip(ec, ac)) if x != y), None)
        window_name = "context_window"
        context = None if index is None else (ec[index], ac[index])
    if index is None:
        result.equal = True
        return result
    result.index = index
    result.window = (max(0, index - WINDOW), index + WINDOW + 1)
    oracle = _oracle_records(layer, expected, e)
    mine = _own_records(layer, actual, a, window_name)
    result.record, result.actual_record = oracle.get(index), mine.get(index)
    if index >= min(len(e), len(a)):  # one side ended: the full form says no more
        which, extra = ("candidate", len(a) - index) if len(a) > len(e) else ("oracle", len(e) - index)
        result.fields = [FieldDiff("<record count>", len(e), len(a))]
        result.explanation = f"the {which} has {extra} more record{'s' if extra != 1 else ''}, from #{index} on"
        return result
    replayed = expected.get("oracle_window") or {}
    if index in oracle and index in mine:
        result = _fields(layer, result, oracle, mine, index)
        if "seconds" in replayed and not result.evidence:
            result.evidence = (f"the oracle's records replayed live from step 0 to step "
                               f"{replayed['from'] + len(replayed['records']) - 1} in {replayed['seconds']} s, "
                               "each checked against the golden's digest")
        return result
    near = [int(k) for k in expected.get("checkpoints", {}) if int(k) <= index]
    nearest = f"; nearest checkpoint of the golden: record {max(near)}" if near else ""
    own = "" if index in mine else "; the run's own records there were not kept (it ran without the golden's digests)"
    why = replayed.get("problem") or REPLAY
    if context:  # the digests agree: a budget the step repeats, kept in the clear, differs
        result.fields = [_context_difference(*context)]
        result.explanation = (f"record {index} differs in a budget it repeats, its other fields equal by "
                              f"digest; its whole record: {why}{nearest}{own}")
    else:
        result.fields = [_digest_difference(expected, actual, index)]
        result.explanation = f"record {index} differs by its digest, its fields unknown here: {why}{nearest}{own}"
    result.evidence = result.explanation
    return result


def _digest_difference(expected: dict, actual: dict, index: int) -> FieldDiff:
    """What the digest form itself says of the first differing record: an output's id, finish
    reason and length are in the clear; otherwise the record's digest."""
    e, a = expected["records"][index], actual["records"][index]
    if isinstance(e, dict) and isinstance(a, dict):
        for key in ("id", "finish_reason", "output_len"):
            if e.get(key) != a.get(key):
                return FieldDiff(key, e.get(key), a.get(key))
        return FieldDiff("output_token_ids", f"digest {e['digest']}", f"digest {a['digest']}")
    return FieldDiff("<digest>", digest_of(e), digest_of(a))


def _context_difference(expected: dict, actual: dict) -> FieldDiff:
    """The first context field (a budget the step repeats) whose values differ, both values."""
    key = next(k for k in sorted(set(expected) | set(actual)) if expected.get(k) != actual.get(k))
    return FieldDiff(key, expected.get(key, "<absent>"), actual.get(key, "<absent>"))


def _oracle_records(layer: str, expected: dict, digests: list[str]) -> dict[int, dict]:
    """index -> the oracle's record: the golden's checkpoints and a replayed window, each kept
    only where its digest is the golden's at its place."""
    out = {int(k): r for k, r in expected.get("checkpoints", {}).items()}
    window = expected.get("oracle_window")
    if isinstance(window, dict):
        out.update((window["from"] + i, r) for i, r in enumerate(window["records"]))
    return {i: r for i, r in out.items() if i < len(digests) and _digest_or_none(layer, r) == digests[i]}


def _own_records(layer: str, actual: dict, digests: list[str], name: str) -> dict[int, dict]:
    """index -> the run's record kept in its window, where it is the record its digest names."""
    window = actual.get(name)
    if not isinstance(window, dict):
        return {}
    out = {window["from"] + i: r for i, r in enumerate(window["records"])}
    return {i: r for i, r in out.items() if i < len(digests) and _digest_or_none(layer, r) == digests[i]}


def _digest_or_none(layer: str, record) -> str | None:
    try:
        return digest(layer, record)
    except (TypeError, ValueError, AttributeError):
        return None


def _fields(layer: str, result: LayerComparison, oracle: dict, mine: dict, index: int) -> LayerComparison:
    """The full form's comparison on the records both sides have around `index`, renumbered to
    the layer's records."""
    lo = index
    while lo > max(0, index - WINDOW) and lo - 1 in oracle and lo - 1 in mine:
        lo -= 1
    expected, actual = _run_from(oracle, lo, index + WINDOW), _run_from(mine, lo, index + WINDOW)
    window = compare_layer(layer, expected, actual)
    result.fields = window.fields
    result.window = (lo, lo + max(len(expected), len(actual)))
    result.explain_later(expected, actual, lo)  # numbered as the layer's records
    if window.index is None or lo + window.index != index:  # cannot be, unless a digest collides
        result.evidence = (f"the digests differ first at record {index}, the records kept there at "
                           f"{'none' if window.index is None else lo + window.index}")
    return result


def _run_from(records: dict, lo: int, hi: int) -> list[dict]:
    """records[lo], records[lo + 1], ... while present, up to records[hi]."""
    out = []
    while lo <= hi and lo in records:
        out.append(records[lo])
        lo += 1
    return out


def truncated(form: dict, count: int) -> dict:
    """The first `count` records of a digest form (a failed run's records are compared with the
    golden's first ones)."""
    out = dict(form, records=form["records"][:count], count=min(count, form["count"]))
    if "context" in form:
        out["context"] = [run for run in form["context"] if run[0] < max(count, 1)]
    out["checkpoints"] = {k: r for k, r in form.get("checkpoints", {}).items() if int(k) < count}
    return out
