"""formats/errors.py: bad input is a typed InputError, so `parity` tells it (exit 2, its words)
from a bug of the harness (exit 3, its traceback)."""

import ast
import pytest

from conformance import cli
from conformance.formats.pins import REPO_ROOT
from tests.helpers import GATE

# Bare ValueErrors that are not bad input reaching the CLI: JSON hooks whose callers turn them
# into a TraceError / ScenarioError / ProtocolError, and invariants of the harness itself.
INTERNAL = {
    ("conformance/formats/protocol.py", "finite_float"), ("conformance/formats/protocol.py", "_int64"),
    ("conformance/formats/protocol.py", "_no_constants"), ("conformance/formats/scenario.py", "_reject_constant"),
    ("conformance/formats/serve.py", "__init__"), ("conformance/formats/mutant.py", "apply"),
    ("conformance/judging/comparators.py", "register"), ("conformance/judging/comparators.py", "add"),
    ("conformance/formats/scenario.py", "at_scale"),  # its scale comes from argparse choices
    ("conformance/adequacy/measure.py", "catalog"),  # its name comes from argparse choices (CATALOGS)
}


def _bare_value_errors() -> set[tuple[str, str]]:
    found = set()
    for path in sorted((REPO_ROOT / "conformance").rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel.startswith("conformance/engines/"):
            continue  # the worker's side: it answers with protocol errors, not the CLI's exit
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                        and getattr(node.exc.func, "id", None) == "ValueError"):
                    found.add((rel, func.name))
    return found


def test_bad_input_is_raised_as_a_typed_input_error():
    """A new `raise ValueError` for bad input would be exit 3 "a bug of the harness": raise an
    InputError (or a subclass) instead; list it in INTERNAL only if it never reaches a user."""
    assert _bare_value_errors() - INTERNAL == set()


def test_an_unknown_required_feature_is_bad_input(capsys):
    assert cli.main(["gate", "--scenario", str(GATE), "--require-features", "spec:dflsh"]) == 2
    err = capsys.readouterr().err
    assert "unknown ['spec:dflsh']" in err and "Traceback" not in err


@pytest.mark.parametrize("release, words", [
    ("../../x", "'../../x' is neither a release (like 0.28.0) nor a commit declared"),
    ("latest", "'latest' is neither a release"),
    ("0.28.0; rm -rf .", "'0.28.0; rm -rf .' is neither a release"),
    # shaped like a release, but no version PyPI names (InvalidVersion, or a local version)
    ("0.28.0..x", "parity bump '0.28.0..x': not a vLLM release version"),
    ("0.28.0+goldens", "parity bump '0.28.0+goldens': not a vLLM release version"),
])
def test_a_bump_to_a_string_that_is_not_a_release_is_bad_input(capsys, release, words):
    assert cli.main(["bump", release]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


def test_make_bump_hands_pin_to_parity_as_one_word(tmp_path):
    """PIN is quoted in the shell line: a ' in it cannot end the word and run what follows."""
    import subprocess

    planted = tmp_path / "planted"
    pin = f"x'; touch {planted}; echo '"  # unquoted, parity would get x, then touch run
    done = subprocess.run(["make", "--no-print-directory", "-C", str(REPO_ROOT), "bump", f"PIN={pin}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert not planted.exists()
    assert f"{pin!r} is neither a release" in done.stderr, done.stderr
