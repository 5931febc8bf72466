"""Mutation operators over the AST of the scheduling code a port mirrors.

A mutant is one small source edit: a span of the file's UTF-8 bytes and the text put there.
The edit is made on the text, not by re-printing the AST, so the mutant's diff is the change
alone and the same on every Python version. Only code that conformance/adequacy/scope.py counts is
mutated (measured functions, minus out-of-scope functions and lines): a mutant elsewhere
would only say that unmeasured code is unmeasured.

Operators (the name each mutant carries):
    ror          relational operator flipped: < <=, > >=, == !=, is / is not, in / not in
    cmp-off      off by one on a comparison's right-hand side: X -> (X) + 1, (X) - 1
    arith-off    off by one on arithmetic: a + b -> (a + b) + 1, (a + b) - 1
    aor          arithmetic operator swapped: + -, - +, // *, * //
    minmax       min and max swapped
    pop          pop() -> pop(0), pop(0) -> pop(), popleft() -> pop()
    const        an integer constant n -> n + 1; True and False swapped
    negate       an if / while / conditional-expression condition negated
    remove       an assignment, augmented assignment or call statement replaced by pass

Not mutated (each would be a mutant no run can tell apart, or one that is never installed):
    assert statements (checks, not decisions: a weaker assert behaves the same), default
    values and annotations of parameters (not part of the function's code object), and an
    assignment whose target (a local name or a `self.` attribute) is read only by
    out-of-scope code of the same file, e.g. state kept for KV connectors.

Standard library only: the harness generates the catalog, the worker installs one mutant.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import re

from conformance.adequacy.scope import Edit, Scope, ScopeError, out_of_scope_lines
from conformance.formats.mutant import Mutant

OPERATORS = ("ror", "cmp-off", "arith-off", "aor", "minmax", "pop", "const", "negate", "remove")
ROR = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "==",
       ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
OP_TEXT = {ast.Lt: r"<", ast.LtE: r"<=", ast.Gt: r">", ast.GtE: r">=", ast.Eq: r"==",
           ast.NotEq: r"!=", ast.Is: r"is", ast.IsNot: r"is\s+not", ast.In: r"in", ast.NotIn: r"not\s+in"}
AOR = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.FloorDiv: ("//", "*"), ast.Mult: ("*", "//")}


def generate(source: str, relpath: str, scope: Scope) -> list[Mutant]:
    """Every mutant of one file's counted code, in file order."""
    tree = ast.parse(source)
    data = source.encode()
    starts = [0]
    for line in source.encode().splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    out_lines = out_of_scope_lines(source, scope)
    whole_out = [r.function for r in scope.rules if r.function]
    found: dict[str, Mutant] = {}

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col

    def span(node) -> tuple[int, int]:
        return offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)

    def text(a: int, b: int) -> str:
        return data[a:b].decode()

    def add(function: str, operator: str, line: int, a: int, b: int, replacement: str) -> None:
        original = text(a, b)
        if replacement == original:
            return
        digest = hashlib.sha256(f"{relpath}\0{a}\0{b}\0{replacement}".encode()).hexdigest()[:10]
        found.setdefault(f"m{digest}", Mutant(f"m{digest}", relpath, function, operator, line, a, b,
                                              original, replacement))

    def visit_function(fn, qualname: str) -> None:
        if not scope.measured(relpath, qualname) or any(fnmatch.fnmatchcase(qualname, g) for g in whole_out):
            return
        skip = _skipped(fn, reads)
        for node in ast.walk(fn):
            if node is fn or id(node) in skip or not hasattr(node, "lineno") or node.lineno in out_lines:
                continue
            for operator, line, a, b, replacement in _edits(node, span, text):
                add(qualname, operator, line, a, b, replacement)

    reads = _self_reads(tree, len(starts), out_lines)

    def walk(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit_function(node, f"{prefix}{node.name}")

    walk(tree.body, "")
    return sorted(found.values(), key=lambda m: (m.start, m.end, m.replacement))


def _self_reads(tree: ast.Module, lines: int, out_lines) -> dict:
    """Where each self.attribute is read in scope (locals are looked up in their function), and
    the lines in scope ("__in_scope_lines__"): what _dead_store reads."""
    reads: dict = {"__in_scope_lines__": set(range(1, lines)) - set(out_lines)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and \
                isinstance(node.value, ast.Name) and node.value.id == "self" and node.lineno not in out_lines:
            reads.setdefault(("self", node.attr), set()).add(node.lineno)
    return reads


def _skipped(fn, reads: dict) -> set[int]:
    """The ids of a function's nodes never mutated: its signature and decorators, asserts, dead
    stores, and what is inside logging calls and f-strings (never a scheduling decision)."""
    skip = set()
    for part in [fn.args, *fn.decorator_list] + ([fn.returns] if fn.returns else []):
        skip.update(id(n) for n in ast.walk(part))
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert) or (isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                                             and _dead_store(node, fn, reads)):
            skip.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.Call) and _is_logging(node):
            skip.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def run_lines(source: str, executed: set[int]) -> set[int]:
    """Every line of the statements coverage.py saw run (it names a statement by its first
    line): a simple statement's every line, a compound statement's header."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt) or node.lineno not in executed or \
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.If, ast.While)):
            end = node.test.end_lineno
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            end = node.iter.end_lineno
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            end = node.items[-1].context_expr.end_lineno
        elif isinstance(node, (ast.Try, ast.Match)):
            end = node.lineno
        else:
            end = node.end_lineno
        out.update(range(node.lineno, end + 1))
    return out


def hand_edit(source: str, relpath: str, edit: Edit) -> Mutant:
    """The mutant of a hand-written edit (adequacy scope files' [[edit]]): `edit.original`
    must occur exactly once in the function, so the edit cannot land elsewhere unnoticed."""
    fn = _function_node(ast.parse(source), edit.function)
    if fn is None:
        raise ScopeError(f"edit in {relpath}: no function {edit.function}")
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    a = starts[(fn.decorator_list[0] if fn.decorator_list else fn).lineno - 1]
    b = starts[fn.end_lineno - 1] + fn.end_col_offset
    body, needle = data[a:b], edit.original.encode()
    if body.count(needle) != 1:
        raise ScopeError(f"edit in {relpath} {edit.function}: {edit.original!r} occurs "
                         f"{body.count(needle)} times, expected once")
    start = a + body.index(needle)
    end = start + len(needle)
    digest = hashlib.sha256(f"{relpath}\0{start}\0{end}\0{edit.replacement}".encode()).hexdigest()[:10]
    line = data[:start].count(b"\n") + 1
    return Mutant(f"m{digest}", relpath, edit.function, "edit", line, start, end, edit.original, edit.replacement)


def _function_node(tree, qualname: str):
    body, node = tree.body, None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _dead_store(node, fn, reads) -> bool:
    """An assignment whose every target is read nowhere in scope (see the module's docstring)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = []
    for t in targets:
        if isinstance(t, ast.Name):
            names.append(("local", t.id))
        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
            names.append(("self", t.attr))
        else:
            return False
    for kind, name in names:
        if kind == "self" and reads.get(("self", name)):
            return False
        if kind == "local" and any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                                   and n.lineno in reads["__in_scope_lines__"] for n in ast.walk(fn)):
            return False
    return True


def _is_logging(call: ast.Call) -> bool:
    f = call.func
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "logger"


def _edits(node, span, text):
    """(operator, line, start, end, replacement) for each mutant of one node."""
    if isinstance(node, ast.Compare):
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            a, b = span(left)[1], span(right)[0]
            gap = text(a, b)
            m = re.search(r"(?<![\w])" + OP_TEXT[type(op)] + r"(?![\w=])", gap)
            if m:
                yield "ror", node.lineno, a + m.start(), a + m.end(), ROR[type(op)]
            left = right
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
            a, b = span(node.comparators[0])
            for delta in ("+ 1", "- 1"):
                yield "cmp-off", node.lineno, a, b, f"({text(a, b)}) {delta}"
    elif isinstance(node, ast.BinOp) and type(node.op) in AOR:
        a, b = span(node)
        for delta in ("+ 1", "- 1"):
            yield "arith-off", node.lineno, a, b, f"(({text(a, b)}) {delta})"
        la, lb = span(node.left)[1], span(node.right)[0]
        gap = text(la, lb)
        old, new = AOR[type(node.op)]
        i = gap.find(old)
        if i >= 0:
            yield "aor", node.lineno, la + i, la + i + len(old), new
    elif isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("min", "max"):
            a, b = span(f)
            yield "minmax", node.lineno, a, b, "max" if f.id == "min" else "min"
        elif isinstance(f, ast.Attribute) and f.attr in ("pop", "popleft") and not node.keywords:
            a, b = span(node)
            base = text(*span(f.value))
            if f.attr == "popleft" and not node.args:
                yield "pop", node.lineno, a, b, f"{base}.pop()"
            elif not node.args:
                yield "pop", node.lineno, a, b, f"{base}.pop(0)"
            elif len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0:
                yield "pop", node.lineno, a, b, f"{base}.pop()"
    elif isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        a, b = span(node)
        new = str(not node.value) if isinstance(node.value, bool) else str(node.value + 1)
        yield "const", node.lineno, a, b, new
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        a, b = span(node.test)
        yield "negate", node.test.lineno, a, b, f"not ({text(a, b)})"
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and getattr(node, "value", None) is not None or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        a, b = span(node)
        # keep the line count, so the rest of the module keeps its line numbers
        yield "remove", node.lineno, a, b, "pass" + "\n" * (node.end_lineno - node.lineno)
