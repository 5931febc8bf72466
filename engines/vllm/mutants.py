"""TEST DEVICE ONLY: deliberately broken variants of a pinned vLLM release.

Nothing here is a real engine. A mutant is the release with one known bug put in by hand, so
the suite can prove it notices that class of bug (each mutant must change the records of at
least one scenario). The worker applies one with `--mutant NAME`, before
any run, and then announces itself as engine "vllm+mutant:NAME", never as "vllm".

    no-draft-reservation  SpeculativeConfig.max_num_new_slots_for_drafting is 0: no
                          drafting-slot reservation at all (the seed bug of a port).
    draft-plus-one        every request carries K+1 drafts, so the scheduler schedules one
                          draft token too many per request (and verifies it).
    draft-minus-one       every request carries K-1 drafts: one draft token too few.
    ignore-max-num-seqs   the scheduler admits requests past max_num_seqs.
    crash-after-divergence  no-draft-reservation, and the scheduler fails a bare `assert` on
                          its fourth schedule() call: a port that diverges, then crashes.
    logit-scale-1.10      the logits processor returns logits times 1.10: every greedy token
                          is the same, every other logprob of the top-k moves (engine_outputs).
    drop-bonus-token      the rejection sampler drops the bonus token whenever every draft is
                          accepted: lossless (the same tokens, fewer per step; engine_steps).
    budget-minus-one-after-1000  from its 1001st schedule() call on, the scheduler's token
                          budget is one token less: a divergence deep in a production-scale run,
                          at the first step after step 1000 whose budget binds.
    sync-loop-under-async the engine loop processes each batch's output before it schedules
                          the next, with AsyncScheduler and its placeholders still on: a port
                          that keeps its synchronous loop under the async flag.
    keep-placeholders-at-preemption  a preempted request keeps its output placeholders (vLLM
                          zeroes them: its tokens in flight become stale).
    sliding-window-as-full  a sliding-window KV cache group skips no token, so it keeps every
                          block as full attention does: a port that runs a hybrid model's
                          groups (gpt-oss) with one rule.
    mamba-unaligned-split  a hybrid mamba model's prefill chunk in mamba cache mode `align` is
                          not split at block boundaries (Scheduler._mamba_block_aligned_split
                          returns the chunk the budget allows): a port that chunks a mamba
                          hybrid's prompts as it chunks full attention's, so the mamba state
                          cached at a block boundary is not the state of that boundary.
    ignore-invalid-kv-blocks  the scheduler takes no notice of the blocks a KV connector reports
                          it failed to load: a port that trusts every load.
    cap-running-chunk-2048  a running request's chunk is capped at 2048 tokens (the running loop
                          of Scheduler.schedule takes min(new tokens, budget left, 2048)): a port
                          with a fixed chunk size for requests already running.
    ignore-max-loras      the scheduler has no LoRA bound: a waiting request is admitted whatever
                          adapters the step already runs, past max_loras (its adapter still keys
                          its block hashes): a port that never counts a step's adapters.
    min-tokens-unmasked   the sampler does not mask a request's stop tokens before min_tokens
                          outputs (engine_outputs): check_stop still holds the stop back, so the
                          stop token is emitted and the request goes on. Its raw logprobs are the
                          oracle's: only the token tells.
    ignore-grammar-cut    the scheduler keeps every draft of a request with a grammar: its
                          grammar's validate_tokens returns the drafts whole (xgrammar and
                          llguidance alike), so drafts the grammar refuses are scheduled.
    async-grammar-drafts-undelivered  under async scheduling, the batch-queue loop computes a
                          deferred batch's grammar bitmask without the drafts that arrived
                          (update_draft_token_ids_in_output does nothing): the output keeps
                          its -1 placeholders, so every row after a request's first is
                          all-allowed and its bonus row skips the drafts: a port that never
                          delivers the model runner's drafts to its grammar.
    grammar-in-reasoning  the structured output manager finds no reasoner for any request, so a
                          grammar masks, advances and cuts drafts from a request's first token,
                          through its reasoning: a port that ignores the reasoning parser.
    lora-ignored          the LoRA layers add no adapter's update to their output: a request
                          under an adapter generates the base model's tokens (engine_outputs).
    lora-hash-ignored     block hashes take no adapter key: a request under an adapter hits the
                          blocks another adapter (or none) cached for the same tokens.
    streaming-sessions-free-slots  a streaming session waiting for its next input chunk holds no
                          request slot: the scheduler's count of such sessions stays 0, so
                          waiting requests are admitted as if the session were gone (vLLM counts
                          it against max_num_seqs): a port that only counts running requests.
    no-block-removed-events  the block pool publishes no BlockRemoved when it evicts a cached
                          block: a port whose router is never told a block left the cache.
    reset-ignores-blocks-in-use  the prefix-cache reset clears every hash even while requests
                          hold blocks, and says it succeeded: a port that never checks.
    encoder-cache-per-request  an item is known by its request and its hash (the encoder cache's
                          key and its blocks' hash key): a request whose item another request
                          encoded runs the encoder again (a port that keys encoder outputs by
                          request, not by the item's hash alone).
"""

