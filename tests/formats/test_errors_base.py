"""Every refusal the harness names derives from one base, ParityError, which carries its exit
status: `parity` maps that base alone, so a named error can never fall through to exit 3 (a
malformed upstream-changes.toml once did: NotesError was in neither list)."""

import ast
import inspect

from conformance import cli
from conformance.formats.errors import InputError, ParityError
from conformance.formats.gpu import GpuError
from conformance.judging.goldens import GoldenRefused
from conformance.process.client import EngineFailure
from conformance.process.coverage_run import CoverageError
from conformance.process.envs import EnvError
from conformance.process.fidelity import FidelityError
from conformance.process.mutant_server import MutantServerError
from conformance.report.bump_text import NotesError
from tests.helpers import REPO


def test_every_named_refusal_is_a_parity_error_with_exit_2():
    for kind in (InputError, EnvError, GoldenRefused, EngineFailure, FidelityError, CoverageError,
                 MutantServerError, GpuError, NotesError):
        assert issubclass(kind, ParityError) and kind.status == 2, kind


def test_the_command_line_maps_the_base_alone():
    handlers = [node for node in ast.walk(ast.parse(inspect.getsource(cli.main)))
                if isinstance(node, ast.ExceptHandler) and node.type is not None]
    caught = [ast.unparse(h.type) for h in handlers]
    assert "ParityError" in caught and not any("," in c or c.startswith("(") for c in caught), caught


def test_a_malformed_upstream_changes_file_is_a_named_refusal(tmp_path):
    from conformance.report.bump_text import load_notes

    bad = tmp_path / "upstream-changes.toml"
    bad.write_text("[[change]\nnot toml", encoding="utf-8")
    try:
        load_notes(bad)
    except ParityError as exc:
        assert exc.status == 2 and "upstream-changes.toml" in str(exc)
    else:
        raise AssertionError("a malformed upstream-changes.toml was read")
    assert load_notes(REPO / "upstream-changes.toml")  # the committed one reads
