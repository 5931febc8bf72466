"""The gate's engines: the oracle, each candidate (or the other pins as stand-ins), how the
report names each, and which cannot serve the engine layers here."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.engine_ref import CATALOG, COMMAND, EngineRef
from conformance.formats.errors import InputError
from conformance.formats.pins import Pins
from conformance.gate.shards import Unit
from conformance.judging.verdict import CANDIDATE, ORACLE, STAND_IN
from conformance.process.launch import prepare_engine


@dataclass(frozen=True)
class GateEngine:
    key: str  # names it in the plan, the same on every runner: NAME, the pin's label, or the command
    role: str
    engine: str  # what resolves it: a pin, a pin+mutant, or a command line
    name: str | None = None  # NAME of --candidate NAME=COMMAND
    command: str | None = None  # a command-line engine's command, shown once in the report

    def ref(self, pins: Pins) -> EngineRef:
        """What `engine` names, parsed (a manifest's engines are read back as GateEngines)."""
        return EngineRef.parse(self.engine, pins)

    def to_json(self) -> dict:
        return {"key": self.key, "role": self.role, "engine": self.engine, "name": self.name,
                "command": self.command}


def gate_engines(pins: Pins, candidates: list[str], log) -> list[GateEngine]:
    """The oracle, then each candidate (or, with none, the other pins as stand-ins). A command
    line is checked now (bad input stops the gate before any engine starts); a pin's
    environment is built only when a runner has work for it."""
    pinned = [(EngineRef.pin(pins.oracle), ORACLE)]
    if not candidates:
        log("[gate] no candidate configured: the other pins stand in as informational candidates")
        pinned += [(EngineRef.pin(r), STAND_IN) for r in pins.candidates]
    engines = [GateEngine(ref.key, role, ref.text) for ref, role in pinned]
    for text in candidates:
        ref = EngineRef.parse(text, pins, named=True)
        if ref.kind in (COMMAND, CATALOG):  # a command that names no executable, or a catalog
            prepare_engine(ref, pins, log)  # mutant (only `parity fuzz` serves one), stops here
        engines.append(GateEngine(ref.key, CANDIDATE, ref.text, ref.name, ref.command))
    keys = [e.key for e in engines]
    if len(set(keys)) != len(keys):
        raise InputError(f"--candidate: two engines have the same name ({keys}); "
                         "name them with NAME=COMMAND")
    return engines


def _refused(engines: list[GateEngine], pins: Pins) -> frozenset:
    """On CPU a pin without a CPU engine build refuses the engine layers at once (docs/release-gate.md)."""
    from conformance.formats.settings import device_mode

    if device_mode() != "cpu":
        return frozenset()
    return frozenset((e.key, "engine") for e in engines if e.command is None
                     and not pins.cpu_engine_build(e.ref(pins).release))


def _labels(engines: list[GateEngine], units: list[Unit], traces: dict) -> dict[GateEngine, str]:
    """How the report names each engine: a pin by its label, a named candidate by its NAME, any
    other by what its `hello` said (engine and version), its command line shown once apart.
    Two engines that say the same hello are told apart by their arguments."""
    labels: dict[GateEngine, str] = {}
    for engine in engines:
        label = engine.name or (engine.key if engine.command is None else None)
        if label is None:
            argv = shlex.split(engine.command)
            hello = next((traces[u.key]["engine"] for u in units
                          if u.engine == engine.key and traces[u.key]["engine"].get("name")), None)
            label = f"{hello['name']} {hello['version']}" if hello else Path(argv[0]).name
            if label in labels.values() and argv[1:]:
                label += f" ({shlex.join(argv[1:])})"
        number = 2
        while label in labels.values() or f"{label} #{number}" in labels.values():
            label = f"{label.rsplit(' #', 1)[0]} #{number}"
            number += 1
        labels[engine] = label
    return labels
