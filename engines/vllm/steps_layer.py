"""Steps and outputs layers: the release's real Scheduler, driven step by step on CPU.

The configuration is resolved exactly as the config layer does (config_layer.resolve_config),
the scheduler is the release's own (engines/vllm/recorder.py's RecordingScheduler, which only
records), and conformance/formats/workload.py's deterministic stand-in plays the model runner and the
drafter. Each step mirrors the synchronous EngineCore.step() + post_step() of 0.27.1, 0.28.0
and 0.33.0 (vllm/v1/engine/core.py), with a client's aborts between steps:

    add the requests arriving at this step
    give the streaming sessions their input chunks and ends arriving at this step
    abort the requests whose abort_step this is, one finish_requests() call each
    reset the prefix cache if the workload's prefix_cache_resets has this step
    scheduler.schedule()
    the stand-in "executes" it -> ModelRunnerOutput
    scheduler.update_from_output(...)   (the recorder reads the state after it)
    if tokens were scheduled and speculation is on: scheduler.update_draft_token_ids(...)

engines/PROTOCOL.md (`steps`) states this loop as the driver contract a port implements:
verify steps, padding, empty steps, aborts, when `finished` is reported, the stand-in's recipe.

A step with nothing to schedule is still a step (recorded with 0 tokens), so step n of the
trace is the step at which requests with arrival_step == n were added.

A configuration that resolves async scheduling on under the GPU rule is driven by vLLM's own
batch-queue loop instead (engines/vllm/async_loop.py); this synchronous driver is unchanged.
"""

from __future__ import annotations

import inspect
from collections import deque

from conformance.formats.sessions import inputs_by_step
from conformance.formats.workload import (draft, reasoning_end, request_prompts, validate_workload, verify,
                                          verify_masked)

from . import encoder_inputs, grammar, kv_events, per_run
from .new_requests import abort_requests, new_request, output_record, session_inputs




def steps(scenario: dict, stop_after_step: int | None = None):
    """The step records, each sent as its step's update completes (a production scenario's
    thousands of records are never held); the outputs are kept for the outputs layer. With
    `stop_after_step` (the run message's, engines/PROTOCOL.md) the drive stops after that step."""
    outputs = yield from iter_steps(scenario, stop_after_step=stop_after_step)
    per_run.keep("outputs", scenario, outputs)


def outputs(scenario: dict):
    kept = per_run.kept("outputs", scenario)
    if kept is None:  # a run that asks for outputs alone: drive, the records discarded
        drive = iter_steps(scenario)
        while True:
            try:
                next(drive)
            except StopIteration as done:
                kept = done.value
                break
    yield from kept


def run_steps(scenario_wire: dict, cls=None, config=None) -> tuple[list[dict], list[dict]]:
    """(step records, one output record per request sorted by id) for the scenario, held.

    `cls` and `config` exist for the driver-overhead benchmark: a plain Scheduler (no
    records) over a configuration resolved beforehand is the bare schedule/update loop.
    """
    drive = iter_steps(scenario_wire, cls, config)
    records = []
    while True:
        try:
            records.append(next(drive))
        except StopIteration as done:
            return records, done.value


def iter_steps(scenario_wire: dict, cls=None, config=None, stop_after_step: int | None = None):
    """A generator of the scenario's step records, each yielded as its step's update completes;
    it returns the output records (None when it stopped after `stop_after_step`). A refused
    configuration yields the one refused record and returns it as the outputs' record."""
    from .config_layer import resolve_config
    from .release import build_scheduler
    from .recorder import RecordingScheduler

    from conformance.formats.scenario import ScenarioError

    engine_args = scenario_wire["engine_args"]
    source = scenario_wire.get("name", "<scenario>")
    if scenario_wire.get("workload") is None:
        raise ScenarioError(source, "workload", "is required for the steps and outputs layers; "
                            "this scenario has none")
    workload = validate_workload(scenario_wire["workload"], source, engine_args)
    refusal = None
    if config is None:
        config, _lines, refusal = resolve_config(scenario_wire)
    if config is None:  # the release refused the configuration: that is the result
        yield {"refused": refusal}
        return [{"refused": refusal}]
    spec = config.speculative_config
    k = spec.num_speculative_tokens if spec is not None else 0
    if config.scheduler_config.async_scheduling:  # under the GPU rule (config_layer.py)
        from .async_loop import iter_async

        drive = iter_async(config, workload, k, _block_hasher(config))
        while True:
            try:
                record = next(drive)
            except StopIteration as done:
                return done.value
            yield record
            if stop_after_step is not None and record["step"] >= stop_after_step:
                return None

    scheduler = build_scheduler(config, engine_args.get("num_gpu_blocks_override"),
                                cls=cls or RecordingScheduler)
    block_hasher = _block_hasher(config)
    encoder_inputs.prepare(scheduler, workload, source)

    pending: deque = deque()  # the records of the step just updated, yielded before the next
    if hasattr(scheduler, "parity_sink"):
        scheduler.parity_sink = pending.append
    try:
        for outputs in _drive(scheduler, workload, engine_args["max_model_len"], k, block_hasher):
            while pending:
                record = pending.popleft()
                yield record
                if stop_after_step is not None and record["step"] >= stop_after_step:
                    return None
            if outputs is not None:
                return outputs
    except Exception:  # the steps recorded before the failure still go out
        yield from pending
        raise
    return None


