"""Encoder inputs (multimodal items) in the stand-in layers: what the scheduler needs of them.

No encoder runs: the scheduler only reads each item's placeholder and hash (new_requests.py
makes vLLM's MultiModalFeatureSpec) and holds its output's slots in the encoder cache. Its
encoder compute budget and cache size are the release's own, computed by Scheduler.__init__
from the model's processor (vLLM's MultiModalBudget: the most tokens one item makes, and
max_num_batched_tokens), never set here.
"""
from __future__ import annotations


def prepare(scheduler, workload: dict, source: str) -> None:
    """Turns the encoder fields of the scheduler's records on when the workload has encoder
    inputs, after checking the model can take them: a multimodal model (a text-only one has no
    encoder budget, so a placeholder would wait forever), and no item longer than the encoder
    cache (vLLM's processor never makes one: the cache holds the longest item the model makes)."""
    from conformance.formats.scenario import ScenarioError

    items = [(i, j, item) for i, req in enumerate(workload["requests"])
             for j, item in enumerate(req.get("encoder_inputs", ()))]
    if not items:
        return
    size = int(scheduler.encoder_cache_manager.cache_size)
    if not scheduler.max_num_encoder_input_tokens or not size:
        raise ScenarioError(source, "workload.requests", "encoder_inputs need a multimodal model (its "
                            "processor gives the encoder budget): engine_args.model has none")
    for i, j, item in items:
        if item["length"] > size:
            raise ScenarioError(source, f"workload.requests[{i}].encoder_inputs[{j}].length",
                                f"must be at most {size}, the encoder cache's size for this model (the "
                                f"most tokens one of its items makes), got {item['length']}")
    if hasattr(scheduler, "parity_encoder"):
        scheduler.parity_encoder = True
