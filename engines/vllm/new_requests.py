"""The Request a workload entry becomes, a client's aborts, and a finished request's output
record: one way for both drivers (steps_layer's synchronous loop and async_loop's batch queue)."""
from __future__ import annotations

ARRIVAL_TIME_BASE = 1_000_000.0  # fixed arrival times: nothing depends on the clock


def new_request(req: dict, prompt, arrival: int, block_hasher, resumable: bool | None = None):
    """The Request a workload entry becomes when it arrives at driver step `arrival` (the
    synchronous driver's and the batch-queue loop's one way to make it). A streaming session's
    first chunk is resumable (vLLM's AsyncLLM makes each input chunk so); `resumable` given
    overrides that, for its later inputs (session_input)."""
    from vllm.v1.request import Request

    params = sampling_params(req)
    kwargs = {"block_hasher": block_hasher} if block_hasher is not None else {}
    if resumable is None:
        resumable = "session" in req
    if resumable:  # only a session's Request takes it: every pin's Request knows it
        kwargs["resumable"] = True
    return Request(request_id=req["id"], prompt_token_ids=list(prompt), sampling_params=params,
                   pooling_params=None, arrival_time=ARRIVAL_TIME_BASE + arrival,
                   priority=req.get("priority", 0), lora_request=lora_request(req),
                   mm_features=mm_features(req), **kwargs)


MODALITY = "audio"  # the one modality of the tiny multimodal model (scenarios/models/qwen2-audio-tiny)


def mm_features(req: dict):
    """vLLM's own MultiModalFeatureSpec per item of the request's `encoder_inputs` (None without
    any), as its input processor leaves them: the placeholder's PlaceholderRange, the item's hash
    as both identifier and mm_hash, no data (the scheduler reads none; no encoder runs). Made
    before the Request, whose block hashes key each block by the items it overlaps."""
    if not req.get("encoder_inputs"):
        return None
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return [MultiModalFeatureSpec(data=None, modality=MODALITY, identifier=item["hash"],
                                  mm_position=PlaceholderRange(offset=item["offset"], length=item["length"]),
                                  mm_hash=item["hash"])
            for item in req["encoder_inputs"]]


def session_inputs(scheduler, inputs, step: int, seed: int, vocab: int, block_hasher) -> list:
    """A streaming session's inputs arriving at `step` (sessions.inputs_by_step), each given to
    Scheduler.add_request as vLLM's AsyncLLM sends it to the engine core: a chunk as a resumable
    request of the session's id with the chunk's tokens and max_tokens; the end of the input
    stream as AsyncLLM's `final_req`, not resumable, prompt [0]. The scheduler queues it, starts
    the chunk, or ends the session. Returns the sessions this ended (an end that came while the
    session waited for input finishes it at once, as an abort)."""
    from conformance.formats.workload import chunk_tokens

    ended = []
    for req, index in inputs:
        if index is None:
            update = new_request(req, [0], step, block_hasher, resumable=False)
        else:
            chunk = req["session"]["chunks"][index]
            update = new_request({**req, "max_tokens": chunk["max_tokens"]},
                                 chunk_tokens(seed, req["id"], index, chunk["prompt_len"], vocab), step,
                                 block_hasher, resumable=True)
        session = scheduler.requests.get(req["id"])
        was_finished = session is None or session.is_finished()
        scheduler.add_request(update)
        if not was_finished and session.is_finished():
            ended.append(session)
    return ended


LORA_PATH = "/stand-in-lora/"  # a path the scheduler never opens: no adapter weights are loaded


def lora_request(req: dict):
    """vLLM's own LoRARequest for the request's adapter (None without one). The scheduler reads
    its lora_int_id against max_loras; the block hasher keys each block by its lora_name (and,
    from 0.33.0, its path: one path per name here, so the name alone tells adapters apart). It
    is made before the Request, because the Request computes its block hashes as it is built."""
    if "lora" not in req:
        return None
    from vllm.lora.request import LoRARequest

    name = req["lora"]["name"]
    return LoRARequest(lora_name=name, lora_int_id=req["lora"]["id"], lora_path=LORA_PATH + name)


def sampling_params(req: dict):
    """The request's SamplingParams as vLLM's input processor leaves them: with no eos token in
    the workload, ignore_eos (the stand-in has none); with one, ignore_eos false and the eos set
    the way the processor sets the tokenizer's (update_from_generation_config, no generation
    config), so the scheduler's check_stop sees it."""
    from vllm import SamplingParams
    from vllm.sampling_params import RepetitionDetectionParams

    from .kv_connector import PARAMS

    eos = req.get("eos_token_id")
    repetition = req.get("repetition_detection")
    # a client's kv_transfer_params reach the KV connector through extra_args, as vLLM's
    # OpenAI server passes them (engines/vllm/kv_connector.py reads `external` there)
    extra = {"kv_transfer_params": {PARAMS: dict(req["external"])}} if "external" in req else None
    if "kv_cache_report_mode" in req:  # read by the Request from extra_args, as a client sends it
        extra = {**(extra or {}), "kv_cache_report_mode": req["kv_cache_report_mode"]}
    structured = None
    if "structured_output" in req:  # engines/vllm/grammar.py runs the processor's check on it
        from .grammar import params as structured_params

        structured = structured_params(req["structured_output"])
    params = SamplingParams(
        max_tokens=req["max_tokens"], stop_token_ids=list(req["stop_token_ids"]), ignore_eos=eos is None,
        min_tokens=req.get("min_tokens", 0),
        repetition_detection=RepetitionDetectionParams(**repetition) if repetition else None, extra_args=extra,
        structured_outputs=structured)
    if eos is not None:
        params.update_from_generation_config({}, eos)
    return params


def abort_requests(scheduler, ids) -> list:
    """A client's aborts at one step, in workload order, one finish_requests() call per id:
    given several ids at once, vLLM walks them as a set, so the order their blocks are freed
    (and the block ids handed out next) would follow PYTHONHASHSEED. Returns the requests
    aborted (a request already finished is left alone)."""
    from vllm.v1.request import RequestStatus

    aborted = []
    for rid in ids:
        aborted += scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
    return aborted


def output_record(rid: str, request) -> dict:
    """A finished request's outputs; stop_reason as vLLM's Request holds it (and its clients
    get it): the stop token, the string "repetition_detected" for a repetition stop, or null."""
    reason = request.get_finished_reason()
    stop = request.stop_reason
    return {"id": rid, "output_token_ids": [int(t) for t in request.output_token_ids],
            "finish_reason": reason.name.lower() if reason is not None else None,
            "stop_reason": stop if isinstance(stop, str) else int(stop) if isinstance(stop, int) else None}