def _drive(scheduler, workload: dict, max_model_len: int, k: int, block_hasher):
    """Yields None after each step (its record is then in the scheduler's sink), and the output
    records once every request finished."""
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    from .kv_connector import Transfers

    seed, vocab = workload["seed"], workload["vocab_size"]
    prompts = request_prompts(workload, max_model_len)
    arrivals: dict[int, list[dict]] = {}
    aborts: dict[int, list[str]] = {}
    for req in workload["requests"]:
        arrivals.setdefault(req["arrival_step"], []).append(req)
        if "abort_step" in req:
            aborts.setdefault(req["abort_step"], []).append(req["id"])
    inputs = inputs_by_step(workload)  # streaming sessions' later chunks and ends
    # under a reasoning parser, where each grammar request's reasoning ends (workload module doc)
    ends = {req["id"]: reasoning_end(req, len(prompts[req["id"]])) for req in workload["requests"]}
    # (enable_in_reasoning: the grammar applies during reasoning too, so no request is left unconstrained)
    config = scheduler.vllm_config.structured_outputs_config
    reasons = bool(config.reasoning_parser) and not config.enable_in_reasoning
    drafter = Drafter(workload, k, scheduler.structured_output_manager, ends, reasons)
    if any("structured_output" in req for req in workload["requests"]):
        scheduler.parity_grammar = True  # the records carry the grammar's fields (recorder.py)
    transfers = Transfers()  # the stand-in worker's side of a KV connector, if any
    resets = {r["step"]: r for r in workload.get("prefix_cache_resets", ())}
    if resets and hasattr(scheduler, "parity_resets"):
        scheduler.parity_resets = True  # every record says whether a reset ran before it
    requests: dict = {}  # id -> the scheduler's Request object, kept after it finishes
    total = len(workload["requests"])
    step = 0
    while True:
        refused = []
        for req in arrivals.get(step, ()):
            requests[req["id"]] = new_request(req, prompts[req["id"]], step, block_hasher)
            if "structured_output" in req and not grammar.admit(scheduler, requests[req["id"]]):
                refused.append(grammar.refuse(requests[req["id"]]))
                continue
            scheduler.add_request(requests[req["id"]])
        if hasattr(scheduler, "parity_refused"):
            scheduler.parity_refused = refused
        # a session ended while it waited for input is aborted: recorded as an abort is
        aborted = session_inputs(scheduler, inputs.get(step, ()), step, seed, vocab, block_hasher)
        aborted += abort_requests(scheduler, aborts.get(step, ()))
        if step in resets:  # the API server's call, between two steps (kv_events.py)
            kv_events.reset(scheduler, resets[step])
        # the step after an abort is recorded even when nothing is left: it shows the abort;
        # the steps up to the last reset too: they show its result and its effect
        if len(requests) == total and all(r.is_finished() for r in requests.values()) and not aborted \
                and not any(at >= step for at in resets):
            break
        if step >= workload["max_steps"]:
            unfinished = sorted(rid for rid, r in requests.items() if not r.is_finished())
            raise RuntimeError(
                f"the workload did not finish within max_steps={workload['max_steps']}: "
                f"unfinished {unfinished}, not yet arrived {total - len(requests)}")

        output = scheduler.schedule()
        # EngineCore.step's bitmask, applied as the model runner applies it
        allowed = grammar.allowed_by_position(scheduler, output, list(output.num_scheduled_tokens))

        # The stand-in model runner: what the release's GPU model runner would return.
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            request = requests[rid]
            drafts = list(output.scheduled_spec_decode_tokens.get(rid, ()))
            # schedule() has already advanced num_computed_tokens by the scheduled tokens.
            if request.num_computed_tokens - len(drafts) < request.num_tokens:
                sampled.append([])  # a prefill chunk that does not reach the end: no sample
                continue
            drafter.sampled(rid, drafts)
            # the stand-in reads a request's length and last tokens only (workload.Context)
            if rid in allowed:  # behind its grammar's bitmask, a row per position
                sampled.append(verify_masked(seed, request.all_token_ids, drafts, vocab, allowed[rid], ends[rid]))
            else:
                sampled.append(verify(seed, request.all_token_ids, drafts, vocab))
        model_output = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled, kv_connector_output=transfers.output(step, output))
        scheduler.update_from_output(output, model_output)

        # post_step(): the drafter proposes K tokens for each request of the batch; the
        # scheduler itself drops them for finished requests and prefill chunks.
        if k and output.total_num_scheduled_tokens > 0 and not getattr(output, "skip_drafts", False):
            drafts_out = [drafter.propose(rid, requests[rid]) for rid in req_ids]
            scheduler.update_draft_token_ids(DraftTokenIds(req_ids, drafts_out))
        step += 1
        yield None

    yield [output_record(rid, requests[rid]) for rid in sorted(requests)]


