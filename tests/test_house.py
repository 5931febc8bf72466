"""The house rules that keep the code readable: imports flow one way, no circles."""

import ast
from pathlib import Path

from conftest import REPO


def imports_of(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the same tree it imports (absolute and relative imports)."""
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                found.update([base] + [f"{base}.{a.name}" for a in node.names])
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_circles():
    for tree in ("conformance", "engines"):
        found = circle(imports_of(REPO / tree))
        assert found is None, f"import circle in {tree}/: {' -> '.join(found)}"


def test_the_circle_finder_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None