from __future__ import annotations

import re
import sys

BANNER = "TEST DEVICE: vLLM with a deliberately injected scheduling bug (mutant {name}); not a real engine"


def _no_draft_reservation() -> None:
    from vllm.config import SpeculativeConfig

    SpeculativeConfig.max_num_new_slots_for_drafting = property(lambda self: 0)


def _draft_count(delta: int):
    def apply() -> None:
        from vllm.v1.core.sched.scheduler import Scheduler

        original = Scheduler.update_draft_token_ids

        def update_draft_token_ids(self, draft_token_ids):
            lists = []
            for drafts in draft_token_ids.draft_token_ids:
                drafts = list(drafts)
                if delta > 0 and drafts:
                    drafts += drafts[-1:] * delta  # a real token id, repeated
                elif delta < 0:
                    drafts = drafts[:max(len(drafts) + delta, 0)]
                lists.append(drafts)
            draft_token_ids.draft_token_ids = lists
            return original(self, draft_token_ids)

        Scheduler.update_draft_token_ids = update_draft_token_ids

    return apply


def _ignore_max_num_seqs() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.max_num_running_reqs = 1 << 30
        if hasattr(self, "max_num_active_reqs"):  # 0.33.0 admits against this one
            self.max_num_active_reqs = 1 << 30

    Scheduler.__init__ = __init__


def _crash_after_divergence() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    _no_draft_reservation()
    original = Scheduler.schedule

    def schedule(self, *args, **kwargs):
        self._parity_calls = getattr(self, "_parity_calls", 0) + 1
        assert self._parity_calls < 4  # an AssertionError with no message, as ports raise them
        return original(self, *args, **kwargs)

    Scheduler.schedule = schedule


def _logit_scale() -> None:
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    original = LogitsProcessor.forward

    def forward(self, *args, **kwargs):
        logits = original(self, *args, **kwargs)
        return None if logits is None else logits * 1.10

    LogitsProcessor.forward = forward


def _drop_bonus_token() -> None:
    from vllm.v1.sample import rejection_sampler as rs

    original = rs.RejectionSampler.forward

    def forward(self, metadata, *args, **kwargs):
        out = original(self, metadata, *args, **kwargs)
        ids = out.sampled_token_ids  # [requests, max_spec_len + 1], rejected ones PLACEHOLDER
        for row, drafts in enumerate(metadata.num_draft_tokens):
            if drafts and bool((ids[row, :drafts + 1] != rs.PLACEHOLDER_TOKEN_ID).all()):
                ids[row, drafts] = rs.PLACEHOLDER_TOKEN_ID  # every draft accepted: no bonus
        return out

    rs.RejectionSampler.forward = forward


def _budget_minus_one_after(calls: int):
    def apply() -> None:
        from vllm.v1.core.sched.scheduler import Scheduler

        original = Scheduler.schedule

        def schedule(self, *args, **kwargs):
            self._parity_calls = getattr(self, "_parity_calls", 0) + 1
            if self._parity_calls == calls + 1:  # schedule() call `calls` (0-based) and every one after
                self.max_num_scheduled_tokens -= 1
            return original(self, *args, **kwargs)

        Scheduler.schedule = schedule

    return apply


def _sync_loop_under_async() -> None:
    """EngineCore picks step() over step_with_batch_queue when max_concurrent_batches is 1
    (vllm/v1/engine/core.py EngineCore.__init__): the scheduler stays AsyncScheduler."""
    from vllm.config import VllmConfig

    VllmConfig.max_concurrent_batches = property(lambda self: 1)


