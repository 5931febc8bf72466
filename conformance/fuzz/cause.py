"""What produced a finding's first difference: the state of the request (or of the step) there,
read from the oracle's records and the scenario, never from the candidate's numbers.

A finding's signature is the verdict's kind and layer.field (conformance/fuzz/search.py
signature) plus this cause, so two bugs that differ on the same field in different states (a
prefill continuation's tokens, a resumed request's tokens) are two findings, and shrinking keeps
only examples with the same cause. The vocabulary stays small, so one bug is not split into many:

- a request (a path `requests.<id>.*`, or an id that one side's list has and the other's not):
  admitted, admitted-chunk, prefill-continuation, prefill-last, padded, decode, verify,
  verify-cut, resumed, preempted, finishing, or unscheduled (absent from the oracle's step);
- a step (any other field): preemption-step, admission-step, idle-step or steady;
- at most two modifiers: budget-bound (the oracle's step used its whole token budget) and, under
  async scheduling, the oracle's delivery of the request's update when it was stale or dropped.

Only the stand-in `steps` layer has a cause; other layers' findings keep their plain signature.
"""

from __future__ import annotations

import re

from conformance.judging.verdict import Verdict

_REQUEST_PATH = re.compile(r"^requests\.([^.\[]+)")


def cause(verdict: Verdict, workload: dict | None, steps: list[dict]) -> str | None:
    """`prefill-continuation+budget-bound`, ...: the cause of the verdict's first difference,
    from the oracle's `steps` records; None outside the steps layer."""
    first = next((c for c in verdict.comparisons if not c.equal and c.first is not None), None)
    if first is None or first.layer != "steps" or first.index is None:
        return None
    record = first.record if isinstance(first.record, dict) else {}
    if "step" not in record or "requests" not in record:
        return None  # a refusal, a record past the oracle's last, or not a whole step record
    before = steps[first.index - 1] if 0 < first.index <= len(steps) else {}
    rid = _request_of(first.first.path, first.first.expected, first.first.actual)
    words = [request_phase(rid, record, before, workload) if rid else step_phase(record)]
    if record.get("total_num_scheduled_tokens") == record.get("token_budget") and record.get("token_budget"):
        words.append("budget-bound")
    entry = (record.get("requests") or {}).get(rid) if rid else None
    if isinstance(entry, dict) and entry.get("delivery") in ("stale", "dropped"):
        words.append(entry["delivery"])
    return "+".join(words)


def _request_of(path: str, expected, actual) -> str | None:
    """The request a difference is about: named in its path, or the first id one side's list has
    and the other's not (new, preempted, finished, ...)."""
    match = _REQUEST_PATH.match(path)
    if match:
        return match[1]
    if isinstance(expected, list) and isinstance(actual, list):
        for item in expected + actual:
            if isinstance(item, str) and (item in expected) != (item in actual):
                return item
    return None


def request_phase(rid: str, record: dict, before: dict, workload: dict | None) -> str:
    """A request's phase at the oracle's step `record` (`before`: the step before it)."""
    if rid in (record.get("preempted") or ()):
        return "preempted"
    entry = (record.get("requests") or {}).get(rid)
    if not isinstance(entry, dict):
        return "finishing" if rid in (record.get("finished") or ()) else "unscheduled"
    if rid in (record.get("resumed") or ()):
        return "resumed"
    prompt = _prompt_len(rid, workload)
    tokens, computed = entry.get("tokens") or 0, entry.get("computed_tokens") or 0
    drafts = entry.get("draft_tokens") or 0
    if rid in (record.get("new") or ()):
        if drafts:
            return "padded"
        return "admitted-chunk" if prompt is not None and computed + tokens < prompt else "admitted"
    if prompt is not None and computed < prompt:
        return "prefill-last" if computed + tokens >= prompt else "prefill-continuation"
    if rid in (record.get("finished") or ()):
        return "finishing"
    if not drafts:
        previous = ((before.get("requests") or {}).get(rid) or {}).get("draft_tokens") or 0
        return "verify-cut" if previous else "decode"
    return "verify"


def step_phase(record: dict) -> str:
    if record.get("preempted"):
        return "preemption-step"
    if record.get("new") or record.get("resumed"):
        return "admission-step"
    if not record.get("total_num_scheduled_tokens"):
        return "idle-step"
    return "steady"


def _prompt_len(rid: str, workload: dict | None) -> int | None:
    """The request's whole prompt (its shared prefix included); None when the scenario has no
    such request or it continues another (its prompt is that turn's chat so far)."""
    prefixes = {p.get("name"): p.get("len", 0) for p in (workload or {}).get("prefixes") or ()}
    for req in (workload or {}).get("requests") or ():
        if req.get("id") == rid and "continues" not in req:
            return req.get("prompt_len", 0) + prefixes.get(req.get("prefix"), 0)
    return None
