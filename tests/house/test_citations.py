"""What the harness's comments and docstrings cite exists: a module path (with the name cited
in it), and a constant's NAME. A module moved or a constant renamed leaves no citation behind
that sends a reader looking for something that is gone."""

from __future__ import annotations

import ast
import errno
import io
import os
import re
import signal
import socket
import tokenize
from functools import cache
from pathlib import Path

from tests.helpers import REPO

SOURCES = ("conformance", "engines", "parity", "benchmarks")
# NAME_WITH_UNDERSCORES: a constant of the code, the standard library's, or a Make variable
CONSTANT = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
# conformance/report/render_text.py, conformance/report.render_verdict, engines/PROTOCOL.md
PATH = re.compile(r"(?<![\w/.-])((?:conformance|engines|parity|benchmarks|docs|scenarios|tests)(?:/[\w-]+)+"
                  r"(?:\.(?:py|md|hpp|cpp|json|toml|sh|txt))?)(?:\.([A-Za-z_]\w*))?([*<]?)")
# Words standing for a value, not names of the code: the keeper's arguments in its usage line
# (process/keeper.py), a run's id in the line coverage_worker.py writes
PLACEHOLDERS = {"CONTROL_FD", "REPORT_FD", "RUN_ID"}
STANDARD = (os, socket, signal, errno)


def _files() -> list[Path]:
    return sorted(p for top in SOURCES for p in (REPO / top).rglob("*.py") if ".venv" not in p.parts)


def _prose(path: Path):
    """(line, text) of every comment and docstring of a file."""
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


@cache
def _names(path: Path) -> frozenset[str]:
    """Every name a module binds or uses, and the strings it holds."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return frozenset(out)


def _everywhere() -> set[str]:
    names = set().union(*(_names(p) for p in _files()))
    names |= set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", (REPO / "Makefile").read_text(encoding="utf-8")))
    return names


def test_every_constant_cited_exists():
    names = _everywhere()
    gone = [f"{p.relative_to(REPO)}:{line}: {name}" for p in _files() for line, text in _prose(p)
            for name in CONSTANT.findall(text)
            if name not in names and name not in PLACEHOLDERS and not any(hasattr(m, name) for m in STANDARD)]
    assert not gone, "cited, defined nowhere:\n" + "\n".join(gone)


def test_every_module_cited_exists_with_the_name_cited_in_it():
    gone = []
    for p in _files():
        for line, text in _prose(p):
            for match in PATH.finditer(text):
                path, name, glob = match.groups()
                where = f"{p.relative_to(REPO)}:{line}: {match.group(0)}"
                module = _module(path)
                placeholder = any(part.split(".")[0].isupper() for part in path.split("/"))
                if module is None and (glob or placeholder):
                    continue  # a pattern (tiny-*, tiny-<name>) or a placeholder (scenarios/NAME.json)
                if module is None and _vllms_tests(path):
                    continue  # vLLM's own test suite (tests/models/utils.py), not this one
                if module is None:
                    gone.append(f"{where} (no such file)")
                elif name and module.suffix == ".py" and name not in _names(module):
                    gone.append(f"{where} ({name} is not in {module.relative_to(REPO)})")
    assert not gone, "cited, not there:\n" + "\n".join(gone)


def _vllms_tests(path: str) -> bool:
    """A path into vLLM's tests/: a folder this suite's tests/ does not have."""
    top, _, rest = path.partition("/")[2].partition("/")
    return path.startswith("tests/") and bool(rest) and not (REPO / "tests" / top).is_dir()


def _module(path: str) -> Path | None:
    """The file a citation names: itself, its .py, or a package's __init__.py."""
    for candidate in (REPO / path, REPO / f"{path}.py"):
        if candidate.is_dir():
            return candidate / "__init__.py"
        if candidate.is_file():
            return candidate
    return None
