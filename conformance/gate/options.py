"""The options the commands share, each checked before anything runs: the bounds of the numbers
a command takes (argparse types), the gate's plan options, and what --scenario, --layers and
--waivers select. On the gate's floor because the plan (gate/plan.py `plan_inputs`) reads them
as `parity gate` and `parity envs` give them; every command module (floor 7) imports them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.pins import REPO_ROOT
from conformance.formats.scenario import Scenario, at_scale, load_scenario
from conformance.judging.waivers import WaiverError, load_waivers

SCENARIO_DIR = REPO_ROOT / "scenarios"
DEFAULT_WAIVERS = REPO_ROOT / "waivers.toml"  # the one --waivers file that may be absent

# Bounds of the numbers a command takes (argparse types below): each outside them is refused
# before anything runs, with what was expected and what arrived.
MAX_JOBS = 64  # engines side by side: each is a process of about a GiB
MAX_EXAMPLES = 10_000_000
MAX_FINDINGS = 100
MAX_BUDGET = 7 * 24 * 3600.0  # a week, in seconds
UNITS = {"s": 1, "m": 60, "h": 3600}


def whole_number(low: int, high: int, what: str):
    """An argparse type: a whole number from `low` to `high` (`what` it counts, for the error)."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high} ({what}), got {text!r}")
        return value
    return parse


def budget_seconds(text: str) -> float:
    """An argparse type: a time budget like 90s, 10m, 1h or 45 (seconds), in seconds, more
    than none and at most MAX_BUDGET."""
    match = re.fullmatch(r"\s*(\d{1,9}(?:\.\d{1,6})?)\s*([smh]?)\s*", text)
    seconds = float(match[1]) * UNITS[match[2] or "s"] if match else 0.0
    if not 0 < seconds <= MAX_BUDGET:
        raise argparse.ArgumentTypeError(f"expected a duration more than 0 and at most {MAX_BUDGET / 3600:.0f}h, "
                                         f"like 90s, 10m or 1h, got {text!r}")
    return seconds


def plan_options(p: argparse.ArgumentParser) -> None:
    """The options the gate's plan is made of (plan_inputs), given alike to `parity gate` and to
    `parity envs`, so a CI shard's envs step selects the pins its gate step runs."""
    p.add_argument("--candidate", action="append", default=[],
                   help="a candidate engine (pin or command line); repeatable. Default: the other "
                        "pins, as informational stand-ins")
    p.add_argument("--stand-ins", choices=("goldens", "live"),
                   help="with no --candidate, the other pins stand in as informational candidates: read from "
                        "their committed goldens (no environment or process for them; the default with --scale "
                        "library), or run live (the default with --scale production or all)")
    p.add_argument("--scenario", action="append", type=Path, help="default: every scenarios/*.json of --scale")
    p.add_argument("--scale", choices=("library", "production", "all"), default="library",
                   help="which scenarios/*.json run by default: the library (default), the production-scale "
                        "scenarios (minutes of oracle time each, judged in the digest form), or all")
    p.add_argument("--layers", help="comma-separated layers to judge (default: every layer the scenario "
                   "has); a candidate is judged on those its hello declares, the reports say which were not")


def read_scenarios(paths: list[Path] | None, scale: str = "all") -> list[Scenario]:
    """The scenarios given, else every scenarios/*.json of `scale` (each file is read and
    checked whatever its scale)."""
    scenarios = [load_scenario(p) for p in paths or sorted(SCENARIO_DIR.glob("*.json"))]  # before any engine starts
    if not paths:
        scenarios = at_scale(scenarios, scale)
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise InputError(f"two scenario files share a name: {sorted(names)}")
    return scenarios


def read_waivers(path: Path | None) -> list:
    """--waivers: the default file may be absent (no waivers); a path given that does not
    exist is an error, so a typo never silently waives nothing."""
    path = path or DEFAULT_WAIVERS
    if path == DEFAULT_WAIVERS and not path.exists():
        return []
    if not path.exists():
        raise WaiverError(f"--waivers {path}: no such file")
    return load_waivers(path)


def parse_layers(text: str | None, option: str = "--layers") -> list[str] | None:
    from conformance.formats.protocol import LAYERS

    if text is None:
        return None
    layers = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in layers if x not in LAYERS]
    if unknown or not layers:
        raise InputError(f"{option}: unknown layer(s) {unknown}; known: {list(LAYERS)}")
    return layers
