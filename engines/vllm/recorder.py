"""RecordingScheduler: the pinned release's real Scheduler, recording every step it takes.

A subclass of `vllm.v1.core.sched.scheduler.Scheduler` that changes nothing about
scheduling: `schedule()` and `update_from_output()` call the release's own code and only
read what it decided. It is importable by qualified name, so a real engine can run it:

    --scheduler-cls engines.vllm.recorder.RecordingScheduler   (with async scheduling off)

with VLLM_PARITY_RECORD_PATH=/some/file.jsonl, where each step is appended as one JSON line.
On CPU, engines/vllm/steps_layer.py drives it with a deterministic stand-in instead of a
model and reads `parity_steps`.

One record per schedule() call, completed by the update_from_output() for that output:

    {"step": n,                         # 0, 1, 2 ... schedule() calls of this scheduler
     "total_num_scheduled_tokens": int,
     "token_budget": int,               # scheduler.max_num_scheduled_tokens
     "input_budget": int,               # only on releases with a per-step input budget
     "drafting_slots_per_request": int, #   (0.28.0+): max_num_batched_tokens, and the
                                        #   slots each scheduled request is charged
     "requests": {req_id: {             # the requests scheduled this step
         "tokens": int, "draft_tokens": int,       # what schedule() gave it
         "accepted_draft_tokens": int,             # drafts the sampled tokens accepted
         "computed_tokens": int,                   # num_computed_tokens after the update
         "output_tokens": int,                     # num_output_tokens after the update
         "kv_blocks": int,                         # KV blocks it holds after the update
         # identities (steps only; EngineRecordingScheduler leaves them out):
         "block_ids": [[int]] | None,              # the scheduler output's block ids for it
         "cached_tokens": int,                     # prefix-cache hit at its admission, else 0
         "draft_token_ids": [int],                 # the drafts scheduled (-1: placeholders)
         "resent_token_ids": bool,                 # the output carries all its token ids
         "next_draft_token_ids": [int],            # its drafts after update_draft_token_ids
         "proposed_draft_token_ids": [int]}},      # grammar requests only: the drafts proposed,
                                                   #   before the grammar's cut (validate_tokens)
     "new": [ids], "resumed": [ids], "preempted": [ids],   # sorted
     "finished": [ids],                 # sorted; finished in this step's update_from_output
     "kv_blocks": {"free": int, "used": int,    # the block pool after the update; "used" is
                   "cached": int},      #   every block but the free ones and the null block;
                                        #   "cached": blocks holding a prefix-cache hash (steps
                                        #   only); engine_steps: "free" only under
                                        #   num_gpu_blocks_override
     "waiting": [ids],                  # after the update, in the order the scheduler takes
                                        #   them (its side queue first, then `waiting`)
     "running": [ids],                  # after the update, in the running queue's order
     # identities (steps only):
     "aborted": [ids],                  # sorted; finish_requests() before this schedule()
     "emitted": [ids],                  # sorted; those update_from_output() made an output for
     "num_common_prefix_blocks": [int], # the scheduler output's, per KV cache group
     "grammar_errors": [ids],           # only where the workload has grammars: sorted; the
                                        #   scheduler's grammar_compile_error_reqs after
                                        #   schedule() (finished as errors by this update), and
                                        #   requests refused before the scheduler at this step
     "kv_events": [event],              # only with KV cache events on: the events vLLM
                                        #   published at this step's update (kv_events.py)
     "prefix_cache_reset": bool | None, # only where the workload has resets: the result of
                                        #   the reset before this schedule(), else null
     # only where the workload has encoder inputs (steps only):
     "encoder_inputs": {req_id: [int]}, # the output's scheduled_encoder_inputs: the items (their
                                        #   indices in the request's encoder_inputs) whose
                                        #   encoder runs this step
     "freed_encoder_inputs": [hash],    # the output's free_encoder_mm_hashes, in its order: the
                                        #   items evicted from the encoder cache by this schedule()
     "encoder_cache": {"free": int,     # the encoder cache manager after the update: slots
                       "freeable": int}}  #   (tokens) free now, and free or held by no request

The state fields are read after update_from_output(), so a step's record says what the
scheduler decided and what it then held: the first divergence falls on the step where the
state first differs, not steps later where a decision finally shows it. The identities are
read from the scheduler's own output and request state (engines/PROTOCOL.md, `steps`), never
recomputed; lines written to VLLM_PARITY_RECORD_PATH go out at the update, before the drafts,
so they carry no next_draft_token_ids.

Only JSON types, nothing from the clock or from object identity. Id lists are copied as vLLM
holds them (ints, on every pin); the protocol's writers write an integer of any other type as
its int (conformance/formats/protocol.py `integer`).
"""

