"""Structured outputs in the stand-in layers: a request's grammar, as the release's own code runs it.

The input processor's check (`SamplingParams.verify`, which picks the backend under
`structured_outputs_config.backend` "auto": xgrammar, else llguidance), then EngineCore's
`grammar_init` on the release's StructuredOutputManager, then the scheduler's own handling:
`get_grammar_bitmask` for each step's sampling, `validate_tokens` cutting the drafts in
`update_draft_token_ids`, `accept_tokens` advancing the grammar in `update_from_output`, and
`grammar_compile_error_reqs` finishing a request whose grammar failed to compile as an error.

What the stand-in adds (engines/PROTOCOL.md "Structured outputs"): compilation is waited for at
the request's arrival (vLLM compiles on a thread pool; the stand-in's steps must not depend on
how fast a machine compiles), sampling among the ids the masked logits allow
(workload.masked_choice), and the drafter's proposals under a grammar (`masked_draft`).

Imported only inside a pin's environment.
"""

from __future__ import annotations

import sys
import types
from concurrent.futures import Future, wait

from conformance.formats.workload import Context, allowed_ids, masked_choice, reasoning_next

LMFE = "vllm.v1.structured_output.backend_lm_format_enforcer"


def params(spec: dict):
    """vLLM's StructuredOutputsParams for a workload's `structured_output` (one key of json,
    regex, choice, passed as given)."""
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**spec)


def admit(scheduler, request) -> bool:
    """The input processor's check and EngineCore's grammar_init for a request with a grammar,
    before the scheduler sees it. False when either refuses it: the client then gets an error
    and the scheduler never holds it (0.33.0's one-backend-per-engine check raises in
    grammar_init; any release's processor refuses a grammar no backend accepts). A grammar that
    passes both and fails to compile is the scheduler's to finish (grammar_compile_error_reqs)."""
    from vllm.exceptions import VLLMValidationError

    manager = scheduler.structured_output_manager
    config = scheduler.vllm_config
    lm_format_enforcer_importable()
    try:
        request.sampling_params.verify(config.model_config, config.speculative_config,
                                       config.structured_outputs_config, manager.tokenizer)
        manager.grammar_init(request)
    except (VLLMValidationError, ValueError):
        return False
    compiled(request)
    return True


def compiled(request) -> None:
    """Wait for the request's grammar to compile (see the module doc): vLLM compiles it on a
    thread pool and the scheduler skips the request until it is done, so the steps would follow
    the machine's speed."""
    grammar = request.structured_output_request._grammar
    if isinstance(grammar, Future):
        wait([grammar])


def lm_format_enforcer_importable() -> None:
    """SamplingParams' check imports lm-format-enforcer's validator whatever the backend; the
    pin environments leave that package out (engines/vllm/requirements-cpu-left-out.toml). Where
    it is missing, the module is NOT INSTALLED: its one name imported there refuses, and is
    reached only under structured_outputs_config.backend "lm-format-enforcer", which no
    scenario can set."""
    if LMFE in sys.modules:
        return
    try:
        __import__(LMFE)
    except ModuleNotFoundError:
        module = types.ModuleType(LMFE, "NOT INSTALLED: lm-format-enforcer is not in this environment")

        def validate_structured_output_request_lm_format_enforcer(sampling_params):
            raise ValueError("lm-format-enforcer is not installed in this environment")

        module.validate_structured_output_request_lm_format_enforcer = \
            validate_structured_output_request_lm_format_enforcer
        sys.modules[LMFE] = module


def allowed_by_position(scheduler, output, batch: list[str]) -> dict[str, list[list[int]]]:
    """Request id -> the ids its grammar allows at each of its positions this step (each
    scheduled draft, then the bonus): the scheduler's own get_grammar_bitmask (EngineCore.step's)
    applied by the release's own apply_grammar_bitmask (the GPU model runner's) to zero logits
    laid out as the runner's are, `batch` being its requests in batch order; what stays finite
    is allowed. The release decides how rows are packed (0.33.0 gives each request K + 1)."""
    spec = output.scheduled_spec_decode_tokens or {}
    return allowed_rows(scheduler, output, scheduler.get_grammar_bitmask(output),
                        {rid: len(spec.get(rid, ())) for rid in batch})


