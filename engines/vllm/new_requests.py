"""The Request a workload entry becomes, a client's aborts, and a finished request's output
record: one way for both drivers (steps_layer's synchronous loop and async_loop's batch queue)."""
from __future__ import annotations

ARRIVAL_TIME_BASE = 1_000_000.0  # fixed arrival times: nothing depends on the clock


def new_request(req: dict, prompt, arrival: int, block_hasher):
    """The Request a workload entry becomes when it arrives at driver step `arrival` (the
    synchronous driver's and the batch-queue loop's one way to make it)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    # a client's kv_transfer_params reach the KV connector through extra_args, as vLLM's
    # OpenAI server passes them (engines/vllm/kv_connector.py reads `external` there)
    extra = {"kv_transfer_params": {"parity_external": dict(req["external"])}} if "external" in req else None
    params = SamplingParams(max_tokens=req["max_tokens"], stop_token_ids=list(req["stop_token_ids"]),
                            ignore_eos=True, extra_args=extra)
    kwargs = {"block_hasher": block_hasher} if block_hasher is not None else {}
    return Request(request_id=req["id"], prompt_token_ids=list(prompt), sampling_params=params,
                   pooling_params=None, arrival_time=ARRIVAL_TIME_BASE + arrival,
                   priority=req.get("priority", 0), **kwargs)


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
    reason = request.get_finished_reason()
    stop = request.stop_reason
    return {"id": rid, "output_token_ids": [int(t) for t in request.output_token_ids],
            "finish_reason": reason.name.lower() if reason is not None else None,
            "stop_reason": int(stop) if isinstance(stop, int) else None}
