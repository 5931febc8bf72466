"""The gate's engines: the oracle, each candidate (or the other pins as stand-ins), how the
report names each, and which cannot serve the engine layers here."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..engine import resolve_engine
from ..pins import Pins, parse_pin
from .shards import Unit
from .verdict import CANDIDATE, ORACLE, STAND_IN

NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.+:-]{0,63})=(\S.*)$")  # --candidate NAME=COMMAND


@dataclass(frozen=True)
class GateEngine:
    key: str  # names it in the plan, the same on every runner: NAME, the pin's label, or the command
    role: str
    engine: str  # what resolves it: a pin, a pin+mutant, or a command line
    name: str | None = None  # NAME of --candidate NAME=COMMAND
    command: str | None = None  # a command-line engine's command, shown once in the report

    def to_json(self) -> dict:
        return {"key": self.key, "role": self.role, "engine": self.engine, "name": self.name,
                "command": self.command}


def gate_engines(pins: Pins, candidates: list[str], log) -> list[GateEngine]:
    """The oracle, then each candidate (or, with none, the other pins as stand-ins). A command
    line is checked now (bad input stops the gate before any engine starts); a pin's
    environment is built only when a runner has work for it."""
    engines = [GateEngine(f"vllm-{pins.oracle}", ORACLE, pins.oracle)]
    if not candidates:
        log("[gate] no candidate configured: the other pins stand in as informational candidates")
        engines += [GateEngine(f"vllm-{r}", STAND_IN, r) for r in pins.candidates]
    for text in candidates:
        name, engine = None, text
        match = NAMED.match(text)
        if match and not _pin_label(text, pins):
            name, engine = match[1], match[2]
        label = _pin_label(engine, pins)
        command = None
        if label is None:  # a command line: split, never run through a shell
            resolve_engine(engine, pins, log)
            command = shlex.join(shlex.split(engine))
        engines.append(GateEngine(name or label or command, CANDIDATE, engine, name, command))
    keys = [e.key for e in engines]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--candidate: two engines have the same name ({keys}); "
                         "name them with NAME=COMMAND")
    return engines


def _pin_label(text: str, pins: Pins) -> str | None:
    """vllm-0.28.0 for a pin, vllm-0.27.1+mutant:NAME for a mutant; None for a command line."""
    pin, _, mutant = text.partition("+mutant:")
    release = parse_pin(pin, pins)
    if release is None:
        return None
    return f"vllm-{release}+mutant:{mutant}" if mutant else f"vllm-{release}"


def _refused(engines: list[GateEngine], pins: Pins) -> frozenset:
    """On CPU a pin without a CPU engine build refuses the engine layers at once (docs/release-gate.md)."""
    from ..envs import device_mode

    if device_mode() != "cpu":
        return frozenset()
    return frozenset((e.key, "engine") for e in engines if e.command is None
                     and not pins.cpu_engine_build(parse_pin(e.engine.partition("+mutant:")[0], pins)))


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