def allowed_rows(scheduler, output, grammar_output, drafts: dict[str, int]) -> dict[str, list[list[int]]]:
    """allowed_by_position for a grammar output already computed (the batch-queue loop's, for a
    deferred batch after its drafts arrived), `drafts` being each request's draft count in batch
    order as the model runner laid out its logits when it executed the batch."""
    import torch
    from types import SimpleNamespace

    from vllm.v1.structured_output.utils import apply_grammar_bitmask

    if grammar_output is None:
        return {}
    batch = list(drafts)
    first, at = {}, 0  # each request's first logits row: one per draft and one more
    for rid in batch:
        first[rid] = at
        at += 1 + drafts[rid]
    logits = torch.zeros(at, scheduler.vllm_config.model_config.get_vocab_size(), dtype=torch.float32)
    apply_grammar_bitmask(output, grammar_output, SimpleNamespace(req_ids=list(batch)), logits)
    finite = torch.isfinite(logits)
    return {rid: [torch.nonzero(finite[first[rid] + i]).flatten().tolist() for i in range(1 + drafts[rid])]
            for rid in grammar_output.structured_output_request_ids if rid in first}


def errors(scheduler) -> list[str]:
    """The requests the scheduler will finish as grammar errors at this step's update (a set
    in 0.27.1 and 0.28.0, a dict of RequestError in 0.33.0)."""
    return sorted(str(rid) for rid in scheduler.grammar_compile_error_reqs)


def masked_draft(seed: int, tokens, k: int, accept: int, vocab_size: int, request, manager,
                 end: tuple[int, int] | None = None, reasoning: bool = False) -> list[int]:
    """The stand-in drafter's k tokens for a request with a grammar (workload module doc):
    while it follows the grammar, each target token is masked_choice of the row the request's
    grammar gives (a full row once the grammar terminated, as the manager fills it); the first
    wrong token is that target token plus one, after which the grammar is not followed. The
    grammar is rolled back to where it was, as the manager's own bitmask filling does.
    `reasoning`: the request is still reasoning at the window's start (a reasoning parser, and
    its tokens do not hold its reasoning `end` yet): its drafts are reasoning_next's, with no
    grammar followed, until an accepted draft is the end token at the end's position."""
    grammar = request.structured_output_request.grammar
    row = manager.backend.allocate_token_bitmask(1) if manager.backend is not None else None
    context = Context.of(tokens)
    out, advanced, following = [], 0, row is not None
    for i in range(k):
        at_end = end is not None and len(context) == end[0]
        usual = reasoning_next(seed, context, vocab_size, end)
        true = usual
        constrained = following and not reasoning and not grammar.is_terminated()
        if constrained:
            grammar.fill_bitmask(row, 0)
            true = masked_choice(allowed_ids(row[0].tolist()), usual)
        token = true if i < accept else (true + 1) % vocab_size
        if i >= accept:
            following = False
        elif reasoning:
            reasoning = not (at_end and token == end[1])
        elif constrained and grammar.accept_tokens(str(request.request_id), [token]):
            advanced += 1
        else:
            following = False
        out.append(token)
        context.append(token)
    if advanced:
        grammar.rollback(advanced)
    return out


def still_reasoning(tokens, end: tuple[int, int] | None) -> bool:
    """Under a reasoning parser: whether a request's tokens (a list, or vLLM's ConstantList) do
    not hold its reasoning end yet (workload module doc)."""
    return end is None or len(tokens) <= end[0] or tokens[end[0]] != end[1]


def refuse(request) -> str:
    """A request refused before the scheduler: finished as an error with no output, as its
    client sees it. Returns its id."""
    from vllm.v1.request import RequestStatus

    request.status = RequestStatus.FINISHED_ERROR
    return str(request.request_id)