def _keep_placeholders_at_preemption() -> None:
    """Scheduler._preempt_request sets num_output_placeholders to 0; this one puts them back."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler._preempt_request

    def _preempt_request(self, request, *args, **kwargs):
        kept = request.num_output_placeholders
        result = original(self, request, *args, **kwargs)
        request.num_output_placeholders = kept
        return result

    Scheduler._preempt_request = _preempt_request


def _sliding_window_as_full() -> None:
    """SlidingWindowManager.get_num_skipped_tokens is 0, as full attention's: no block falls
    out of the window, so none is freed before its request ends."""
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    SlidingWindowManager.get_num_skipped_tokens = lambda self, num_computed_tokens: 0


def _mamba_unaligned_split() -> None:
    """Scheduler._mamba_block_aligned_split keeps the number of new tokens it is given."""
    from vllm.v1.core.sched.scheduler import Scheduler

    Scheduler._mamba_block_aligned_split = lambda self, request, num_new_tokens, *args, **kwargs: num_new_tokens


def _ignore_invalid_kv_blocks() -> None:
    """Scheduler._handle_invalid_blocks rolls back the requests whose loaded blocks failed;
    this one finds none."""
    from vllm.v1.core.sched.scheduler import Scheduler

    Scheduler._handle_invalid_blocks = lambda self, invalid_block_ids, num_scheduled_tokens: set()


def _ignore_max_loras() -> None:
    """Scheduler.schedule reads self.lora_config for both the max_loras skip and its per-step
    assert; without it neither runs. The config itself (and the block hashes) keep LoRA on."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.lora_config = None

    Scheduler.__init__ = __init__


def _min_tokens_unmasked() -> None:
    """MinTokensLogitsProcessor leaves the logits as they are, with or without drafts."""
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

    MinTokensLogitsProcessor.apply = lambda self, logits: logits
    MinTokensLogitsProcessor.apply_with_spec_decode = lambda self, logits, *args, **kwargs: logits


def _ignore_grammar_cut() -> None:
    """Every grammar backend's validate_tokens (the cut update_draft_token_ids makes) keeps
    all the drafts it is given."""
    from vllm.v1.structured_output.backend_guidance import GuidanceGrammar
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    for grammar in (XgrammarGrammar, GuidanceGrammar):
        grammar.validate_tokens = lambda self, tokens: list(tokens)


def _async_grammar_drafts_undelivered() -> None:
    """Scheduler.update_draft_token_ids_in_output (called by step_with_batch_queue for a
    deferred batch) leaves the scheduler output as schedule() made it."""
    from vllm.v1.core.sched.scheduler import Scheduler

    Scheduler.update_draft_token_ids_in_output = lambda self, draft_token_ids, scheduler_output: None


def _grammar_in_reasoning() -> None:
    """StructuredOutputManager._get_reasoner (should_fill_bitmask's, should_advance's and the
    bitmask filling's way to the request's reasoning parser) returns None."""
    from vllm.v1.structured_output import StructuredOutputManager

    StructuredOutputManager._get_reasoner = lambda self, request: None


def _lora_ignored() -> None:
    """Every linear layer with LoRA (qkv, o, gate_up, down) returns its base output as it is."""
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    BaseLinearLayerWithLoRA._apply_lora_to_output = lambda self, x, output: output


def _lora_hash_ignored() -> None:
    """generate_block_hash_extra_keys reads a request's adapter keys from this function."""
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils._gen_lora_extra_hash_keys = lambda request: []


def _no_block_removed_events() -> None:
    """Every BlockRemoved of the block pool goes through this method (eviction, promotion)."""
    from vllm.v1.core.block_pool import BlockPool

    BlockPool._emit_block_removed_events = lambda self, block_hashes: None


def _reset_ignores_blocks_in_use() -> None:
    """BlockPool.reset_prefix_cache refuses while any block but the null one is out of the free
    queue; the mutant's pool reports every block free for the check alone."""
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.reset_prefix_cache

    def reset_prefix_cache(self) -> bool:
        self.get_num_free_blocks = lambda: self.num_gpu_blocks - 1
        try:
            return original(self)
        finally:
            del self.get_num_free_blocks

    BlockPool.reset_prefix_cache = reset_prefix_cache


