"""What starts an engine: an EngineRef resolved into an EngineSpec, the argument list
(never a shell string) and the label. A pin, or a pin's TEST DEVICE mutant, is served by
engines/vllm/worker.py in the pin's environment, built here when missing; a command line is
checked to name an executable.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.engine_ref import COMMAND, MUTANT, PIN, EngineRef
from conformance.formats.errors import InputError
from conformance.formats.log import log
from conformance.formats.pins import Pins, load_pins


@dataclass(frozen=True)
class EngineSpec:
    label: str
    argv: tuple[str, ...]
    release: str | None = None  # set when this is a pinned vLLM release


def prepare_engine(ref: EngineRef, pins: Pins | None = None, log=log) -> EngineSpec:
    """What starts the engine `ref` names. A pin (or a pin's TEST DEVICE mutant) is served by
    its worker in the pin's environment, which is built here when missing (minutes, once); a
    command line is checked to name an executable."""
    from conformance.process.envs import ensure_env, worker_argv

    pins = pins or load_pins()
    if ref.kind == MUTANT:
        # A TEST DEVICE: the pin with a known bug injected. Never an oracle, never a golden.
        python = ensure_env(ref.release, log=log, pins=pins)
        return EngineSpec(ref.label, worker_argv(python, ref.release, "--mutant", ref.mutant))
    if ref.kind == PIN:
        python = ensure_env(ref.release, log=log, pins=pins)
        return EngineSpec(ref.label, worker_argv(python, ref.release), ref.release)
    if ref.kind != COMMAND:
        raise InputError(f"engine {ref.text!r}: a catalog mutant is served by `parity adequacy`'s "
                         "mutant server (parity fuzz --candidate), not started on its own")
    if shutil.which(ref.argv[0]) is None and not Path(ref.argv[0]).is_file():
        raise InputError(f"engine {ref.text!r}: {ref.argv[0]!r} is neither a configured pin "
                         f"({', '.join(pins.releases)}) nor an executable")
    return EngineSpec(ref.label, ref.argv)
