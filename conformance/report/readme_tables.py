"""The docs' generated tables: those that describe the scenarios, from scenarios/*.json, the
floors table of docs/architecture.md, from conformance/floors.py, and the feature vocabulary of
engines/PROTOCOL.md, from conformance/formats/features.py, so they cannot drift
from them: `parity docs` rewrites them, `parity docs --check` (and make test)
fails when a doc's table differs.

Each table sits between two markers in the file FILES names for it:
    <!-- generated: NAME (parity docs) -->
    ...
    <!-- end generated: NAME -->
"""

from __future__ import annotations

import re
from pathlib import Path

from conformance import floors
from conformance.formats.errors import InputError
from conformance.formats.features import CORE, FEATURES
from conformance.formats.pins import load_pins
from conformance.formats.protocol import ENGINE_LAYERS, LAYERS
from conformance.formats.scenario import Scenario
from conformance.judging.judging import scenario_features


def scenario_library(scenarios: list[Scenario]) -> str:
    oracle = load_pins().oracle
    lines = ["| scenario | layers | features | engine-matrix rows | what it exercises |", "|---|---|---|---|---|"]
    for s in sorted(scenarios, key=lambda s: s.name):
        features = ", ".join(f"`{f}`" for f in scenario_features(s, oracle)) or CORE
        lines.append(f"| `{s.name}` | {_layers(s.layers)} | {features} | {', '.join(s.rows)} | "
                     f"{_cell(s.description)} |")
    return "\n".join(lines)


def features_table(scenarios: list[Scenario]) -> str:
    """engines/PROTOCOL.md's feature vocabulary, from formats/features.py (the scenarios play no part)."""
    lines = ["| feature | a scenario needs it when |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(meaning)} |" for name, meaning in FEATURES.items()]
    return "\n".join(lines)


def layers_verdicts(scenarios: list[Scenario]) -> str:
    """Per set of layers, the scenarios that have exactly those: what an engine serving them
    gets a verdict on."""
    groups: dict[tuple, list[str]] = {}
    for s in scenarios:
        groups.setdefault(tuple(s.layers), []).append(s.name)
    lines = ["| scenario layers | scenarios | what serving them buys |", "|---|---|---|"]
    for layers in sorted(groups, key=lambda ls: (len(ls), [LAYERS.index(x) for x in ls])):
        names = sorted(groups[layers])
        lines.append(f"| {_layers(layers)} | {len(names)}: {', '.join(f'`{n}`' for n in names)} | "
                     f"{_buys(layers)} |")
    return "\n".join(lines)


def floors_table(scenarios: list[Scenario]) -> str:
    """docs/architecture.md's floors, from their one declaration (the scenarios play no part)."""
    return floors.markdown_table()


TABLES = {"scenario-library": scenario_library, "layers-verdicts": layers_verdicts, "floors": floors_table,
          "features": features_table}
# file (relative to the repository) -> the tables it holds
FILES = {"scenarios/README.md": ("scenario-library",), "docs/porting.md": ("layers-verdicts",),
         "docs/architecture.md": ("floors",), "engines/PROTOCOL.md": ("features",)}
BLOCK = re.compile(r"<!-- generated: (?P<name>[a-z-]+) \(parity docs\) -->\n(?P<body>.*?)"
                   r"<!-- end generated: (?P=name) -->", re.S)


def render(text: str, scenarios: list[Scenario], names=tuple(TABLES), where: str = "the file") -> str:
    """The text with every generated block replaced by what the scenario files say; the blocks
    `names` must be there."""
    found = {m["name"] for m in BLOCK.finditer(text)}
    missing = sorted(set(names) - found)
    if missing:
        raise InputError(f"{where} has no generated block {missing}: add its two markers "
                         f"(<!-- generated: NAME (parity docs) --> ... <!-- end generated: NAME -->)")
    return BLOCK.sub(lambda m: _block(m["name"], scenarios), text)


def stale(path: Path, scenarios: list[Scenario], names=tuple(TABLES)) -> list[str]:
    """Names of the blocks whose text differs from what the generator produces."""
    text = path.read_text(encoding="utf-8")
    render(text, scenarios, names, where=str(path))  # every block is there
    return [m["name"] for m in BLOCK.finditer(text) if m[0] != _block(m["name"], scenarios)]


def _block(name: str, scenarios: list[Scenario]) -> str:
    if name not in TABLES:
        raise InputError(f"a doc names an unknown generated block {name!r}; known: {sorted(TABLES)}")
    return f"<!-- generated: {name} (parity docs) -->\n{TABLES[name](scenarios)}\n<!-- end generated: {name} -->"


def _layers(layers) -> str:
    names = list(layers)
    if all(x in names for x in ENGINE_LAYERS):  # the three engine layers come and go together
        at = names.index(ENGINE_LAYERS[0])
        names = [x for x in names if x not in ENGINE_LAYERS]
        names.insert(at, "engine_*")
    return ", ".join(f"`{x}`" for x in names)


def _buys(layers) -> str:
    if "methods" in layers:
        return "the drafting-slot table and refusal probes per method and K"
    if ENGINE_LAYERS[0] in layers:
        return "your real model runner, drafter and sampler on the tiny models"
    if "steps" in layers:
        return "your scheduler, step by step, driven by the stand-in"
    return "your configuration code: the resolved budget, its log lines, refusals"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