from __future__ import annotations

import json
import operator
import os
import sys

from vllm.v1.core.sched.scheduler import Scheduler

from conformance.formats.protocol import integer
from engines.vllm.release import charges_drafting_per_step

RECORD_PATH_ENV = "VLLM_PARITY_RECORD_PATH"

PER_STEP_INPUT_BUDGET = charges_drafting_per_step()


class RecordingScheduler(Scheduler):
    """The release's Scheduler, unchanged, plus a record of each step (see module doc)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parity_steps: list[dict] = []
        # where each finished record goes: kept in parity_steps, unless a driver streams them
        # (steps_layer.iter_steps sends each one on and keeps none)
        self.parity_sink = self.parity_steps.append
        self._parity_last: dict | None = None  # the record last finished, wherever it went
        self._parity_next_step = 0
        # (scheduler_output, open record) in schedule() order; update_from_output() calls
        # come back in the same order, also under a batch queue.
        self._parity_open: list[tuple[object, dict]] = []
        self._parity_aborted: list[str] = []  # aborted since the last schedule()
        # a workload with grammars (steps_layer sets these): the grammar fields are recorded,
        # with the requests refused before the scheduler at the coming step
        self.parity_grammar = False
        self.parity_refused: list[str] = []
        self.parity_encoder = False  # a workload with encoder inputs: their fields are recorded
        self._parity_proposed: dict[str, list[int]] = {}
        self._parity_record_path = os.environ.get(RECORD_PATH_ENV)  # read once, not at each step
        # KV cache events (engines/vllm/kv_events.py): the batches vLLM publishes, kept per step
        self._parity_events = None
        if getattr(self, "enable_kv_cache_events", False):
            from engines.vllm.kv_events import Captured, HashNumbers

            self.kv_event_publisher = self._parity_events = Captured(self.kv_event_publisher)
            self._parity_hashes = HashNumbers()
        # a workload with prefix-cache resets (steps_layer sets it): each record says the result
        # of the reset before its schedule(), null where there was none
        self.parity_resets = False
        self._parity_reset: bool | None = None
        pool = self.kv_cache_manager.block_pool
        self._parity_cached = CachedBlocks(pool)
        # references to the null block with no request holding it (NullBlocks)
        self._parity_nulls = NullBlocks(pool.null_block)
        self._parity_nulls.calibrate()

    def schedule(self, *args, **kwargs):
        output = super().schedule(*args, **kwargs)
        record = self._parity_record(output)
        self._parity_identities(output, record)
        self._parity_open.append((output, record))
        return output

    def reset_prefix_cache(self, *args, **kwargs):
        result = super().reset_prefix_cache(*args, **kwargs)
        self._parity_reset = bool(result)
        return result

    def finish_requests(self, request_ids, finished_status):
        finished = super().finish_requests(request_ids, finished_status)
        self._parity_aborted.extend(str(req.request_id) for req in finished)
        return finished

    def update_draft_token_ids(self, draft_token_ids) -> None:
        if self.parity_grammar:  # only grammar requests record the drafts proposed
            self._parity_proposed = {str(rid): list(drafts) for rid, drafts in
                                     zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)}
        super().update_draft_token_ids(draft_token_ids)
        if self._parity_last is not None:
            self._parity_next_drafts(self._parity_last)

    def update_from_output(self, scheduler_output, model_runner_output):
        # The requests this update finishes are the ones it frees: vLLM's _free_request adds each
        # to finished_req_ids (whose lines no generated mutant edits, adequacy_scope.toml), and a
        # request that stops without finishing (a streaming session's chunk) is not freed. Read
        # from that set, not from every request's status before and after the update.
        freed = set(self.finished_req_ids)
        # The Request objects of this step: a request that finishes leaves self.requests.
        scheduled = {rid: self.requests.get(rid) for rid in scheduler_output.num_scheduled_tokens}
        accepted = _accepted_drafts(scheduler_output, model_runner_output)
        seen = self._parity_observe(scheduler_output, model_runner_output)
        result = super().update_from_output(scheduler_output, model_runner_output)
        record = None
        for i, (output, rec) in enumerate(self._parity_open):
            if output is scheduler_output:
                record = self._parity_open.pop(i)[1]
                break
        if record is None:  # an output this scheduler did not make; record it all the same
            record = self._parity_record(scheduler_output)
        record["finished"] = sorted(map(str, self.finished_req_ids - freed))
        entries = record["requests"]
        held = self._parity_blocks_held()
        for rid, req in scheduled.items():
            entry = entries[str(rid)]
            entry["accepted_draft_tokens"] = accepted.get(rid, 0)
            if req is not None:
                entry["computed_tokens"] = int(req.num_computed_tokens)
                entry["output_tokens"] = int(req.num_output_tokens)
            entry["kv_blocks"] = held(rid)
        for rid, fields in seen.pop("requests", {}).items():
            record["requests"][rid].update(fields)
        record.update(seen)
        record.update(self._parity_state())
        self._parity_identities_after(record, result)
        self._parity_after_update(record)
        self._parity_last = record  # its next_draft_token_ids come after, in update_draft_token_ids()
        self.parity_sink(record)
        path = self._parity_record_path
        if path:
            line = dict(record, requests={rid: {k: v for k, v in entry.items() if k != "next_draft_token_ids"}
                                          for rid, entry in record["requests"].items()})
            with open(path, "a", encoding="utf-8") as out:  # integers of other types as protocol.encode writes them
                out.write(json.dumps(line, sort_keys=True, separators=(",", ":"), default=integer) + "\n")
        return result

    # -- identities: which blocks, hits and drafts (steps records only) -----------------------

    def _parity_identities(self, output, record: dict) -> None:
        """What schedule() handed each request, read from its output: block ids, prefix-cache
        hits at admission, the drafts scheduled, whether all its token ids were resent; and
        the aborts before it and the common prefix blocks. Id lists are copied as they are
        (`list`): the protocol's writers write any integer type as a JSON integer."""
        spec_tokens = output.scheduled_spec_decode_tokens or {}
        entries = record["requests"]
        for rid, entry in entries.items():
            entry["draft_token_ids"] = list(spec_tokens.get(rid, ()))
            entry["resent_token_ids"] = False
            entry["next_draft_token_ids"] = []  # until update_draft_token_ids() says otherwise
        for data in output.scheduled_new_reqs:
            entry = entries[str(data.req_id)]
            entry["block_ids"] = _block_ids(data.block_ids)
            entry["cached_tokens"] = int(data.num_computed_tokens)
        cached = output.scheduled_cached_reqs
        if cached.req_ids:
            resumed = set(record["resumed"])
            resent = cached.all_token_ids or {}
            for rid, groups, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
                entry = entries[str(rid)]
                entry["block_ids"] = None if groups is None else list(map(list, groups))
                # a running request never gets new hits; a resumed one is admitted again
                entry["cached_tokens"] = int(computed) if str(rid) in resumed else 0
                entry["resent_token_ids"] = rid in resent
        record["aborted"] = sorted(self._parity_aborted)
        self._parity_aborted = []
        record["num_common_prefix_blocks"] = list(output.num_common_prefix_blocks or ())
        if getattr(self, "needs_kv_cache_zeroing", False):  # a hybrid mamba model's KV cache
            record["zeroed_block_ids"] = sorted(map(int, output.new_block_ids_to_zero or ()))
        if self.parity_resets:
            record["prefix_cache_reset"] = self._parity_reset
        self._parity_reset = None
        if self.parity_grammar:
            from engines.vllm.grammar import errors

            record["grammar_errors"] = sorted(set(errors(self)) | set(self.parity_refused))
            self.parity_refused = []
            for rid, entry in entries.items():
                if self._parity_uses_grammar(rid):
                    entry["proposed_draft_token_ids"] = []  # until update_draft_token_ids() says otherwise

        if self.parity_encoder:
            record["encoder_inputs"] = {str(rid): list(items) for rid, items in
                                        (output.scheduled_encoder_inputs or {}).items()}
            record["freed_encoder_inputs"] = list(map(str, output.free_encoder_mm_hashes or ()))

    def _parity_identities_after(self, record: dict, result) -> None:
        """After the update: the requests it emitted an output for, and the cached blocks."""
        record["emitted"] = sorted({str(out.request_id) for outputs in (result or {}).values()
                                    for out in outputs.outputs})
        record["kv_blocks"]["cached"] = self._parity_cached.count()
        if self._parity_events is not None:
            from engines.vllm.kv_events import records

            record["kv_events"] = records(self._parity_events.take(), self._parity_hashes)
        if self.parity_encoder:
            cache = self.encoder_cache_manager
            record["encoder_cache"] = {"free": int(cache.num_free_slots), "freeable": int(cache.num_freeable_slots)}

    def _parity_next_drafts(self, record: dict) -> None:
        """Each request's drafts as the scheduler kept them after update_draft_token_ids()
        (none for a finished request or one still prefilling)."""
        requests = self.requests
        for rid, entry in record["requests"].items():
            req = requests.get(rid)
            entry["next_draft_token_ids"] = [] if req is None or req.is_finished() else list(req.spec_token_ids)
        if self.parity_grammar:
            for rid, entry in record["requests"].items():
                if "proposed_draft_token_ids" in entry:
                    entry["proposed_draft_token_ids"] = self._parity_proposed.get(rid, [])
        self._parity_proposed = {}

    def _parity_uses_grammar(self, rid) -> bool:
        req = self.requests.get(rid)
        return req is not None and bool(req.use_structured_output)

    def _parity_state(self) -> dict:
        """The scheduler's state after an update: the block pool and the two queues."""
        pool = self.kv_cache_manager.block_pool
        free = int(pool.get_num_free_blocks())
        # 0.27.1 / 0.28.0 keep skipped requests in `skipped_waiting`, 0.33.0 keeps requests
        # holding blocks in `kv_holding_waiting`; either is drained before `waiting`.
        waiting = []
        for name in ("kv_holding_waiting", "skipped_waiting"):
            queue = getattr(self, name, None)
            if queue:
                waiting += map(_REQUEST_ID, queue)
        waiting += map(_REQUEST_ID, self.waiting)
        return {
            "kv_blocks": {"free": free, "used": int(pool.num_gpu_blocks) - 1 - free},  # 1: null block
            "waiting": _strs(waiting),
            "running": _strs(map(_REQUEST_ID, self.running)),
        }

    def _parity_blocks_held(self):
        """A function of a request id: the KV blocks it holds, over every KV cache group (none
        once it finished). The coordinator's get_blocks(), read from each group's manager without
        building its tuple; the null blocks (a sliding window's or a mamba group's) counted only
        where a request may hold one (NullBlocks). What it reads is looked up once per update."""
        coordinator = self.kv_cache_manager.coordinator
        managers = getattr(coordinator, "single_type_managers", None)
        nulls = self._parity_nulls.held()
        if managers is not None and len(managers) == 1 and not nulls:  # one group, no null block held
            blocks_of = managers[0].req_to_blocks.get
            return lambda rid: len(blocks_of(rid) or ())

        def held(rid) -> int:
            groups = (coordinator.get_blocks(rid) if managers is None
                      else [manager.req_to_blocks.get(rid) or () for manager in managers])
            if not nulls:
                return sum(map(len, groups))
            return sum(len(blocks) - operator.countOf(map(_IS_NULL, blocks), True)  # map: no Python frame a block
                       for blocks in groups)

        return held

    def _parity_observe(self, scheduler_output, model_runner_output) -> dict:
        """Fields a subclass adds to the step's record (per request under "requests"), read
        from the model runner's output before update_from_output() consumes it: that trims
        tokens past a stop in place."""
        return {}

    def _parity_after_update(self, record: dict) -> None:
        """Fields a subclass completes once the update ran, before the record is kept."""

    def _parity_record(self, output) -> dict:
        step = self._parity_next_step
        self._parity_next_step += 1
        spec_tokens = output.scheduled_spec_decode_tokens or {}
        requests = {
            str(rid): {"tokens": int(n), "draft_tokens": len(spec_tokens.get(rid, ()))}
            for rid, n in output.num_scheduled_tokens.items()
        }
        new, resumed = set(), set()
        for data in output.scheduled_new_reqs:
            # The V2 model runner's output lists resumed requests among the new ones.
            req = self.requests.get(data.req_id)
            (resumed if req is not None and getattr(req, "num_preemptions", 0) > 0
             else new).add(data.req_id)
        cached = output.scheduled_cached_reqs
        if hasattr(cached, "resumed_req_ids"):
            resumed.update(cached.resumed_req_ids or ())
        elif hasattr(cached, "resumed_from_preemption"):  # releases before resumed_req_ids
            resumed.update(rid for rid, flag in zip(cached.req_ids, cached.resumed_from_preemption)
                           if flag)
        record = {
            "step": step,
            "total_num_scheduled_tokens": int(output.total_num_scheduled_tokens),
            "token_budget": int(self.max_num_scheduled_tokens),
            "requests": requests,
            "new": sorted(map(str, new)),
            "resumed": sorted(map(str, resumed)),
            "preempted": sorted(map(str, output.preempted_req_ids or ())),
        }
        if PER_STEP_INPUT_BUDGET:
            spec = self.vllm_config.speculative_config
            record["input_budget"] = int(self.scheduler_config.max_num_batched_tokens)
            record["drafting_slots_per_request"] = int(
                spec.max_num_new_slots_for_drafting if spec is not None else 0)
        return record


