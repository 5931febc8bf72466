"""README.md's scenario tables are generated from scenarios/*.json (conformance/readme_tables.py,
`parity docs`): they must be what the generator produces today."""

import pytest

from conformance import cli
from conformance.readme_tables import render, stale
from conformance.scenario import load_scenario
from conftest import REPO

SCENARIOS = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))]


def test_the_readme_tables_are_what_the_scenario_files_say():
    assert stale(REPO / "README.md", SCENARIOS) == [], "run `.venv/bin/parity docs` and commit README.md"
    assert cli.main(["docs", "--check"]) == 0


def test_a_table_that_drifted_is_named(tmp_path):
    text = (REPO / "README.md").read_text()
    readme = tmp_path / "README.md"
    readme.write_text(text.replace("| `steady_decode` | `config`, `steps`, `outputs` |",
                                   "| `steady_decode` | `config` |"))
    assert stale(readme, SCENARIOS) == ["scenario-library"]
    # a scenario file the README does not know yet: both tables differ
    assert stale(REPO / "README.md", SCENARIOS[1:]) == ["scenario-library", "layers-verdicts"]
    assert render(readme.read_text(), SCENARIOS) == text


def test_every_table_has_its_markers():
    with pytest.raises(ValueError, match="no generated block"):
        render("no markers here", SCENARIOS)
