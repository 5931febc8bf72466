"""The steps and outputs layers under async scheduling: vLLM's own engine loop,
`EngineCore.step_with_batch_queue`, driving vLLM's own AsyncScheduler, with the stand-in
playing the GPU model runner.

Used by steps_layer.py when the configuration resolves async scheduling on under the GPU rule
(config_layer.py: a CUDA host runs AsyncScheduler where the CPU platform forces it off). The
loop is not a copy: the layer builds a *shell* EngineCore (`shell_core`, vLLM's class with only
the attributes its step functions read, its executor the stand-in) and calls
`step_fn()` + `post_step()` once per driver iteration, as vLLM's InprocClient.get_output does
(vllm/v1/engine/core_client.py). With a batch queue of 2 (vLLM's max_concurrent_batches
under async scheduling, V1 model runner, no pipeline parallelism) each iteration schedules the
next batch before it updates the scheduler from the oldest batch's output; the scheduler
schedules output placeholders for the tokens in flight, and zeroes them when it preempts.

engines/PROTOCOL.md ("Async scheduling: the batch-queue loop") states this loop and the
stand-in model runner as the driver contract a port implements, with a worked example.

Requests with a grammar (PROTOCOL.md "Grammars under async scheduling") run through the same
loop: vLLM defers the sampling of a batch whose grammar request has tokens in flight, takes the
stand-in's drafts (take_draft_token_ids) after the update of the batch before, lets the
scheduler cut and pad them in the deferred output (update_draft_token_ids_in_output), and
samples behind the bitmask computed over them.
"""

from __future__ import annotations

import queue
from collections import deque
from concurrent.futures import Future

from conformance.formats.sessions import inputs_by_step
from conformance.formats.workload import draft, request_prompts, verify, verify_masked

from . import encoder_inputs, kv_events
from .kv_connector import Transfers
from .new_requests import abort_requests, new_request, output_record, session_inputs

# The attributes EngineCore.step, step_with_batch_queue and post_step read, per release
# (vllm/v1/engine/core.py EngineCore.__init__): 0.27.1 and 0.28.0 read `is_ec_consumer`
# where 0.33.0 reads `is_mm_encoder_only` (the `model_executed` line), and 0.33.0 also reads
# `_weight_version` (_attach_weight_version). Every pin's EngineCore gets all of them.
SHELL_ATTRIBUTES = ("vllm_config", "log_stats", "scheduler", "model_executor", "batch_queue_size",
                    "batch_queue", "is_ec_consumer", "is_mm_encoder_only", "is_pooling_model",
                    "async_scheduling", "check_for_draft_tokens", "aborts_queue", "_weight_version",
                    "step_fn")


class ShellError(RuntimeError):
    """vLLM's loop read an attribute the shell EngineCore does not set: a release whose loop
    reads more than SHELL_ATTRIBUTES names."""