class Drafter:
    """The stand-in drafter of post_step(): each request's drafts follow its acceptance
    pattern, indexed by its verify steps so far (engines/PROTOCOL.md, `steps`, step 7)."""

    def __init__(self, workload: dict, k: int, manager=None, ends: dict | None = None,
                 reasons: bool = False) -> None:
        self.seed, self.vocab, self.k = workload["seed"], workload["vocab_size"], k
        self.manager = manager  # the StructuredOutputManager, for requests with a grammar
        self.ends = ends or {}  # request id -> its reasoning end (workload.reasoning_end), or None
        self.reasons = reasons  # a reasoning parser defers the grammars (not enable_in_reasoning)
        self.patterns = {req["id"]: req["acceptance"] for req in workload["requests"]}
        self.verified = {req["id"]: 0 for req in workload["requests"]}  # verify steps so far

    def sampled(self, rid: str, drafts: list[int]) -> None:
        """A step sampled the request, with these drafts scheduled for it."""
        if counts_as_verify_step(drafts):
            self.verified[rid] += 1

    def propose(self, rid: str, request) -> list[int]:
        pattern = self.patterns[rid]
        accept = pattern[self.verified[rid] % len(pattern)]
        if request.use_structured_output and not request.is_finished():  # it follows its grammar
            end = self.ends.get(rid)
            reasoning = self.reasons and grammar.still_reasoning(request.all_token_ids, end)
            return grammar.masked_draft(self.seed, request.all_token_ids, self.k, accept, self.vocab, request,
                                        self.manager, end, reasoning)
        return draft(self.seed, request.all_token_ids, self.k, accept, self.vocab)


def counts_as_verify_step(drafts: list[int]) -> bool:
    """Whether a step that samples a request (its scheduled tokens reach the end of its
    tokens) is one of its verify steps, which index its acceptance pattern: it is when drafts
    were scheduled for it, placeholder drafts of a padded one-token prompt included. A step
    whose drafts were all cut (by the budget) is not, nor is the step that ends its prefill."""
    return bool(drafts)


def _block_hasher(config):
    """The request block hasher EngineCore builds when prefix caching is on, else None: over
    blocks of the hash block size EngineCore resolves (release.hashing_block_sizes)."""
    if not config.cache_config.enable_prefix_caching:
        return None
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    from .release import hashing_block_sizes

    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    args = [hashing_block_sizes(config)[1], hash_fn]  # finer than a block with prefix_match_unit
    if "num_hash_lookahead_tokens" in inspect.signature(get_request_block_hasher).parameters:
        args.append(getattr(config, "num_hash_lookahead_tokens", 0))
    return get_request_block_hasher(*args)
