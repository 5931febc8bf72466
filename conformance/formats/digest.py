"""The digest form of a layer: how a production-scale run's `steps` and `outputs` records are
received, kept and written without holding them (design: engines/PROTOCOL.md "Limits", docs/
release-gate.md "Production scale").

A production scenario's steps layer is thousands of records of up to ~26 KB each: 100-300 MB
of JSON, 800 MB as Python objects. The harness never holds it. Each record is judged against its
layer's table as it arrives (record_schema.check_record), digested and dropped (`DigestSink`);
what stays is the layer's digest form, a few hundred KB:

  {"form": "digest/1", "count": N,
   "records": ["<32 hex>", ...]          steps: one digest per record, in order
              [{"digest", "id", "finish_reason", "output_len"}, ...]   outputs: one per request
   "context": [[first record, {field: value}], ...]   steps: the context fields in runs
   "checkpoints": {"0": record, "500": record, ..., "<last>": record}   steps: kept whole, for
                  people and for a window near them; at most CHECKPOINT_BYTES of them
   "summary": {...}                        what the records exercise (never compared)
   "window": {"from": i, "at": n, "records": [...]}   the run's records around its first
                                           difference (at record n) from the digests it was
                                           told to expect, when told
   "problem": "..."}                       the first record not as its table declares: the
                                           layer ends before it (a protocol failure)

A record's digest is BLAKE2b with a 16-byte digest over its canonical JSON (sorted keys, no
spaces, UTF-8, finite numbers): of the record as its table declares it (fields no table names
left out), without its `*_text` fields and, in `steps`, without the context fields (the budgets
each step repeats), which are kept in the clear as runs. That is the projection the comparison's
first-divergence search uses (conformance/judging/compare.py CONTEXT_FIELDS, checked equal by
tests/judging/test_digest.py): the first record whose digest differs is the first differing step. The
harness computes every digest from records it judged itself; no engine sends a digest.

Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque

from conformance.formats.record_schema import RecordError, check_record, without_informational

FORM = "digest/1"
ALGORITHM = ("blake2b-128 of the canonical JSON of the record as its table declares it, without its "
             "*_text fields and (steps) its context fields")
LAYERS = ("steps", "outputs")  # the layers a production scenario keeps in this form
# compare.CONTEXT_FIELDS["steps"]: the budgets a step repeats and the common prefix blocks (which
# follow from the blocks every request holds), compared last
STEP_CONTEXT = frozenset({"token_budget", "input_budget", "drafting_slots_per_request", "num_common_prefix_blocks"})
CHECKPOINT_EVERY = 500
CHECKPOINT_BYTES = 600_000  # checkpoints stop being added past this (deterministic, given the trace)
WINDOW = 2  # records either side of a difference kept whole (compare.WINDOW)
HEX = 32


def canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def split(layer: str, record: dict) -> tuple[dict, dict]:
    """(what is digested, the context kept in the clear) of a checked record."""
    context = STEP_CONTEXT if layer == "steps" else frozenset()
    # informational: the fields the layer's schema declares so, where it declares them (the
    # steps and outputs tables declare none: every key of a record is digested)
    kept = {k: v for k, v in without_informational(layer, record).items() if k not in context}
    return kept, {k: record[k] for k in sorted(context) if k in record}


def digest(layer: str, record: dict) -> str:
    return hashlib.blake2b(canonical(split(layer, record)[0]), digest_size=16).hexdigest()


def entry(layer: str, record: dict) -> str | dict:
    """A record's entry in the form: its digest; an output's with what a reader needs in the clear."""
    d = digest(layer, record)
    if layer != "outputs" or "id" not in record:
        return d if layer != "outputs" else {"digest": d}
    return {"digest": d, "id": record["id"], "finish_reason": record["finish_reason"],
            "output_len": len(record["output_token_ids"])}


def digest_of(entry_: str | dict) -> str:
    return entry_ if isinstance(entry_, str) else entry_["digest"]


def expand_context(runs: list, count: int) -> list[dict]:
    """The context of each record, from its runs."""
    out, value = [], {}
    bounds = [first for first, _ in runs[1:]] + [count]
    for (first, value), end in zip(runs, bounds):
        out += [value] * (end - first)
    return out[:count] + [value] * (count - len(out))


class DigestSink:
    """One layer's records as they arrive, kept in the digest form. `append` judges a record
    against its table, digests it and drops it, keeping only digests, context runs, the
    summary, checkpoints and, given the digests to `expect` (the golden's), the records around
    the first difference from them. A record that is not what its table declares ends the layer
    (`problem`): what follows is not digested, as the full form leaves it out."""

    def __init__(self, layer: str, expect: dict | None = None, keep_last: int = WINDOW):
        self.layer = layer
        self.entries: list = []
        self.context: list = []
        self.checkpoints: dict[str, dict] = {}
        self._checkpoint_bytes = 0
        self.summary = Summary(layer)
        self.problem: str | None = None
        self._ring: deque = deque(maxlen=max(keep_last, WINDOW))  # the last (index, checked record)
        self._expected = [digest_of(e) for e in (expect or {}).get("records", [])] if expect else None
        self._expected_context = expand_context(expect.get("context", []), len(self._expected)) \
            if expect and self.layer == "steps" else None
        self.window: dict | None = None  # the first difference by a record's digest
        self.context_window: dict | None = None  # by its context, when every digest agrees
        self._received = 0

    def __len__(self) -> int:
        return self._received

    def append(self, record) -> None:
        index = self._received
        self._received += 1
        if self.problem is not None:
            return
        try:
            checked = check_record(self.layer, record)
        except RecordError as exc:
            self.problem = f"record #{index}: {exc}"
            return
        item = entry(self.layer, checked)
        self.entries.append(item)
        kept, context = split(self.layer, checked)
        if self.layer == "steps":
            if not self.context or self.context[-1][1] != context:
                self.context.append([index, context])
            self.summary.add(checked)
            if index % CHECKPOINT_EVERY == 0:
                self._checkpoint(index, record)
        else:
            self.summary.add(checked)
        self._watch(index, digest_of(item), context, checked)
        self._ring.append((index, checked))

    def _checkpoint(self, index: int, record) -> None:
        size = len(canonical(record))
        if self._checkpoint_bytes + size <= CHECKPOINT_BYTES:
            self.checkpoints[str(index)] = record
            self._checkpoint_bytes += size

    def _watch(self, index: int, d: str, context: dict, checked: dict) -> None:
        """Keep the records around the first difference from the expected digests."""
        for name, differs in (("window", self._expected is not None and
                               (index >= len(self._expected) or self._expected[index] != d)),
                              ("context_window", self._expected_context is not None and
                               index < len(self._expected_context) and self._expected_context[index] != context)):
            window = getattr(self, name)
            if window is None and differs:
                before = list(self._ring)[-WINDOW:]
                setattr(self, name, {"from": before[0][0] if before else index, "at": index,
                                     "records": [r for _, r in before] + [checked]})
            elif window is not None and index <= window["at"] + WINDOW:
                window["records"].append(checked)

    def finish(self) -> None:
        """The run ended: a run shorter than expected differs where it ends; the last record is
        a checkpoint."""
        if self._expected is not None and self.window is None and self.problem is None \
                and len(self.entries) < len(self._expected):
            last = list(self._ring)[-WINDOW:]
            self.window = {"from": last[0][0] if last else len(self.entries),
                           "at": len(self.entries), "records": [r for _, r in last]}
        if self.layer == "steps" and self._ring and str(self._ring[-1][0]) not in self.checkpoints:
            self._checkpoint_last()

    def _checkpoint_last(self) -> None:
        index, record = self._ring[-1]
        self._checkpoint(index, record)

    def last(self) -> tuple[int, list[dict]]:
        """(index of the first, records) of the last records received, as many as keep_last."""
        ring = list(self._ring)
        return (ring[0][0] if ring else len(self.entries)), [r for _, r in ring]

    def to_json(self) -> dict:
        self.finish()
        out = {"form": FORM, "algorithm": ALGORITHM, "count": len(self.entries), "records": self.entries,
               "summary": self.summary.to_json()}
        if self.layer == "steps":
            out["context"] = self.context
            out["checkpoints"] = self.checkpoints
        for name in ("window", "context_window"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.problem is not None:
            out["problem"] = self.problem
        return out

    def __eq__(self, other) -> bool:  # two runs of one engine: the same records, windows aside
        if not isinstance(other, DigestSink):
            return NotImplemented
        return (self.entries, self.context, self.problem) == (other.entries, other.context, other.problem)

    __hash__ = None  # type: ignore[assignment]


class Summary:
    """What a layer's records exercise, counted as they arrive: the scale tests assert on it and
    a reviewer reads it. Never compared (equal digests give an equal summary)."""

    def __init__(self, layer: str):
        self.layer = layer
        self.counts: dict[str, int] = {}

    def _most(self, key: str, value: int) -> None:
        self.counts[key] = max(self.counts.get(key, 0), value)

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def add(self, record: dict) -> None:
        if "refused" in record and record["refused"] is not None:
            self._count("refused")
            return
        if self.layer == "outputs":
            self._count("requests")
            self._count(f"finished_{record['finish_reason']}")
            self._count("output_tokens", len(record["output_token_ids"]))
            return
        preempted, waiting = record["preempted"], record["waiting"]
        self._count("steps")
        self._count("preemptions", len(preempted))
        self._most("max_preempted_in_one_step", len(preempted))
        self._count("steps_with_3plus_preemptions", len(preempted) >= 3)
        self._count("resumptions", len(record["resumed"]))
        self._count("budget_bound_steps", record["total_num_scheduled_tokens"] == record["token_budget"])
        self._most("max_running", len(record["running"]))
        self._most("max_waiting", len(waiting))
        self._most("max_scheduled_requests", len(record["requests"]))
        # a preempted request goes back to the front of `waiting` (FCFS), ahead of requests
        # that were waiting before: the queue reordered by resumption
        self._count("requeued_ahead_of_waiting",
                    bool(preempted) and bool(waiting) and waiting[0] in preempted and len(waiting) > len(preempted))

    def to_json(self) -> dict:
        return dict(sorted(self.counts.items()))


def check_form(layer: str, form: object, strict: bool = False) -> str | None:
    """What is wrong with a layer's digest form (from a trace or a golden file), or None:
    hex of the right length, the count, ordered context runs, checkpoints keyed by records in
    range and each record as its table declares it (`strict` for a golden: every field named)."""
    if not isinstance(form, dict):
        return f"digests.{layer}: expected an object, got {type(form).__name__}"
    if form.get("form") != FORM:
        return f"digests.{layer}.form: expected {FORM!r}, got {form.get('form')!r}"
    records, count = form.get("records"), form.get("count")
    if not isinstance(records, list) or not isinstance(count, int) or isinstance(count, bool) or count != len(records):
        return f"digests.{layer}: expected `count` equal to the number of `records`"
    for i, item in enumerate(records):
        d = item.get("digest") if isinstance(item, dict) and layer == "outputs" else item
        if not (isinstance(d, str) and len(d) == HEX and all(c in "0123456789abcdef" for c in d)):
            return f"digests.{layer}.records[{i}]: expected {HEX} lowercase hex digits, got {str(d)[:40]!r}"
    if layer == "steps":
        runs = form.get("context", [])
        last = -1
        for j, run in enumerate(runs if isinstance(runs, list) else [None]):
            if not (isinstance(run, list) and len(run) == 2 and isinstance(run[0], int)
                    and last < run[0] < max(count, 1) and isinstance(run[1], dict)):
                return f"digests.{layer}.context[{j}]: expected [first record, {{field: value}}] in order"
            last = run[0]
        checkpoints = form.get("checkpoints", {})
        if not isinstance(checkpoints, dict):
            return f"digests.{layer}.checkpoints: expected an object"
        for key, record in checkpoints.items():
            if not (key.isdigit() and int(key) < count):
                return f"digests.{layer}.checkpoints: key {key[:20]!r} is not a record in range"
            problem = _checked_against(layer, record, records[int(key)], strict)
            if problem:
                return f"digests.{layer}.checkpoints[{key}]: {problem}"
    for name in ("window", "context_window", "oracle_window"):
        window = form.get(name)
        if window is None:
            continue
        if not (isinstance(window, dict) and all(isinstance(window.get(k), int) and not isinstance(window.get(k), bool)
                                                 and window[k] >= 0 for k in ("from", "at"))
                and window["from"] <= window["at"] <= window["from"] + WINDOW
                and isinstance(window.get("records"), list) and len(window["records"]) <= 2 * WINDOW + 1):
            return f"digests.{layer}.{name}: expected {{from, at, records}} of at most {2 * WINDOW + 1} records"
        for k, record in enumerate(window["records"]):
            try:
                check_record(layer, record)
            except RecordError as exc:
                return f"digests.{layer}.{name}.records[{k}]: {exc}"
    if not isinstance(form.get("summary", {}), dict):
        return f"digests.{layer}.summary: expected an object"
    if "problem" in form and not isinstance(form["problem"], str):
        return f"digests.{layer}.problem: expected a string"
    return None


def _checked_against(layer: str, record, expected: str, strict: bool) -> str | None:
    try:
        checked = check_record(layer, record, strict)
    except RecordError as exc:
        return str(exc)
    if digest(layer, checked) != expected:
        return "its digest is not the record's at that place"
    return None


def sinks(layers: list[str], expect: dict | None = None) -> dict[str, DigestSink]:
    """A sink for each of `layers` kept in the digest form, expecting the golden's digests."""
    return {layer: DigestSink(layer, (expect or {}).get(layer)) for layer in layers if layer in LAYERS}