def shell_core(config, scheduler, executor):
    """vLLM's EngineCore without its constructor: the scheduler and executor given, and the
    attributes its loop reads set as EngineCore.__init__ sets them for this configuration."""
    from vllm.v1.engine.core import EngineCore

    core = EngineCore.__new__(EngineCore)
    core.vllm_config = config
    core.log_stats = False
    core.scheduler = scheduler
    core.model_executor = executor
    core.batch_queue_size = config.max_concurrent_batches
    core.batch_queue = deque(maxlen=core.batch_queue_size) if core.batch_queue_size > 1 else None
    core.is_ec_consumer = True  # no EC transfer config
    core.is_mm_encoder_only = False
    core.is_pooling_model = False
    core.async_scheduling = config.scheduler_config.async_scheduling
    core.check_for_draft_tokens = config.speculative_config is not None
    core.aborts_queue = queue.Queue()
    core._weight_version = "default"
    core.step_fn = core.step if core.batch_queue is None else core.step_with_batch_queue
    return core


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class StandInExecutor:
    """The stand-in model runner as vLLM's V1 GPU model runner behaves under async scheduling
    (vllm/v1/worker/gpu_model_runner.py): it keeps each request's tokens and the drafts it
    proposed itself, and puts its drafts in place of the scheduler's `-1` placeholders for the
    requests that sampled in the previous batch that had tokens; any other request verifies
    the `-1`s, so none of its drafts are accepted.

    vLLM's loop calls execute_model() right after schedule(), then sample_tokens() for a
    batch with tokens, before any other schedule(): the batch is computed then, from the
    scheduler's state at that moment, as the GPU computes it while the scheduler runs ahead."""

    def __init__(self, scheduler, workload: dict, k: int):
        self.scheduler, self.k = scheduler, k
        self.seed, self.vocab = workload["seed"], workload["vocab_size"]
        self.patterns = {req["id"]: req["acceptance"] for req in workload["requests"]}
        self.verified = {req["id"]: 0 for req in workload["requests"]}  # verify steps so far
        self.tokens: dict[str, list[int]] = {}  # the runner's own copy of each request's tokens
        self.drafts: dict[str, list[int]] = {}  # what it proposed after the request's last sample
        self.previous: set = set()  # requests that sampled in the last batch with tokens
        self.batch = None  # (scheduler output, which requests sample, KV transfers, draft counts) between the two calls
        # Requests with a grammar draft lazily (engines/PROTOCOL.md "Structured outputs"): rid ->
        # (its tokens then, accept) until first read, when the scheduler's grammar stands after them
        self.grammar_drafts: dict[str, tuple[list[int], int]] = {}
        self.last: dict = {}  # the requests that sampled in the last batch with tokens: their drafts then
        # The KV connector's worker side, if any: the loads of each scheduled batch, reported in
        # the output of the batch `async_steps` schedule() calls later (kv_connector.py)
        self.transfers, self.executed = Transfers(), 0

    def execute_model(self, output, non_block: bool = False):
        from vllm.v1.outputs import ModelRunnerOutput

        for rid in (*(output.finished_req_ids or ()), *(getattr(output, "preempted_req_ids", None) or ())):
            self.tokens.pop(rid, None)
            self.drafts.pop(rid, None)
            self.grammar_drafts.pop(rid, None)
        transfers = self.transfers.output(self.executed, output)
        self.executed += 1
        if output.total_num_scheduled_tokens == 0:  # returns before the batch: `previous` stays
            # the runner's kv_connector_no_forward: the transfers still report (an empty output without a connector)
            result = ModelRunnerOutput.with_kv_conn_output_only(transfers)
            return _done(result) if non_block else result
        # A request samples when its computed tokens after scheduling reach its tokens and
        # placeholders: vLLM's own `is_prefill_chunk`, set by schedule() just now.
        samples = {rid: not self.scheduler.requests[rid].is_prefill_chunk for rid in output.num_scheduled_tokens}
        # its logits rows, laid out now: a deferred batch's drafts are rewritten in the output
        # later (update_draft_token_ids_in_output), not their number
        spec = output.scheduled_spec_decode_tokens
        self.batch = (output, samples, transfers, {rid: len(spec.get(rid, ())) for rid in samples})
        return _done(None) if non_block else None

    def sample_tokens(self, grammar_output, non_block: bool = False):
        from vllm.v1.outputs import ModelRunnerOutput

        from . import grammar

        output, samples, transfers, slots_of = self.batch
        self.batch = None
        # behind the grammar's bitmask, a row per position, as the runner applies it
        allowed = grammar.allowed_rows(self.scheduler, output, grammar_output, slots_of)
        cached = output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        new = {data.req_id for data in output.scheduled_new_reqs}
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            if rid in new or rid in resumed or rid not in self.tokens:
                self.tokens[rid] = list(self.scheduler.requests[rid].all_token_ids)
            if not samples[rid]:
                sampled.append([])  # a prefill chunk that does not reach the end: no sample
                continue
            slots = slots_of[rid]
            # its own drafts, not the scheduler's copy the grammar cut: the runner put them in
            # its inputs when it executed the batch
            drafts = self._drafts(rid)[:slots] if slots and rid in self.previous else [-1] * slots
            if drafts:
                self.verified[rid] += 1
            if rid in allowed:
                tokens = verify_masked(self.seed, self.tokens[rid], drafts, self.vocab, allowed[rid])
            else:
                tokens = verify(self.seed, self.tokens[rid], drafts, self.vocab)
            self.tokens[rid] += tokens  # not cut at a stop: the scheduler drops the rest
            sampled.append(tokens)
            if self.k:
                pattern = self.patterns[rid]
                accept = pattern[self.verified[rid] % len(pattern)]
                self.grammar_drafts.pop(rid, None)
                request = self.scheduler.requests.get(rid)
                if request is not None and request.use_structured_output:
                    self.grammar_drafts[rid] = (list(self.tokens[rid]), accept)
                else:
                    self.drafts[rid] = draft(self.seed, self.tokens[rid], self.k, accept, self.vocab)
        self.previous = {rid for rid, tokens in zip(req_ids, sampled) if tokens}
        # what take_draft_token_ids delivers: every request that sampled, even one finished or
        # preempted since (the GPU runner keeps its batch's request ids with its drafts)
        self.last = {rid: (self.drafts.get(rid), self.grammar_drafts.get(rid))
                     for rid, tokens in zip(req_ids, sampled) if tokens and self.k}
        result = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                                   sampled_token_ids=sampled, kv_connector_output=transfers)
        return _done(result) if non_block else result

    def _drafts(self, rid: str) -> list[int]:
        """The drafts it proposed for the request after its last sample. A request with a
        grammar drafts with masked_draft when they are first read: by then the update of the
        batch that sampled them has advanced the scheduler's grammar through its tokens (vLLM
        defers the next batch's sampling until it has), where the GPU's drafter would read no
        grammar at all."""
        if rid in self.grammar_drafts:
            self.drafts[rid] = self._grammar_draft(rid, *self.grammar_drafts.pop(rid))
        return self.drafts[rid]

    def _grammar_draft(self, rid: str, tokens: list[int], accept: int) -> list[int]:
        from . import grammar

        request = self.scheduler.requests.get(rid)
        if request is None or request.is_finished():  # no grammar to follow
            return draft(self.seed, tokens, self.k, accept, self.vocab)
        return grammar.masked_draft(self.seed, tokens, self.k, accept, self.vocab, request,
                                    self.scheduler.structured_output_manager)

    def take_draft_token_ids(self):
        """vLLM's loop calls it under async scheduling for a deferred batch only (one with a
        grammar request that has tokens in flight), after the update of the batch before: the
        drafts of that batch's requests that sampled, fresh lists (the scheduler trims them in
        place), as the GPU runner copies them to the CPU for structured output."""
        from vllm.v1.outputs import DraftTokenIds

        if not self.last:
            return None
        drafts = []
        for rid, (plain, lazy) in self.last.items():
            if rid in self.drafts or rid in self.grammar_drafts:
                drafts.append(list(self._drafts(rid)))
            else:  # finished or preempted since: what it proposed then
                drafts.append(list(plain) if lazy is None else self._grammar_draft(rid, *lazy))
        return DraftTokenIds(list(self.last), drafts)


