"""Streaming input sessions: a request whose input arrives in chunks (vLLM's resumable requests).

A workload request with a `session` is a streaming-input session as vLLM's AsyncLLM feeds one
(`generate` given an async generator of StreamingInput): its own prompt is the first input chunk,
each later chunk arrives at its step as another request of the same id with `resumable` true,
and when the client's input stream closes, a last request of the same id with `resumable` false
(AsyncLLM's `final_req`, prompt [0]) tells the scheduler the session is over. The scheduler does
the rest (vLLM 0.27.1 Scheduler.add_request, _handle_stopped_request, _update_request_as_session):
a chunk that stops (max_tokens, a stop token) does not finish the session; its outputs but the
last become prompt, the next chunk's tokens follow, and the session waits for input (holding its
blocks and a request slot) until a chunk comes; the end finishes it, as an abort when it came
while the session waited.

    "session": {"chunks": [{"arrival_step": int,  # when the chunk arrives: non-decreasing,
                            "prompt_len": int,    #   from the request's arrival_step; its
                            "max_tokens": int}],  #   new tokens (>= 1); optional, default the
                                                  #   request's (0.33.0 applies it to the chunk,
                                                  #   0.27.1 and 0.28.0 keep the first chunk's)
                "end_step": int}                  # the input stream closes: from the last
                                                  #   chunk's arrival_step (or the request's)

Chunk j's tokens are `chunk_tokens(seed, id, j, prompt_len, vocab_size)` (workload.py). A session
has no abort_step (its end is the client's), no `external` (a KV connector's load is a first
chunk's), no `structured_output` (a grammar error ends a session early), and no request
`continues` one (its output is not a single request's).

Standard library only, like workload.py: `check` is workload.FieldChecker.
"""

from __future__ import annotations

SESSION_KEYS = {"chunks", "end_step"}
CHUNK_KEYS = {"arrival_step", "prompt_len", "max_tokens"}
MAX_CHUNKS = 64
NOT_WITH = {"abort_step": "a session ends when its input stream closes (end_step), not by an abort",
            "external": "a KV connector's remote prompt is a single request's",
            "structured_output": "a grammar that fails ends a session before its input does"}


def validate_session(check, where: str, raw: object, req: dict, max_steps: int, limit: int) -> dict:
    """The session with each chunk's max_tokens filled in; raises ScenarioError naming the field."""
    check.keys(where, raw, SESSION_KEYS, ("chunks", "end_step"))
    for key, why in NOT_WITH.items():
        if key in req:
            check.fail(f"{where}", f"cannot go with the request's `{key}`: {why}")
    chunks = raw["chunks"]
    if not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS:
        check.fail(f"{where}.chunks", f"must be an array of at most {MAX_CHUNKS} chunks")
    out, at = [], req["arrival_step"]
    for j, chunk in enumerate(chunks):
        cw = f"{where}.chunks[{j}]"
        check.keys(cw, chunk, CHUNK_KEYS, ("arrival_step", "prompt_len"))
        at = check.integer(f"{cw}.arrival_step", chunk["arrival_step"], at, max_steps - 1)
        out.append({"arrival_step": at, "prompt_len": check.integer(f"{cw}.prompt_len", chunk["prompt_len"], 1, limit),
                    "max_tokens": check.integer(f"{cw}.max_tokens", chunk.get("max_tokens", req["max_tokens"]),
                                                1, limit)})
    end = check.integer(f"{where}.end_step", raw["end_step"], at, max_steps - 1)
    return {"chunks": out, "end_step": end}


def check_sessions(check, requests: list[dict], lengths: dict[str, int], max_model_len: int | None) -> None:
    """No request continues a session, and a session fits max_model_len however its chunks stop:
    its prompt, every chunk's tokens and every chunk's max_tokens outputs."""
    sessions = {req["id"] for req in requests if "session" in req}
    for i, req in enumerate(requests):
        if req.get("continues") in sessions:
            check.fail(f"workload.requests[{i}].continues", f"names {req['continues']!r}, a streaming session: "
                       "its output is its chunks', not one request's")
        if "session" not in req or max_model_len is None:
            continue
        chunks = req["session"]["chunks"]
        total = lengths[req["id"]] + req["max_tokens"] + sum(c["prompt_len"] + c["max_tokens"] for c in chunks)
        if total > max_model_len:
            check.fail(f"workload.requests[{i}].session", f"its prompt, chunks and each chunk's max_tokens come to "
                       f"{total} tokens, over engine_args.max_model_len = {max_model_len}")


def inputs_by_step(workload: dict) -> dict[int, list[tuple[dict, int | None]]]:
    """step -> the session inputs arriving then, in workload order, chunks before ends:
    (request, chunk index) for a chunk, (request, None) for the end of its input stream."""
    out: dict[int, list[tuple[dict, int | None]]] = {}
    for req in workload["requests"]:
        for j, chunk in enumerate(req.get("session", {}).get("chunks", ())):
            out.setdefault(chunk["arrival_step"], []).append((req, j))
    for req in workload["requests"]:
        if "session" in req:
            out.setdefault(req["session"]["end_step"], []).append((req, None))
    return out