def _encoder_cache_per_request() -> None:
    """Each item's identifier (the encoder cache's key, and its block hash key) is prefixed with
    its request's id as the Request is built: no two requests share an item's output."""
    import dataclasses

    from vllm.v1.request import Request

    original = Request.__init__

    def __init__(self, *args, **kwargs):
        features = kwargs.get("mm_features")
        if features:
            kwargs["mm_features"] = [dataclasses.replace(f, identifier=f"{kwargs['request_id']}-{f.identifier}")
                                     for f in features]
        original(self, *args, **kwargs)

    Request.__init__ = __init__


def _cap_running_chunk(cap: int):
    """The first `min(num_new_tokens, token_budget)` of Scheduler.schedule is the running
    loop's (the waiting loop's comes after it); the edit goes there alone, installed as a
    generated mutant is (the function's code swapped, every subclass seeing it)."""

    def apply() -> None:
        import inspect

        from conformance.formats.mutant import Mutant
        from vllm.v1.core.sched import scheduler

        from . import mutant_catalog

        source = inspect.getsource(scheduler)
        original = "num_new_tokens = min(num_new_tokens, token_budget)"
        at = source.index(original)
        start = len(source[:at].encode())
        mutant_catalog.install(Mutant(
            id=f"cap-running-chunk-{cap}", file="vllm/v1/core/sched/scheduler.py", function="Scheduler.schedule",
            operator="TEST DEVICE", line=source.count("\n", 0, at) + 1, start=start, end=start + len(original),
            original=original, replacement=f"num_new_tokens = min(num_new_tokens, token_budget, {cap})"))

    return apply


def _streaming_sessions_free_slots() -> None:
    """Scheduler.num_waiting_for_streaming_input, an instance attribute vLLM's __init__ sets
    and its session code adds to and takes from, becomes a class property that reads 0 and
    drops what is written: every use of it (max_num_seqs, the unfinished count) sees none."""
    from vllm.v1.core.sched.scheduler import Scheduler

    Scheduler.num_waiting_for_streaming_input = property(lambda self: 0, lambda self, value: None)


MUTANTS = {
    "no-draft-reservation": _no_draft_reservation,
    "draft-plus-one": _draft_count(+1),
    "draft-minus-one": _draft_count(-1),
    "ignore-max-num-seqs": _ignore_max_num_seqs,
    "crash-after-divergence": _crash_after_divergence,
    "logit-scale-1.10": _logit_scale,
    "drop-bonus-token": _drop_bonus_token,
    "budget-minus-one-after-1000": _budget_minus_one_after(1000),
    "sync-loop-under-async": _sync_loop_under_async,
    "keep-placeholders-at-preemption": _keep_placeholders_at_preemption,
    "sliding-window-as-full": _sliding_window_as_full,
    "mamba-unaligned-split": _mamba_unaligned_split,
    "ignore-invalid-kv-blocks": _ignore_invalid_kv_blocks,
    "min-tokens-unmasked": _min_tokens_unmasked,
    "ignore-max-loras": _ignore_max_loras,
    "cap-running-chunk-2048": _cap_running_chunk(2048),
    "ignore-grammar-cut": _ignore_grammar_cut,
    "async-grammar-drafts-undelivered": _async_grammar_drafts_undelivered,
    "grammar-in-reasoning": _grammar_in_reasoning,
    "lora-ignored": _lora_ignored,
    "lora-hash-ignored": _lora_hash_ignored,
    "streaming-sessions-free-slots": _streaming_sessions_free_slots,
    "no-block-removed-events": _no_block_removed_events,
    "reset-ignores-blocks-in-use": _reset_ignores_blocks_in_use,
    "encoder-cache-per-request": _encoder_cache_per_request,
}


def apply(name: str) -> None:
    """Patch the imported release in place. Call once, before any run."""
    if name.startswith("catalog:"):  # generated: installed by mutant_server.py before the worker starts
        from . import mutant_catalog

        if mutant_catalog.INSTALLED != name.removeprefix("catalog:"):
            raise ValueError(f"generated mutant {name!r} is served by engines/vllm/mutant_server.py only")
        return
    if name not in MUTANTS:
        catalog = (f"; a mutant of `parity adequacy`'s catalog is named with catalog: "
                   f"(RELEASE+mutant:catalog:{name})" if re.fullmatch(r"m[0-9a-f]{10}", name) else "")
        raise ValueError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}{catalog}")
    MUTANTS[name]()
    print(BANNER.format(name=name), file=sys.stderr)
