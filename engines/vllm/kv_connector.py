"""TEST DOUBLE: the stand-in's KV connector, a remote KV store played as the stand-in plays the
model. The scheduler is the release's own; only the far side of the connector is stood in.

vLLM's scheduler asks a KV connector, at a request's admission, how many tokens beyond its
local prefix-cache hit an external store holds, and whether they load asynchronously
(`get_num_new_matched_tokens`); it allocates their blocks and tells the connector
(`update_state_after_alloc`); the worker loads them and reports loads that finished
(`KVConnectorOutput.finished_recving`) and blocks that failed (`invalid_block_ids`). Here the
workload says what the store holds, per request (`external`, conformance/formats/workload.py):

- the store holds the first `tokens` tokens of the request's prompt; asked with `n` tokens
  already computed locally (block-aligned), the connector answers max(0, min(tokens,
  prompt length - 1) - n): a request always computes its last prompt token;
- `async_steps` absent: the load is synchronous (done within the step that schedules it);
  k >= 0: asynchronous, reported finished in the model runner output of the k-th step after
  the one whose scheduler output issued it (0: that step's own output);
- `fail`: the request's first load fails (a transient transfer error; a load the scheduler
  issues again succeeds): the output that reports it (the issuing step's for a synchronous
  load) lists the first block of the loaded range in `invalid_block_ids`.

The connector reads this from the request's `kv_transfer_params` (vLLM's per-request channel
to its connector, `SamplingParams.extra_args["kv_transfer_params"]`), under PARAMS.
`Transfers` is the stand-in worker's side: it reads the loads each scheduler output issues and
says what each model runner output reports; both loops use it (steps_layer.py per driver step,
async_loop.py per batch its executor runs), counting steps in schedule() calls. Nothing here
reads the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                KVConnectorRole)

MODULE = "engines.vllm.kv_connector"  # found by path: a scenario names the class, StandInConnector
PARAMS = "parity_external"  # the key of kv_transfer_params the workload's `external` goes under


@dataclass
class Load:
    request_id: str
    block_ids: list[int]  # the blocks of the loaded range, in the first KV cache group
    async_steps: int | None
    fail: bool


class StandInMetadata(KVConnectorMetadata):
    """What one scheduler output tells the (stand-in) worker: the loads it issues."""

    def __init__(self, loads: list[Load]) -> None:
        self.loads = loads


class StandInConnector(KVConnectorBase_V1):
    """The scheduler side of the stand-in connector (see the module doc). It has no worker
    side: the stand-in model runner (Transfers) plays it."""

    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if role != KVConnectorRole.SCHEDULER:
            raise RuntimeError("the stand-in KV connector has a scheduler side only: the stand-in plays the worker")
        self._block_size = vllm_config.cache_config.block_size
        self._asked: dict[str, int] = {}  # request -> the local tokens it was asked with
        self._pending: list[Load] = []
        self._failed: set[str] = set()  # requests whose one failing load was issued

    # -- the scheduler side -------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        external = (request.kv_transfer_params or {}).get(PARAMS)
        if not external:
            return 0, False
        held = min(external["tokens"], request.num_prompt_tokens - 1)
        tokens = max(0, held - num_computed_tokens)
        self._asked[request.request_id] = num_computed_tokens
        return tokens, bool(tokens) and external.get("async_steps") is not None

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        external = request.kv_transfer_params[PARAMS]
        local = self._asked.pop(request.request_id)
        ids = list(blocks.get_block_ids()[0])
        first, end = local // self._block_size, -(-(local + num_external_tokens) // self._block_size)
        fail = bool(external.get("fail", False)) and request.request_id not in self._failed
        if fail:
            self._failed.add(request.request_id)
        self._pending.append(Load(request.request_id, ids[first:end], external.get("async_steps"), fail))

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        loads, self._pending = self._pending, []
        return StandInMetadata(loads)

    # -- the worker side: played by Transfers ---------------------------------------------------

    def start_load_kv(self, forward_context, **kwargs) -> None:
        raise RuntimeError("the stand-in KV connector has no worker side")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise RuntimeError("the stand-in KV connector has no worker side")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        raise RuntimeError("the stand-in KV connector has no worker side")

    def wait_for_save(self) -> None:
        raise RuntimeError("the stand-in KV connector has no worker side")


class Transfers:
    """The stand-in worker's KV transfers: per driver step, the connector output its model
    runner output carries (None where the scheduler has no connector)."""

    def __init__(self) -> None:
        self._due: dict[int, list[Load]] = {}  # step -> async loads reported in its output

    def output(self, step: int, scheduler_output):
        """The KVConnectorOutput of driver step `step`, whose scheduler output is given."""
        meta = getattr(scheduler_output, "kv_connector_metadata", None)
        if not isinstance(meta, StandInMetadata):
            return None
        from vllm.v1.outputs import KVConnectorOutput

        reported: list[Load] = []
        for load in meta.loads:
            if load.async_steps is None:
                reported.append(load)  # a synchronous load ends within its step
            else:
                self._due.setdefault(step + load.async_steps, []).append(load)
        due = self._due.pop(step, [])
        invalid = {load.block_ids[0] for load in reported + due if load.fail and load.block_ids}
        return KVConnectorOutput(finished_recving={load.request_id for load in due} or None,
                                 invalid_block_ids=invalid)


def kv_transfer_config(given: dict):
    """vLLM's KVTransferConfig for a scenario's `engine_args.kv_transfer_config` (checked by
    conformance/formats/scenario.py): the stand-in connector, found by its module path."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(**given, kv_connector_module_path=MODULE)