class EngineRecordingScheduler(RecordingScheduler):
    """RecordingScheduler inside the whole engine (the engine layers): each step's record also
    holds the tokens the worker ran through the target and the drafter
    (engines/vllm/worker_counts.py) and the worker's capacity. It records no identities: the
    engine's KV cache is sized by the machine, and its drafts are a real drafter's."""

    def _parity_identities(self, output, record: dict) -> None:
        self._parity_aborted = []

    def _parity_identities_after(self, record: dict, result) -> None:
        pass

    def _parity_next_drafts(self, record: dict) -> None:
        pass

    def schedule(self, *args, **kwargs):
        from engines.vllm import worker_counts

        worker_counts.begin_step()
        return super().schedule(*args, **kwargs)

    def _parity_state(self) -> dict:
        state = super()._parity_state()
        if self.cache_config.num_gpu_blocks_override is None:
            # The KV cache's size is then the machine's (its memory), not the scenario's: free
            # blocks would differ from one machine to the next, the blocks requests hold do not.
            del state["kv_blocks"]["free"]
        return state

    def _parity_observe(self, scheduler_output, model_runner_output) -> dict:
        from engines.vllm import worker_counts

        counts = worker_counts.snapshot()
        return {"target_forward_tokens": counts["target"],
                "drafter_forward_tokens": counts["drafter"],
                "max_num_batched_tokens": int(self.scheduler_config.max_num_batched_tokens)}


