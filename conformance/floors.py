"""The floors of the house: which way imports go. A module imports only modules on its own
floor or below, and never in a circle; tests/house/test_house.py checks every module of
conformance/, engines/ and parity/, and `parity docs` renders FLOORS into docs/architecture.md
("Floors"), where the same test finds it unchanged.

A floor is declared by package: `conformance.judging.*` is the package and every module in it;
a name without `.*` is that module alone. The longest declared name that matches a module
decides its floor, so a command inside a stage's package (fuzz/command.py) sits on the commands
floor. A module that no name matches has no floor, and fails the test.

Standard library only, and it imports nothing of the harness: it is data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Floor:
    number: int
    name: str
    packages: tuple[str, ...]
    why: str


FLOORS = (
    Floor(0, "formats", ("conformance", "conformance.floors", "conformance.formats.*"),
          "what the parts say to each other: standard library only (checked), so a pin's worker "
          "imports them in vLLM's environment; the package's version and this declaration"),
    Floor(1, "the vLLM side", ("engines.*",),
          "runs in a pin's environment (the C++ kit's vector generator beside it); imports only the formats"),
    Floor(2, "processes and environments", ("conformance.process.*",),
          "starts, drives and ends engine processes; builds and checks the pins' environments"),
    Floor(3, "judging", ("conformance.judging.*",),
          "turns a trace and a golden into a verdict; owns the goldens; files verdicts under "
          "requirement rows, waivers applied"),
    Floor(4, "reports", ("conformance.report.*",),
          "the gate's view of its verdicts, computed once, and every report rendered from it; what "
          "the goldens say across pins; the docs' generated tables"),
    Floor(5, "the gate", ("conformance.gate.*",),
          "a gate run put together: engines, plan, units run side by side, results folders, "
          "then judged and reported"),
    Floor(6, "searches and suites", ("conformance.fuzz.*", "conformance.adequacy.*", "conformance.regenerate.*",
                                     "conformance.bump.*", "conformance.bisect.*", "parity.*"),
          "runs of their own on the floors below: the fuzzer, the adequacy measures, the golden front door, "
          "an oracle bump's checks and edits, the port queue's search, and the goldens suite"),
    Floor(7, "commands", ("conformance.cli", "conformance.commands.*", "conformance.fuzz.command",
                          "conformance.adequacy.command", "conformance.regenerate.command",
                          "conformance.bump.command", "conformance.bisect.command"),
          "command lines: each command's module declares its arguments and calls a run; `parity` "
          "assembles them, parses, exits"),
)


def floor_of(module: str) -> Floor | None:
    """The floor of a module (its dotted name): the longest declared name matching it."""
    found, length = None, -1
    for floor in FLOORS:
        for name in floor.packages:
            package = name.removesuffix(".*")
            matches = module == package or (name.endswith(".*") and module.startswith(package + "."))
            if matches and len(package) > length:
                found, length = floor, len(package)
    return found


def markdown_table() -> str:
    """The floors as docs/architecture.md shows them."""
    lines = ["| floor | name | packages and modules | why |", "|---|---|---|---|"]
    for f in FLOORS:
        lines.append(f"| {f.number} | {f.name} | {', '.join(f'`{p}`' for p in f.packages)} | {f.why} |")
    return "\n".join(lines)
