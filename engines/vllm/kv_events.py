"""KV cache events and prefix-cache resets as step records carry them (engines/PROTOCOL.md,
"KV cache events" and "Prefix cache resets").

The events are the release's own: with `kv_events_config.enable_kv_cache_events` and the
"null" publisher (nothing goes on a network), vLLM's Scheduler.update_from_output takes the
block pool's events and hands a KVEventBatch to its publisher; `Captured` stands between the
scheduler and that publisher and keeps each batch for the step record. Nothing is built here:
each event is written as JSON, field for field, with one change. A block hash is vLLM's bytes
(sha256 over a pickle, chained from a root that is random per process unless PYTHONHASHSEED
is set), which no port can reproduce and no two runs share: it is written as its number, the
count of distinct hashes the run's events named before it (0 for the first). Two events name
one hash exactly when they carry one number, so a router's view (which blocks are stored
under which parent, which are removed) is judged exactly.
"""

from __future__ import annotations

# The fields written per event type, in vLLM's order. Those every pin fills; 0.33.0's own
# additions (ownership, session_id, lookahead_token_ids) and `locality` are left out: the
# scheduler's block pool leaves them None.
STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "lora_name", "medium",
          "group_idx", "extra_keys", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
REMOVED = ("block_hashes", "medium", "group_idx")


class Captured:
    """vLLM's event publisher, with each batch it is given kept for the step record."""

    def __init__(self, publisher) -> None:
        self.publisher = publisher
        self.batches: list = []

    def publish(self, batch) -> None:
        self.batches.append(batch)
        self.publisher.publish(batch)

    def take(self) -> list:
        """The events of the batches published since the last take, in order."""
        events = [event for batch in self.batches for event in batch.events]
        self.batches = []
        return events

    def __getattr__(self, name):  # shutdown, get_publisher_config: the publisher's own
        return getattr(self.publisher, name)


class HashNumbers:
    """A number per distinct block hash, in the order the run's events first name them."""

    def __init__(self) -> None:
        self.numbers: dict = {}

    def __call__(self, block_hash):
        if block_hash is None:
            return None
        return self.numbers.setdefault(block_hash, len(self.numbers))


def records(events: list, number: HashNumbers) -> list[dict]:
    """The events as the step record carries them (module doc)."""
    out = []
    for event in events:
        kind = type(event).__name__
        fields = {"BlockStored": STORED, "BlockRemoved": REMOVED}.get(kind)
        if fields is None and kind != "AllBlocksCleared":
            raise TypeError(f"a KV cache event of an unknown type: {kind}")
        entry = {"type": kind}
        for name in fields or ():
            value = getattr(event, name)
            if name == "block_hashes":
                value = [number(h) for h in value]
            elif name == "parent_block_hash":
                value = number(value)
            elif name == "token_ids":
                value = [int(t) for t in value]
            elif name == "extra_keys":
                value = _json(value)
            entry[name] = value
        out.append(entry)
    return out


def _json(value):
    """Extra keys as JSON: tuples as lists; strings, integers and null as they are."""
    if value is None or isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    raise TypeError(f"an extra key the records cannot hold: {type(value).__name__}")


def reset(target, options: dict) -> bool:
    """The API server's reset_prefix_cache with the workload's options, through `target`
    (vLLM's EngineCore under the batch-queue loop, the scheduler in the synchronous one)."""
    return bool(target.reset_prefix_cache(reset_running_requests=options.get("reset_running_requests", False),
                                          reset_connector=options.get("reset_connector", False)))
