"""The docs' scenario tables are generated from scenarios/*.json (conformance/report/readme_tables.py,
`parity docs`): scenarios/README.md's scenario library and docs/porting.md's layers table must be
what the generator produces today."""

import pytest

from conformance import cli
from conformance.formats.scenario import load_scenario
from conformance.report.readme_tables import FILES, render, stale
from tests.helpers import REPO

SCENARIOS = [load_scenario(p) for p in sorted((REPO / "scenarios").glob("*.json"))]
LIBRARY = REPO / "scenarios" / "README.md"
PORTING = REPO / "docs" / "porting.md"


def test_the_doc_tables_are_what_the_scenario_files_say():
    for relative, names in FILES.items():
        assert stale(REPO / relative, SCENARIOS, names) == [], f"run `.venv/bin/parity docs` and commit {relative}"
    assert cli.main(["docs", "--check"]) == 0


def test_a_table_that_drifted_is_named(tmp_path):
    text = LIBRARY.read_text()
    library = tmp_path / "README.md"
    library.write_text(text.replace("| `steady_decode` | `config`, `steps`, `outputs` |",
                                    "| `steady_decode` | `config` |"))
    assert stale(library, SCENARIOS, ["scenario-library"]) == ["scenario-library"]
    # a scenario file the docs do not know yet: both tables differ
    assert stale(LIBRARY, SCENARIOS[1:], ["scenario-library"]) == ["scenario-library"]
    assert stale(PORTING, SCENARIOS[1:], ["layers-verdicts"]) == ["layers-verdicts"]
    assert render(library.read_text(), SCENARIOS, ["scenario-library"]) == text


def test_every_table_has_its_markers():
    with pytest.raises(ValueError, match="no generated block"):
        render("no markers here", SCENARIOS)
    with pytest.raises(ValueError, match=r"docs/porting.md has no generated block \['layers-verdicts'\]"):
        render("no markers here", SCENARIOS, ["layers-verdicts"], where="docs/porting.md")
