"""formats/log.py: the one logging path, a visible line on stderr; no `log` defaults to print."""

import ast

from conformance.formats.log import log
from conformance.formats.pins import REPO_ROOT


def _print_defaults() -> list[str]:
    found = []
    for path in sorted((REPO_ROOT / "conformance").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args.args + node.args.kwonlyargs
            defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults + node.args.kw_defaults
            for arg, default in zip(args, defaults):
                if arg.arg == "log" and isinstance(default, ast.Name) and default.id == "print":
                    found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}")
    return found


def test_no_log_parameter_defaults_to_stdout():
    """stdout holds verdicts and reports; a helper called without a log must not write there."""
    assert _print_defaults() == []


def test_a_log_line_goes_to_stderr_made_visible(capsys):
    log("engine said \x1b[2Jhello\r")
    out, err = capsys.readouterr()
    assert out == "" and err == "engine said \\x1b[2Jhello\\r\n"