def iter_async(config, workload: dict, k: int, block_hasher):
    """A generator of the step records, each yielded once its update is done (in update order,
    which is step order), returning one output record per request sorted by id: the workload
    driven through vLLM's batch-queue loop. Driver iteration i adds the requests whose
    arrival_step is i, aborts those whose abort_step is i, then runs one step_fn() +
    post_step(), until every request has arrived, the scheduler has no requests (none
    unfinished, no finished one left to report) and the queue is empty. Nothing is held: a
    production-scale run streams as the synchronous driver does."""
    from collections import deque

    from .recorder import RecordingAsyncScheduler
    from .release import build_scheduler

    scheduler = build_scheduler(config, config.cache_config.num_gpu_blocks_override,
                                cls=RecordingAsyncScheduler)
    encoder_inputs.prepare(scheduler, workload, "workload")
    pending: deque = deque()  # the records finished by the last iteration's update
    scheduler.parity_sink = pending.append
    if any("structured_output" in req for req in workload["requests"]):
        scheduler.parity_grammar = True  # the records carry the grammar's fields (recorder.py)
    core = shell_core(config, scheduler, StandInExecutor(scheduler, workload, k))
    drive = _drive(core, scheduler, workload, config.model_config.max_model_len, block_hasher)
    try:
        while True:
            try:
                next(drive)
            except StopIteration as done:
                yield from pending
                return [output_record(rid, done.value[rid]) for rid in sorted(done.value)]
            while pending:
                yield pending.popleft()
    except Exception as exc:
        yield from pending  # the steps recorded before the failure still go out
        if isinstance(exc, AttributeError):  # vLLM's loop read what the shell does not set
            raise ShellError(f"vLLM's EngineCore loop read an attribute the shell does not set "
                             f"(engines/vllm/async_loop.py SHELL_ATTRIBUTES): {exc}") from exc
        raise