def _block_ids(groups) -> list[list[int]] | None:
    """Block ids per KV cache group as the scheduler output carries them; None stays null
    (a running request that got no new block)."""
    return None if groups is None else list(map(list, groups))


_REQUEST_ID = operator.attrgetter("request_id")


def _strs(values) -> list[str]:
    """list(map(str, values)): request ids are str already, counted in C, without a call of str()
    per id."""
    values = list(values)
    return values if operator.countOf(map(type, values), str) == len(values) else list(map(str, values))


def _accepted_drafts(scheduler_output, model_runner_output) -> dict:
    """Drafts accepted per request, read from the model runner's output before
    update_from_output() trims tokens past a stop: the target samples one token more than it
    accepted (its bonus token), as vLLM's own spec-decoding stats count them."""
    index = model_runner_output.req_id_to_index or {}
    sampled = model_runner_output.sampled_token_ids
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens or {}
    accepted = {}
    for rid in scheduler_output.num_scheduled_tokens:
        i = index.get(rid)
        tokens = sampled[i] if sampled is not None and i is not None and i < len(sampled) else []
        accepted[rid] = max(len(tokens) - 1, 0) if len(spec_tokens.get(rid, ())) else 0
    return accepted


class AsyncRecording:
    """What a step record adds under async scheduling (engines/PROTOCOL.md, "Async scheduling:
    the batch-queue loop"), mixed in before a recording scheduler over vLLM's AsyncScheduler.

    A step is still one schedule() call, completed by the update_from_output() of the same
    output; under a batch queue that update runs after the next schedule(). The driver sets
    `parity_iteration` before each of its iterations; the record gains the iteration of its
    schedule() and of its update, and per request the output placeholders after the update and
    what the update did with its output (`delivery`, read before the update as vLLM reads it,
    vllm/v1/core/sched/scheduler.py update_from_output):

        applied   the tokens were appended, computed tokens and placeholders adjusted
        stale     the request was preempted after this step was scheduled: its tokens are
                  appended, its computed tokens and placeholders untouched
        dropped   the request finished (or was aborted) before this update: ignored

    A dropped entry records the request's final values, `accepted_draft_tokens` 0 (vLLM counts
    nothing for it) and placeholders 0, as for any request that finished.
    """

    parity_iteration = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # request id -> its Request, kept from schedule(): a finished one leaves self.requests
        self._parity_held: dict = {}

    def schedule(self, *args, **kwargs):
        output = super().schedule(*args, **kwargs)
        record = self._parity_open[-1][1]
        record["iteration"] = int(self.parity_iteration)
        for rid in output.num_scheduled_tokens:
            self._parity_held[rid] = self.requests[rid]
        if self.parity_grammar:  # grammars under async scheduling (engines/PROTOCOL.md "Structured outputs")
            record["deferred_sampling"] = bool(output.pending_structured_output_tokens)
            for entry in record["requests"].values():
                entry["bitmask_draft_token_ids"] = list(entry["draft_token_ids"])
                entry["invalid_draft_tokens"] = 0
        return output

    def update_draft_token_ids_in_output(self, draft_token_ids, scheduler_output) -> None:
        """A deferred batch's drafts, delivered by the model runner before its bitmask: the
        record keeps, per request, the drafts proposed (before the grammar's cut, trimmed to
        the drafts scheduled), what the output then holds (cut, padded with -1) and how many
        were cut (num_invalid_spec_tokens)."""
        taken = {str(rid): list(drafts) for rid, drafts in
                 zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)
                 if (req := self.requests.get(rid)) is not None and not req.is_finished()}  # vLLM skips the rest
        super().update_draft_token_ids_in_output(draft_token_ids, scheduler_output)
        record = next((rec for output, rec in self._parity_open if output is scheduler_output), None)
        if record is None or not self.parity_grammar:
            return
        spec = scheduler_output.scheduled_spec_decode_tokens or {}
        invalid = scheduler_output.num_invalid_spec_tokens or {}
        for rid, entry in record["requests"].items():
            entry["bitmask_draft_token_ids"] = list(spec.get(rid, ()))
            entry["invalid_draft_tokens"] = int(invalid.get(rid, 0))
            if "proposed_draft_token_ids" in entry and rid in taken:
                entry["proposed_draft_token_ids"] = taken[rid][:entry["draft_tokens"]]

    def _parity_observe(self, scheduler_output, model_runner_output) -> dict:
        seen = super()._parity_observe(scheduler_output, model_runner_output)
        entries = seen.setdefault("requests", {})
        for rid in scheduler_output.num_scheduled_tokens:
            entries.setdefault(str(rid), {})["delivery"] = self._parity_delivery(rid)
        return seen

    def _parity_delivery(self, rid) -> str:
        request = self.requests.get(rid)
        if request is None or request.is_finished():
            return "dropped"
        if request.num_stale_output_tokens > 0:
            return "dropped" if request.drop_stale_output else "stale"
        return "applied"

    def _parity_after_update(self, record: dict) -> None:
        super()._parity_after_update(record)
        record["update_iteration"] = int(self.parity_iteration)
        for rid, entry in record["requests"].items():
            request = self._parity_held[rid]
            if entry["delivery"] == "dropped":
                entry["accepted_draft_tokens"] = 0
            entry["computed_tokens"] = int(request.num_computed_tokens)
            entry["output_tokens"] = int(request.num_output_tokens)
            entry["output_placeholders"] = 0 if request.is_finished() else int(request.num_output_placeholders)


