"""Which scheduling code the adequacy measures count, and the documented rules that put the
rest out of scope (adequacy_scope.toml). Nothing is dropped: an out-of-scope line or branch
is listed with the rule and the reason that put it there.

A `[[measure]]` entry with `callee = true` is code the scheduler calls to decide (the KV cache
manager, the block pool): measured (coverage, the fuzzer's guidance) and its coverage reported
on its own line, beside the scheduler's; it generates no mutants and has no goal yet.

A rule is either
    function = "Scheduler._mamba_block_aligned_split"   # fnmatch on the function's qualname
or
    line = "self\\.connector"                            # regex searched in a statement's text
or
    branch = "if finished:"   taken = "false"           # one direction of an `if`
A `line` rule matches a statement whose first line (for a compound statement: its header, e.g.
the whole condition of an `if`) contains the pattern; the statement and, for an `if`, its body
(not its `else`), for a loop, `with` or `try`, everything in it, are out of scope. A `branch`
rule matches an `if` header the same way and puts only one direction out of scope: "true" (the
arc into its body, and the body) or "false" (the other arcs, and the `else` body). With
`after = true`, a "false" rule on an `if` without `else` whose body always leaves its block
(return, raise, continue, break) puts the statements after it in that block out too: only the
false direction reaches them (e.g. `if reasoner is None: return True` and the reasoning code
after it).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.pins import REPO_ROOT

SCOPE_FILE = REPO_ROOT / "adequacy_scope.toml"


class ScopeError(InputError):
    """The scope file is malformed; the message names the entry and the field."""


@dataclass(frozen=True)
class Rule:
    reason: str
    function: str | None = None
    line: str | None = None
    branch: str | None = None
    taken: str | None = None  # "true" or "false", for a branch rule
    after: bool = False  # a "false" branch rule: the statements after an `if` that always leaves

    @property
    def label(self) -> str:
        if self.function:
            return f"function {self.function}"
        return f"line /{self.line}/" if self.line else f"branch /{self.branch}/ {self.taken}"


@dataclass(frozen=True)
class Edit:
    """A hand-written mutant: in `function` of `file`, the one occurrence of `original` becomes
    `replacement` (a bug no generated operator makes, e.g. a model's RMSNorm epsilon)."""
    file: str
    function: str
    original: str
    replacement: str
    reason: str


@dataclass(frozen=True)
class Scope:
    measure: tuple[tuple[str, tuple[str, ...]], ...]  # (file suffix, qualname globs)
    rules: tuple[Rule, ...]
    # generated mutants (conformance/adequacy/mutation.py ids) that no targeted configuration can tell
    # from the release, each with the reason
    equivalent: dict = field(default_factory=dict)
    edits: tuple = ()  # hand-written mutants (Edit), beside the generated ones
    # files the scheduler calls to decide (`callee = true`): measured (coverage, the fuzzer's
    # guidance) and reported on their own, but not mutated and not under the branch goal
    callees: tuple[str, ...] = ()

    def measured(self, path: str, qualname: str) -> bool:
        return any(path.endswith(suffix) and any(fnmatch.fnmatchcase(qualname, g) for g in globs)
                   for suffix, globs in self.measure)

    def callee(self, path: str) -> bool:
        """Whether this measured file is code the scheduler calls (no mutants, no goal)."""
        return any(path.endswith(suffix) for suffix in self.callees)


def load_scope(path: Path = SCOPE_FILE) -> Scope:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ScopeError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"measure", "out_of_scope", "equivalent", "edit"}
    if unknown:
        raise ScopeError(f"{path}: unknown top-level keys {sorted(unknown)}")
    measure, callees = [], []
    for i, m in enumerate(data.get("measure", [])):
        if set(m) - {"callee"} != {"file", "functions"} or not isinstance(m["file"], str) or not (
                isinstance(m["functions"], list) and all(isinstance(g, str) for g in m["functions"])) \
                or not isinstance(m.get("callee", False), bool):
            raise ScopeError(f"{path}: measure[{i}]: expected file = \"...\" and functions = [\"...\"] "
                             "(and optionally callee = true)")
        measure.append((m["file"], tuple(m["functions"])))
        if m.get("callee", False):
            callees.append(m["file"])
    rules = []
    for i, r in enumerate(data.get("out_of_scope", [])):
        kinds = [k for k in ("function", "line", "branch") if k in r]
        if len(kinds) != 1 or set(r) - {"function", "line", "branch", "taken", "after", "reason"} or \
                not str(r.get("reason", "")).strip() or ("branch" in r) != (r.get("taken") in ("true", "false")) \
                or ("after" in r and (r["after"] is not True or r.get("taken") != "false")):
            raise ScopeError(f"{path}: out_of_scope[{i}]: expected one of function / line / branch "
                             "(a branch with taken = \"true\" or \"false\", and after = true only with "
                             "\"false\"), and a reason")
        for key in ("line", "branch"):
            if key in r:
                try:
                    re.compile(r[key])
                except re.error as exc:
                    raise ScopeError(f"{path}: out_of_scope[{i}].{key}: bad regex: {exc}") from None
        rules.append(Rule(r["reason"], r.get("function"), r.get("line"), r.get("branch"), r.get("taken"),
                          r.get("after", False)))
    equivalent = {}
    for i, e in enumerate(data.get("equivalent", [])):
        if set(e) != {"id", "reason"} or not re.fullmatch(r"m[0-9a-f]{10}", str(e["id"])) or not str(e["reason"]).strip():
            raise ScopeError(f"{path}: equivalent[{i}]: expected id = \"m<10 hex digits>\" and a reason")
        equivalent[e["id"]] = e["reason"]
    edits = []
    for i, e in enumerate(data.get("edit", [])):
        fields = ("file", "function", "original", "replacement", "reason")
        if set(e) != set(fields) or not all(isinstance(e[k], str) and e[k].strip() for k in fields) \
                or e["original"] == e["replacement"]:
            raise ScopeError(f"{path}: edit[{i}]: expected {', '.join(fields)} (strings, the "
                             "replacement differing from the original)")
        edits.append(Edit(*(e[k] for k in fields)))
    return Scope(tuple(measure), tuple(rules), equivalent, tuple(edits), tuple(callees))