def _drive(core, scheduler, workload: dict, max_model_len: int, block_hasher):
    """Yields after each iteration (its finished records are in the scheduler's sink); returns
    the scheduler's Request of each id, kept after it finished."""
    from . import grammar

    prompts = request_prompts(workload, max_model_len)
    arrivals: dict[int, list[dict]] = {}
    aborts: dict[int, list[str]] = {}
    for req in workload["requests"]:
        arrivals.setdefault(req["arrival_step"], []).append(req)
        if "abort_step" in req:
            aborts.setdefault(req["abort_step"], []).append(req["id"])
    requests: dict = {}  # id -> the scheduler's Request, kept after it finishes
    total = len(workload["requests"])
    inputs = inputs_by_step(workload)  # streaming sessions' later chunks and ends
    resets = {r["step"]: r for r in workload.get("prefix_cache_resets", ())}
    scheduler.parity_resets = bool(resets)
    iteration = 0
    while True:
        scheduler.parity_iteration = iteration
        refused = []
        for req in arrivals.get(iteration, ()):
            requests[req["id"]] = new_request(req, prompts[req["id"]], iteration, block_hasher)
            if "structured_output" in req and not grammar.admit(scheduler, requests[req["id"]]):
                refused.append(grammar.refuse(requests[req["id"]]))  # as the synchronous loop
                continue
            scheduler.add_request(requests[req["id"]])
        scheduler.parity_refused += refused
        # A client's aborts land between two iterations, as vLLM's busy loop takes them from its
        # input queue before the next step (EngineCore.abort_requests), while the batch of the
        # iteration before may still be in flight: its output for them is dropped. A finished
        # request the next schedule() reports keeps has_requests() true, so it is recorded.
        session_inputs(scheduler, inputs.get(iteration, ()), iteration, workload["seed"], workload["vocab_size"],
                       block_hasher)
        abort_requests(scheduler, aborts.get(iteration, ()))
        if iteration in resets:  # the API server's call, through vLLM's EngineCore
            kv_events.reset(core, resets[iteration])
        # a session waiting for input is not among has_requests()'s: it waits for its end
        if len(requests) == total and not scheduler.has_requests() and not core.batch_queue \
                and all(r.is_finished() for r in requests.values()) and not any(at >= iteration for at in resets):
            return requests
        if iteration >= workload["max_steps"]:
            unfinished = sorted(rid for rid, r in requests.items() if not r.is_finished())
            raise RuntimeError(
                f"the workload did not finish within max_steps={workload['max_steps']} driver "
                f"iterations: unfinished {unfinished}, not yet arrived {total - len(requests)}, "
                f"{len(core.batch_queue or ())} batches in flight")
        _outputs_of_step, executed = core.step_fn()
        core.post_step(executed)
        iteration += 1
        yield