def _async_scheduler():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return AsyncScheduler


class RecordingAsyncScheduler(AsyncRecording, RecordingScheduler, _async_scheduler()):
    """vLLM's AsyncScheduler, unchanged, recording each step with the async fields (the steps
    layer under async scheduling, engines/vllm/async_loop.py)."""


class EngineRecordingAsyncScheduler(AsyncRecording, EngineRecordingScheduler, _async_scheduler()):
    """EngineRecordingScheduler over vLLM's AsyncScheduler: the engine layers on a GPU runner
    when the configuration resolves async scheduling on (engines/vllm/engine_layer.py)."""


_IS_NULL = operator.attrgetter("is_null")  # KVCacheBlock.is_null: the null block of a sliding window


class NullBlocks:
    """Whether any request may hold the block pool's null block, told from the references to it:
    a request's block list holding it is one more reference than the scheduler held when it was
    built (the pool's own, each KV cache group's manager's). Counting a request's null blocks
    reads every block it holds, at every step; with full attention alone no request ever holds
    one, and the count is then its blocks. Any extra reference, from a request or not, only
    means the blocks are read, as before."""

    def __init__(self, null_block) -> None:
        self.block = null_block
        self.alone: int | None = None

    def calibrate(self) -> None:
        """Called once the scheduler is built, before any request: the references then. (Read as
        held() reads them, so that no frame's own reference differs.)"""
        self.alone = sys.getrefcount(self.block)

    def held(self) -> bool:
        return sys.getrefcount(self.block) != self.alone