@dataclass
class FunctionScope:
    """One measured function of one pin: its in-scope and out-of-scope lines and branches."""
    file: str
    qualname: str
    statements: set[int] = field(default_factory=set)  # in scope
    covered: set[int] = field(default_factory=set)
    branches: set[tuple[int, int]] = field(default_factory=set)  # in scope
    covered_branches: set[tuple[int, int]] = field(default_factory=set)
    # out of scope: line or branch -> the rule that put it there
    out_lines: dict[int, Rule] = field(default_factory=dict)
    out_branches: dict[tuple[int, int], Rule] = field(default_factory=dict)
    missing_out_branches: dict[tuple[int, int], Rule] = field(default_factory=dict)
    executed_out: set[int] = field(default_factory=set)  # out-of-scope lines that ran anyway

    @property
    def missing_branches(self) -> list[tuple[int, int]]:
        return sorted(self.branches - self.covered_branches)


def out_of_scope_lines(source: str, scope: Scope) -> dict[int, Rule]:
    """line number -> the line rule that puts it out of scope, for one file's source."""
    return _scan(source, scope)[0]


def out_of_scope_arcs(source: str, scope: Scope) -> dict[int, tuple[int, Rule]]:
    """`if` line -> (the first line of its body, the branch rule naming one direction)."""
    return _scan(source, scope)[1]


def _scan(source: str, scope: Scope):
    line_rules = [r for r in scope.rules if r.line]
    branch_rules = [r for r in scope.rules if r.branch]
    arcs: dict[int, tuple[int, Rule]] = {}
    lines = source.splitlines()
    found: dict[int, Rule] = {}

    def text(a: int, b: int) -> str:
        return "\n".join(lines[a - 1:b])

    tree = ast.parse(source)
    after: dict[int, list[ast.stmt]] = {}  # an `if` (by id) -> the statements after it in its block
    for parent in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(parent, name, None)
            if isinstance(block, list):
                for i, stmt in enumerate(block):
                    if isinstance(stmt, ast.If):
                        after[id(stmt)] = block[i + 1:]
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.If, ast.While)):
            header_end = node.test.end_lineno
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            header_end = node.iter.end_lineno
        elif isinstance(node, (ast.With, ast.AsyncWith, ast.Try)):
            header_end = node.lineno
        else:  # a simple statement is matched on its first line: a call that passes an
            header_end = node.lineno  # out-of-scope argument along is still in scope
        header = text(node.lineno, header_end).strip()
        if isinstance(node, ast.If):
            b = next((r for r in branch_rules if re.search(r.branch, header)), None)
            if b is not None:
                arcs[node.lineno] = (node.body[0].lineno, b)
                # the code only that direction reaches is out of scope with it
                only = node.body if b.taken == "true" else node.orelse
                if b.after and not node.orelse and \
                        isinstance(node.body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                    only = after.get(id(node), [])
                for stmt in only:
                    for n in range(stmt.lineno, stmt.end_lineno + 1):
                        found.setdefault(n, b)
        rule = next((r for r in line_rules if re.search(r.line, header)), None)
        if rule is None:
            continue
        end = node.body[-1].end_lineno if isinstance(node, ast.If) else node.end_lineno
        for n in range(node.lineno, end + 1):
            found.setdefault(n, rule)
    return found, arcs


def function_scopes(report: dict, sources: dict[str, str], scope: Scope) -> list[FunctionScope]:
    """Per measured function, from coverage.py's JSON report; `sources` maps the report's file
    names to their text (the pin's own sources)."""
    out = []
    for path, data in sorted(report["files"].items()):
        rel = "vllm/" + path.split("/vllm/", 1)[1] if "/vllm/" in path else path
        out_lines, out_arcs = _scan(sources[path], scope)
        for qualname, fn in data.get("functions", {}).items():
            if not qualname or not scope.measured(rel, qualname):
                continue
            f = FunctionScope(rel, qualname)
            whole = next((r for r in scope.rules if r.function and fnmatch.fnmatchcase(qualname, r.function)), None)
            lines = set(fn["executed_lines"]) | set(fn["missing_lines"])
            arcs = {tuple(a) for a in fn["executed_branches"]} | {tuple(a) for a in fn["missing_branches"]}
            executed_arcs = {tuple(a) for a in fn["executed_branches"]}
            for n in lines:
                rule = whole or out_lines.get(n)
                if rule:
                    f.out_lines[n] = rule
                else:
                    f.statements.add(n)
            f.covered = f.statements & set(fn["executed_lines"])
            f.executed_out = set(f.out_lines) & set(fn["executed_lines"])
            for arc in arcs:
                rule = whole or out_lines.get(arc[0]) or (out_lines.get(arc[1]) if arc[1] > 0 else None)
                if rule is None and arc[0] in out_arcs:
                    body, branch = out_arcs[arc[0]]
                    if (arc[1] == body) == (branch.taken == "true"):
                        rule = branch
                if rule:
                    f.out_branches[arc] = rule
                    if arc not in executed_arcs:
                        f.missing_out_branches[arc] = rule
                else:
                    f.branches.add(arc)
            f.covered_branches = f.branches & executed_arcs
            out.append(f)
    return out
