"""One computation per run, shared by the layers that run asks for.

The steps and outputs layers come from one drive of the scheduler (the steps sent as they are
made, the outputs kept), the three engine layers from one engine run: a run asking for several
of them computes it once. Never across runs:
worker.py calls forget() before each run, since the oracle runs every scenario twice to prove
it deterministic, and a remembered answer would prove nothing.
"""

from __future__ import annotations

import hashlib
import json

_RESULTS: dict = {}  # (what, scenario hash) -> result, for the run being served


def once(what: str, scenario: dict, compute):
    key = _key(what, scenario)
    if key not in _RESULTS:
        _RESULTS[key] = compute(scenario)
    return _RESULTS[key]


def keep(what: str, scenario: dict, result) -> None:
    """Keep a result computed while a layer was sent (the steps layer's outputs)."""
    _RESULTS[_key(what, scenario)] = result


def kept(what: str, scenario: dict):
    """What keep() kept for this run, or None."""
    return _RESULTS.get(_key(what, scenario))


def _key(what: str, scenario: dict) -> tuple:
    return (what, hashlib.sha256(json.dumps(scenario, sort_keys=True).encode()).hexdigest())


def forget() -> None:
    _RESULTS.clear()


def keep_partial(exc: BaseException, **records: list) -> None:
    """Attach what a failed run produced before failing (layer -> records), for sent()."""
    exc.parity_partial = {layer: list(recs) for layer, recs in records.items()}  # type: ignore[attr-defined]


def sent(layer: str, run):
    """Yield the layer's records of run(); when run() fails, first the records it produced
    before failing, then the failure: a port's crash at step 40 still shows steps 0 to 39."""
    try:
        result = run()
    except Exception as exc:
        yield from getattr(exc, "parity_partial", {}).get(layer, ())
        raise
    yield from result