class CachedBlocks:
    """The blocks of the pool's hash map (a block, or a dict of blocks by id under one hash),
    counted once and then kept as the map changes: every release from 0.27 changes it only with
    its insert() and pop() (BlockPool.cache_full_blocks, _maybe_evict_cached_block), and a
    prefix-cache reset replaces the map, which is then counted again. Each insert or pop adds the
    change of its own entry, so the count is the map's whatever a mutant does inside them.
    Counting every entry at every step was the recorder's largest read."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.map = None  # the map counted, and its dict of entries
        self.entries = None
        self.blocks = 0

    def count(self) -> int:
        current = getattr(self.pool, "cached_block_hash_to_block", None)
        if current is not self.map or getattr(current, "_cache", None) is not self.entries:
            if not self._follow(current):  # a release without the map: its blocks are read
                return _cached_blocks(self.pool)
        return self.blocks

    def _follow(self, current) -> bool:
        entries = getattr(current, "_cache", None)
        if not isinstance(entries, dict) or not hasattr(current, "__dict__"):
            self.map = None
            return False
        insert, pop = type(current).insert.__get__(current), type(current).pop.__get__(current)

        def counted_insert(key, block):
            before = _entry_blocks(entries.get(key))
            insert(key, block)
            self.blocks += _entry_blocks(entries.get(key)) - before

        def counted_pop(key, block_id):
            before = _entry_blocks(entries.get(key))
            popped = pop(key, block_id)
            self.blocks += _entry_blocks(entries.get(key)) - before
            return popped

        current.insert, current.pop = counted_insert, counted_pop
        self.map, self.entries = current, entries
        self.blocks = _cached_blocks(self.pool)
        return True


def _entry_blocks(entry) -> int:
    return 0 if entry is None else len(entry) if isinstance(entry, dict) else 1


def _cached_blocks(pool) -> int:
    """Blocks holding a hash: the entries of the pool's hash map (a block or a dict of blocks by
    id under one hash), which every release from 0.27 keeps in step with the blocks' hashes
    (cache_full_blocks inserts, _maybe_evict_cached_block pops and resets). Counted from the
    map because a scan of every block at every step was the driver's largest cost; a release
    without the map is scanned."""
    cache = getattr(getattr(pool, "cached_block_hash_to_block", None), "_cache", None)
    if not isinstance(cache, dict):
        return sum(1 for block in pool.blocks if block.block_hash is not None)
    # Mostly every entry is one block: counted by type in C, without a Python step an entry
    if operator.countOf(map(type, cache.values()), type(pool.null_block)) == len(cache):
        return len(cache)
    return sum(len(entry) if isinstance(entry, dict) else 1 for entry in cache.values())
