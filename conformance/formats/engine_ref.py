"""What names an engine, parsed once: every form an engine is given in (a command's --engine
or --candidate, a test, a shard's manifest) becomes one EngineRef, which knows its kind, its
release and mutant, its NAME, its argument list and how the report names it.

  0.28.0, vllm==0.28.0, vllm-0.28.0   a pin (a pinned vLLM release)
  0.27.1+mutant:NAME                  a pin's TEST DEVICE mutant (engines/vllm/mutants.py)
  0.27.1+mutant:catalog:ID            a TEST DEVICE mutant of `parity adequacy`'s catalog
  NAME=COMMAND                        a named candidate (only where names are allowed: --candidate)
  anything else                       a command line, split like a shell would, never run by one

Standard library only: nothing here starts an engine (conformance/process/launch.py prepare_engine does).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.errors import InputError

PIN, MUTANT, CATALOG, COMMAND = "pin", "mutant", "catalog mutant", "command"
KINDS = (PIN, MUTANT, CATALOG, COMMAND)
MUTANT_MARK, CATALOG_MARK = "+mutant:", "catalog:"
NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.+:-]{0,63})=(\S.*)$")  # --candidate NAME=COMMAND


@dataclass(frozen=True)
class EngineRef:
    kind: str  # PIN, MUTANT, CATALOG or COMMAND
    text: str  # what starts it, as given (without NAME=): a pin, a pin+mutant, or a command line
    release: str | None = None  # the pin, for every kind but COMMAND
    mutant: str | None = None  # MUTANT: its NAME; CATALOG: its catalog id
    argv: tuple[str, ...] = ()  # COMMAND: its argument list
    name: str | None = None  # NAME of NAME=COMMAND

    @classmethod
    def parse(cls, text: str, releases, named: bool = False) -> "EngineRef":
        """`releases`: the configured pins (a Pins or its releases); `named`: NAME=COMMAND is
        allowed (a text that is a pin or a pin's mutant is never read as one). Bad input is a
        InputError naming the text."""
        releases = tuple(getattr(releases, "releases", releases))
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"engine {text!r}: empty engine command")
        ref = _pin_form(text, releases)
        if ref is not None:
            return ref
        match = NAMED.match(text) if named else None
        if match:
            inner = cls.parse(match[2], releases)
            return EngineRef(inner.kind, inner.text, inner.release, inner.mutant, inner.argv, match[1])
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
        return EngineRef(MUTANT, f"{release}{MUTANT_MARK}{mutant}", release, mutant)

    @classmethod
    def catalog_mutant(cls, release: str, mutant_id: str) -> "EngineRef":
        return EngineRef(CATALOG, f"{release}{MUTANT_MARK}{CATALOG_MARK}{mutant_id}", release, mutant_id)

    @property
    def is_pin(self) -> bool:
        """A pinned release itself, the only kind that may be an oracle or write a golden."""
        return self.kind == PIN

    @property
    def command(self) -> str | None:
        """A command line's argument list, quoted as a shell would read it back (None otherwise)."""
        return shlex.join(self.argv) if self.kind == COMMAND else None

    @property
    def label(self) -> str:
        """How a trace and the report name the engine: vllm-0.28.0, vllm-0.27.1+mutant:NAME,
        vllm-0.27.1+mutant:catalog:ID; a command line by its program alone, or whole."""
        if self.kind == PIN:
            return f"vllm-{self.release}"
        if self.kind == MUTANT:
            return f"vllm-{self.release}{MUTANT_MARK}{self.mutant}"
        if self.kind == CATALOG:
            return f"vllm-{self.release}{MUTANT_MARK}{CATALOG_MARK}{self.mutant}"
        return Path(self.argv[0]).name if len(self.argv) == 1 else " ".join(self.argv)

    @property
    def key(self) -> str:
        """What names it in a gate's plan, the same on every runner: its NAME, the label of a
        pin or mutant, or the command line."""
        return self.name or self.command or self.label


def release_of(text: str, releases) -> str | None:
    """'vllm==0.28.0', 'vllm-0.28.0' or '0.28.0' -> '0.28.0' when it is a configured pin."""
    release = re.sub(r"^vllm(==|-)", "", text.strip())
    return release if release in tuple(getattr(releases, "releases", releases)) else None


def _pin_form(text: str, releases: tuple[str, ...]) -> EngineRef | None:
    """A pin or a pin's mutant; None for anything else (a command line, a NAME=COMMAND)."""
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
