"""The gate's engines, each an EngineRef with its role: the oracle, each candidate (or the other
pins as stand-ins); how the report names each, and which cannot serve the engine layers here."""

from __future__ import annotations

import shlex
from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.errors import InputError
from conformance.formats.pins import Pins
from conformance.gate.shards import Unit
from conformance.judging.verdict import CANDIDATE, ORACLE, STAND_IN
from conformance.process.launch import prepare_engine


def gate_engines(pins: Pins, candidates: list[str], log, stand_ins: str = "goldens") -> list[EngineRef]:
    """The oracle, then each candidate (or, with none, the other pins as stand-ins: read from
    their goldens, gate/recorded.py, or with `stand_ins` "live" run as the oracle is). An engine
    that resolves without building anything is resolved now (a command that names no
    executable, or a catalog mutant, which only `parity fuzz` serves, stops the gate before any
    engine starts); a pin's environment is built only when a runner has work for it."""
    engines = [EngineRef.pin(pins.oracle).with_role(ORACLE)]
    if not candidates:
        read = stand_ins != "live"
        log("[gate] no candidate configured: the other pins stand in as informational candidates"
            + (", read from their goldens (--stand-ins live runs them)" if read else ", run live"))
        engines += [(EngineRef.recorded(r) if read else EngineRef.pin(r)).with_role(STAND_IN)
                    for r in pins.candidates]
    for text in candidates:
        ref = EngineRef.parse(text, pins, named=True).with_role(CANDIDATE)
        if ref.kind.resolved_early:
            prepare_engine(ref, pins, log)
        engines.append(ref)
    keys = [e.key for e in engines]
    if len(set(keys)) != len(keys):
        raise InputError(f"--candidate: two engines have the same name ({keys}); "
                         "name them with NAME=COMMAND")
    return engines


def refused(engines: list[EngineRef], pins: Pins, device: str) -> frozenset:
    """(engine key, "engine") for each engine that does not serve the engine layers on this
    device (its kind says: on CPU a pin without a CPU engine build, docs/release-gate.md)."""
    return frozenset((e.key, "engine") for e in engines if not e.kind.engine_layers_here(e, pins, device))


def report_labels(engines: list[EngineRef], units: list[Unit], traces: dict) -> dict[EngineRef, str]:
    """How the report names each engine: a pin by its label, a named candidate by its NAME, any
    other by what its `hello` said (engine and version), its command line shown once apart.
    Two engines that say the same hello are told apart by their arguments."""
    labels: dict[EngineRef, str] = {}
    for engine in engines:
        label = engine.name or (engine.key if engine.command is None else None)
        if label is None:
            argv = engine.argv
            hello = next((traces[u.key].engine for u in units
                          if u.engine == engine.key and traces[u.key].engine.get("name")), None)
            label = f"{hello['name']} {hello['version']}" if hello else Path(argv[0]).name
            if label in labels.values() and argv[1:]:
                label += f" ({shlex.join(argv[1:])})"
        number = 2
        while label in labels.values() or f"{label} #{number}" in labels.values():
            label = f"{label.rsplit(' #', 1)[0]} #{number}"
            number += 1
        labels[engine] = label
    return labels
