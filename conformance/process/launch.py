"""What starts an engine: an EngineRef resolved into an EngineSpec, the argument list
(never a shell string) and the label. Each kind of engine names its argument list
(formats/engine_ref.py EngineKind.argv) from the parts a Launcher provides: a pin's worker in
the pin's environment (built here when missing), a catalog mutant through the mutant server
(given a way to find the mutant), a command line checked to name an executable.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.errors import InputError
from conformance.formats.log import log
from conformance.formats.pins import Pins, load_pins
from conformance.process import envs
from conformance.process.mutant_server import MutantServer


@dataclass(frozen=True)
class EngineSpec:
    label: str
    argv: tuple[str, ...]
    release: str | None = None  # set when this is a pinned vLLM release


class Launcher:
    """Resolves engines into EngineSpecs. `find_mutant(release, mutant_id)` -> the catalog's
    Mutant (formats/mutant.py), where catalog mutants may be served (`parity fuzz`, `parity
    adequacy`); one mutant server per release is started for them (and for `forked_mutant`)
    and ended by `close`."""

    def __init__(self, pins: Pins | None = None, log=log, find_mutant=None):
        self.pins, self.log, self.find_mutant = pins or load_pins(), log, find_mutant
        self._servers: dict[str, MutantServer] = {}

    def __enter__(self) -> "Launcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def spec(self, ref: EngineRef) -> EngineSpec:
        """What starts the engine `ref` names (a pin's environment is built when missing:
        minutes, once). Bad input is an InputError naming the engine."""
        return EngineSpec(ref.label, ref.kind.argv(ref, self), ref.release if ref.is_pin else None)

    def worker(self, ref: EngineRef, *options: str) -> tuple[str, ...]:
        return envs.worker_argv(envs.ensure_env(ref.release, log=self.log, pins=self.pins), ref.release, *options,
                                pins=self.pins)

    def catalog_mutant(self, ref: EngineRef) -> tuple[str, ...]:
        """TEST DEVICE: a generated mutant, forked by its release's mutant server."""
        if self.find_mutant is None:
            raise InputError(f"engine {ref.text!r}: a catalog mutant is served by `parity adequacy`'s "
                             "mutant server (parity fuzz --candidate), not started on its own")
        return self._server(ref.release).argv(self.find_mutant(ref.release, ref.mutant))

    def forked_mutant(self, ref: EngineRef) -> tuple[str, ...]:
        """TEST DEVICE: a built-in mutant (0.27.1+mutant:NAME) forked by its release's mutant
        server, without an import of vLLM of its own (the test suite's warm sessions, on a CPU)."""
        return self._server(ref.release).builtin_argv(ref.mutant)

    def _server(self, release: str) -> MutantServer:
        if release not in self._servers:
            self._servers[release] = MutantServer(release, self.log)
        return self._servers[release]

    def command(self, ref: EngineRef) -> tuple[str, ...]:
        if shutil.which(ref.argv[0]) is None and not Path(ref.argv[0]).is_file():
            raise InputError(f"engine {ref.text!r}: {ref.argv[0]!r} is neither a configured pin "
                             f"({', '.join(self.pins.releases)}) nor an executable")
        return ref.argv

    def recorded(self, ref: EngineRef) -> tuple[str, ...]:
        raise InputError(f"engine {ref.text!r}: a pin's goldens are read by `parity gate` (its stand-ins), "
                         f"not started as an engine; give {ref.release} to run the pin itself")

    def close(self) -> None:
        """End every mutant server started (and the mutants it forked)."""
        while self._servers:
            self._servers.popitem()[1].close()


def prepare_engine(ref: EngineRef, pins: Pins | None = None, log=log) -> EngineSpec:
    """What starts the engine `ref` names, where no catalog mutant is served."""
    return Launcher(pins, log).spec(ref)
