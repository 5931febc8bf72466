"""What names an engine, parsed once, and the kinds of engine, each declared once.

Every form an engine is given in (a command's --engine or --candidate, a test, a shard's
manifest) becomes one EngineRef, which knows its kind, its release and mutant, its NAME, its
argument list, its role in a run (when it has one) and how the report names it.

  0.28.0, vllm==0.28.0, vllm-0.28.0   a pin (a pinned vLLM release)
  5559679229ab, vllm@5559679229ab     a pinned upstream commit (formats/pins.py), a pin like a release
  0.27.1+mutant:NAME                  a pin's TEST DEVICE mutant (engines/vllm/mutants.py)
  0.27.1+mutant:catalog:ID            a TEST DEVICE mutant of `parity adequacy`'s catalog
  0.28.0+goldens                      a pin as its committed goldens recorded it: no process runs
                                      (the gate's stand-ins by default, gate/recorded.py)
  NAME=COMMAND                        a named candidate (only where names are allowed: --candidate)
  anything else                       a command line, split like a shell would, never run by one

Whatever one kind of engine does differently from another is a field of its EngineKind, in
the manner of wptrunner's products (one frozen object per kind; nothing else asks which kind
an engine is): how its text and label read, its argument list (built from what
conformance/process/launch.py's Launcher provides: a pin's worker in its environment, the
mutant server, an executable), whether it serves the engine layers here, and whether it may
write a golden.

Standard library only: nothing here starts an engine (conformance/process/launch.py does).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

from conformance.formats.errors import InputError
from conformance.formats.pins import pin_label

MUTANT_MARK, CATALOG_MARK, RECORDED_MARK = "+mutant:", "catalog:", "+goldens"
NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.+:-]{0,63})=(\S.*)$")  # --candidate NAME=COMMAND


class Launcher(Protocol):
    """What starts an engine, by the part its kind names (conformance/process/launch.py)."""

    def worker(self, ref: "EngineRef", *options: str) -> tuple[str, ...]: ...

    def catalog_mutant(self, ref: "EngineRef") -> tuple[str, ...]: ...

    def command(self, ref: "EngineRef") -> tuple[str, ...]: ...

    def recorded(self, ref: "EngineRef") -> tuple[str, ...]: ...


@dataclass(frozen=True)
class EngineKind:
    name: str
    # what follows the release in the kind's text and label ("vllm-0.27.1+mutant:NAME"); None:
    # a command line, named by its program
    mark: str | None
    argv: Callable[["EngineRef", Launcher], tuple[str, ...]]
    # whether it serves the engine layers on this device (False: refused at once, never run)
    engine_layers_here: Callable[["EngineRef", object, str], bool]
    writes_goldens: bool  # a pinned release itself: the only kind that is an oracle or writes a golden
    resolved_early: bool  # resolving it builds nothing: done before any engine starts (bad input first)
    runs: bool = True  # a process runs it (False: its traces are read from its goldens)

    def __str__(self) -> str:
        return self.name


def _pinned_engine_layers(ref: "EngineRef", pins, device: str) -> bool:
    """On CPU a release without a CPU engine build refuses the engine layers (docs/release-gate.md)."""
    return device != "cpu" or pins.cpu_engine_build(ref.release) is not None


def _own_engine_layers(ref: "EngineRef", pins, device: str) -> bool:
    return True  # a command line says what it serves through its hello


PIN = EngineKind("pin", "", lambda ref, start: start.worker(ref), _pinned_engine_layers,
                 writes_goldens=True, resolved_early=False)
MUTANT = EngineKind("mutant", MUTANT_MARK, lambda ref, start: start.worker(ref, "--mutant", ref.mutant),
                    _pinned_engine_layers, writes_goldens=False, resolved_early=False)
CATALOG = EngineKind("catalog mutant", MUTANT_MARK + CATALOG_MARK, lambda ref, start: start.catalog_mutant(ref),
                     _pinned_engine_layers, writes_goldens=False, resolved_early=True)
COMMAND = EngineKind("command", None, lambda ref, start: start.command(ref), _own_engine_layers,
                     writes_goldens=False, resolved_early=True)
# A pin's goldens replayed: what the pin said when its goldens were written (each golden's
# provenance names the run), read instead of run. What it serves is what its goldens hold.
RECORDED = EngineKind("recorded pin", RECORDED_MARK, lambda ref, start: start.recorded(ref), _pinned_engine_layers,
                      writes_goldens=False, resolved_early=False, runs=False)
KINDS = (PIN, MUTANT, CATALOG, COMMAND, RECORDED)


@dataclass(frozen=True)
class EngineRef:
    kind: EngineKind
    text: str  # what starts it, as given (without NAME=): a pin, a pin+mutant, or a command line
    release: str | None = None  # the pin, for every kind but COMMAND
    mutant: str | None = None  # MUTANT: its NAME; CATALOG: its catalog id
    argv: tuple[str, ...] = ()  # COMMAND: its argument list
    name: str | None = None  # NAME of NAME=COMMAND
    role: str | None = None  # its role in a run (oracle, candidate, stand-in), when it has one

    @classmethod
    def parse(cls, text: str, releases, named: bool = False) -> "EngineRef":
        """`releases`: the configured pins (a Pins or its releases); `named`: NAME=COMMAND is
        allowed (a text that is a pin or a pin's mutant is never read as one). Bad input is a
        InputError naming the text."""
        releases = tuple(getattr(releases, "declared", getattr(releases, "releases", releases)))
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"engine {text!r}: empty engine command")
        ref = _pin_form(text, releases)
        if ref is not None:
            return ref
        match = NAMED.match(text) if named else None
        if match:
            return replace(cls.parse(match[2], releases), name=match[1])
        try:
            argv = tuple(shlex.split(text))  # split into an argv list; never handed to a shell
        except ValueError as exc:
            raise InputError(f"engine {text!r}: not a command line ({exc})") from None
        if not argv:
            raise InputError(f"engine {text!r}: empty engine command")
        return EngineRef(COMMAND, text, argv=argv)

    @classmethod
    def pin(cls, release: str) -> "EngineRef":
        return EngineRef(PIN, release, release)

    @classmethod
    def test_device(cls, release: str, mutant: str) -> "EngineRef":
        """A pin with a known bug injected (engines/vllm/mutants.py): never an oracle or a golden."""
        return EngineRef(MUTANT, f"{release}{MUTANT.mark}{mutant}", release, mutant)

    @classmethod
    def catalog_mutant(cls, release: str, mutant_id: str) -> "EngineRef":
        return EngineRef(CATALOG, f"{release}{CATALOG.mark}{mutant_id}", release, mutant_id)

    @classmethod
    def recorded(cls, release: str) -> "EngineRef":
        """A pin as its committed goldens recorded it (gate/recorded.py): never an oracle."""
        return EngineRef(RECORDED, f"{release}{RECORDED.mark}", release)

    def with_role(self, role: str) -> "EngineRef":
        return replace(self, role=role)

    @property
    def is_pin(self) -> bool:
        """A pinned release itself, the only kind that may be an oracle or write a golden."""
        return self.kind.writes_goldens

    @property
    def command(self) -> str | None:
        """A command line's argument list, quoted as a shell would read it back (None otherwise)."""
        return shlex.join(self.argv) if self.argv else None

    @property
    def label(self) -> str:
        """How a trace and the report name the engine: vllm-0.28.0, vllm-0.27.1+mutant:NAME,
        vllm-0.27.1+mutant:catalog:ID; a command line by its program alone, or whole."""
        if self.kind.mark is not None:
            return f"{pin_label(self.release)}{self.kind.mark}{self.mutant or ''}"
        return Path(self.argv[0]).name if len(self.argv) == 1 else " ".join(self.argv)

    @property
    def key(self) -> str:
        """What names it in a gate's plan, the same on every runner: its NAME, the label of a
        pin or mutant, or the command line."""
        return self.name or self.command or self.label

    def to_json(self) -> dict:
        """The engine as a run's manifest lists it (gate/results.py)."""
        return {"key": self.key, "role": self.role, "engine": self.text, "name": self.name,
                "command": self.command}

    @classmethod
    def from_json(cls, data: dict, releases) -> "EngineRef":
        """An engine of a manifest, read back; a ValueError when its fields do not agree with
        what its `engine` names."""
        text = data["engine"] if data["name"] is None else f"{data['name']}={data['engine']}"
        ref = cls.parse(text, releases, named=data["name"] is not None).with_role(data["role"])
        if ref.to_json() != data:
            raise InputError(f"engine {data['key']!r}: expected the fields of what {data['engine']!r} "
                             f"names ({ref.to_json()}), got {data}")
        return ref


def release_of(text: str, releases) -> str | None:
    """'vllm==0.28.0', 'vllm-0.28.0' or '0.28.0' -> '0.28.0' when it is a configured pin;
    'vllm@5559679229ab' or '5559679229ab' -> '5559679229ab' when that commit is one."""
    release = re.sub(r"^vllm(==|-|@)", "", text.strip())
    return release if release in tuple(getattr(releases, "declared", getattr(releases, "releases", releases))) else None


def _pin_form(text: str, releases: tuple[str, ...]) -> EngineRef | None:
    """A pin or a pin's mutant; None for anything else (a command line, a NAME=COMMAND)."""
    recorded = release_of(text.removesuffix(RECORDED_MARK), releases) if text.endswith(RECORDED_MARK) else None
    if recorded is not None:
        return EngineRef(RECORDED, text, recorded)
    pin, mark, mutant = text.partition(MUTANT_MARK)
    release = release_of(pin, releases)
    if release is None:
        return None
    if not mark:
        return EngineRef(PIN, text, release)
    if mutant.startswith(CATALOG_MARK):
        mutant_id = mutant[len(CATALOG_MARK):]
        if not mutant_id:
            raise InputError(f"engine {text!r}: no mutant id after {MUTANT_MARK}{CATALOG_MARK}")
        return EngineRef(CATALOG, text, release, mutant_id)
    if not mutant:
        raise InputError(f"engine {text!r}: no mutant name after {MUTANT_MARK}")
    return EngineRef(MUTANT, text, release, mutant)
