"""The engine's side of the protocol (engines/PROTOCOL.md): the one serve loop of every Python
engine, the pinned vLLM worker and the TEST DOUBLE engines alike. The C++ kit's counterpart is
`parity::serve` (engines/cpp/include/parity/protocol.hpp).

Standard library only: the vLLM worker imports this module in each pin's own environment.
"""

from __future__ import annotations

import inspect
import sys
import traceback
from typing import BinaryIO, Callable, Iterable

from conformance.formats import protocol

# A run's answer: for each layer asked, in order, the layer's name and its records.
Answer = Iterable[tuple[str, Iterable[dict]]]


class RunError(Exception):
    """Ends a run with an `error` of `kind` (one of protocol.ERROR_KINDS) instead of `done`;
    raised by a run callback, before or after it yielded records."""

    def __init__(self, kind: str, message: str):
        if kind not in protocol.ERROR_KINDS:
            raise ValueError(f"expected an error kind in {list(protocol.ERROR_KINDS)}, got {kind!r}")
        super().__init__(message)
        self.kind = kind


def writer(out: BinaryIO, encode: Callable[[dict], bytes] = protocol.encode) -> Callable[[dict], None]:
    """A `send` for serve(): each message one protocol line on `out`, flushed at once (the
    harness reads a record the moment it is written, and keeps it if the engine then dies).
    `encode` writes the line: protocol.encode, or one giving its bytes faster (the vLLM
    worker's, engines/vllm/lines.py)."""

    def send(message: dict) -> None:
        out.write(encode(message))
        out.flush()

    return send


def serve(hello: dict, run: Callable[[dict, list], Answer], *, bad_request: tuple[type[Exception], ...] = (),
          send: Callable[[dict], None] | None = None, lines: Iterable[bytes] | None = None) -> int:
    """Sends the `hello` (its fields; `protocol` is this version unless given), then answers
    every `run` until `shutdown` or the end of input, and returns the exit status (0).

    `run(scenario, layers)` answers one run (see Answer); the run message's optional fields
    (protocol.OPTIONAL["run"]) that `run` names as keyword arguments are passed when the message
    has them. Each record is sent as it is yielded, numbered from 0 within its layer, then
    `done` with the count. A RunError ends the run with
    an `error` of its kind, an exception of a `bad_request` type (a malformed scenario) with one
    of kind bad_request; any other exception is the engine's own failure: its traceback goes to
    stderr and the run ends with an `error` of kind internal. Records already sent stay sent.
    A line that cannot be read is answered with an `error` whose id is null, kind bad_request,
    and serving goes on.

    `send` writes one message (default: stdout, flushed); `lines` are the lines read (default:
    stdin). A TEST DOUBLE that must break the protocol on purpose passes its own `send`.
    """
    send = send or writer(sys.stdout.buffer)
    # the run message's optional fields this engine reads (run's keyword arguments); it ignores
    # the others, as the protocol lets it
    accepted = set(inspect.signature(run).parameters) & set(protocol.OPTIONAL["run"])
    send({"type": "hello", "protocol": protocol.PROTOCOL_VERSION, **hello})
    for line in sys.stdin.buffer if lines is None else lines:
        try:
            message = protocol.decode(line, ("run", "shutdown"))
        except protocol.ProtocolError as exc:
            send({"type": "error", "id": None, "kind": "bad_request", "message": str(exc)})
            continue
        if message["type"] == "shutdown":
            break
        run_id = message["id"]
        try:
            count = 0
            options = {key: message[key] for key in accepted if key in message}
            for layer, records in run(message["scenario"], message["layers"], **options):
                for seq, data in enumerate(records):
                    send({"type": "record", "id": run_id, "layer": layer, "seq": seq, "data": data})
                    count += 1
            send({"type": "done", "id": run_id, "records": count})
        except RunError as exc:
            send({"type": "error", "id": run_id, "kind": exc.kind, "message": str(exc)})
        except bad_request as exc:
            send({"type": "error", "id": run_id, "kind": "bad_request", "message": str(exc)})
        except Exception as exc:
            traceback.print_exc()
            send({"type": "error", "id": run_id, "kind": "internal", "message": f"{type(exc).__name__}: {exc}"})
    return 0
