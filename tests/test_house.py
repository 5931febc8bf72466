"""The house rules that keep the code readable: imports flow one way, down the floors declared
in docs/architecture.md, and never in a circle."""

import ast
import re
import sys
from pathlib import Path

from conftest import REPO

# The floors, bottom first: a module imports only modules on its own floor or below (and, on its
# own floor, never in a circle). The same table is in docs/architecture.md ("Floors").
FLOORS = {
    0: ("formats", "conformance conformance.protocol conformance.refusal conformance.fields "
        "conformance.workload conformance.method_matrix conformance.gate conformance.scenario conformance.trace "
        "conformance.pins conformance.progress conformance.scope conformance.mutation conformance.gpu"),
    1: ("the vLLM side", "engines engines.vllm engines.vllm.* engines.cpp.tests.gen_vectors"),
    2: ("processes and environments", "conformance.fidelity conformance.envs conformance.engine "
        "conformance.selfcheck conformance.coverage_run"),
    3: ("comparison and judging", "conformance.compare conformance.numerics conformance.noise "
        "conformance.gate.verdict conformance.gate.golden_store conformance.gate.waivers "
        "conformance.gate.requirement_rows conformance.gate.judging conformance.drift "
        "conformance.methods_table conformance.comparability"),
    4: ("running", "conformance.runner conformance.gate.shards conformance.gate.engines conformance.gate.context "
        "conformance.gate.plan conformance.gate.execute conformance.gate.results"),
    5: ("reports", "conformance.gate.view conformance.gate.render_text conformance.gate.render_ci "
        "conformance.gate.render_html conformance.gate.report_files conformance.gate.ci conformance.readme_tables"),
    6: ("runs", "conformance.gate.run conformance.adequacy conformance.adequacy_engine "
        "conformance.adequacy_report conformance.fuzz conformance.fuzz_strategies parity parity.*"),
    7: ("commands", "conformance.cli conformance.adequacy_cli conformance.fuzz_cli"),
}
TREES = ("conformance", "engines", "parity")


def floor_of(module: str) -> int | None:
    for floor, (_, names) in FLOORS.items():
        for pattern in names.split():
            if module == pattern or (pattern.endswith(".*") and module.startswith(pattern[:-1])):
                return floor
    return None


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the floors: upward, from the harness into engines/ (the harness
    runs engines as processes, never imports them), or an undeclared module."""
    found = []
    for module in sorted(edges):
        here = floor_of(module)
        if here is None:
            found.append(f"{module}: no floor declared (add it to FLOORS here and in docs/architecture.md)")
            continue
        for target in sorted(edges[module]):
            there = floor_of(target)
            if there is not None and there > here:
                found.append(f"{module} (floor {here}, {FLOORS[here][0]}) imports {target} "
                             f"(floor {there}, {FLOORS[there][0]})")
            elif target.startswith("engines") and not module.startswith("engines"):
                found.append(f"{module} imports {target}: the harness runs engines, never imports them")
    return found


def imports_of(*roots: Path) -> dict[str, set[str]]:
    """module -> the modules of the given trees it imports (absolute and relative imports)."""
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
               for root in roots for p in root.rglob("*.py")}
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


def test_imports_go_down_the_floors():
    found = upward(imports_of(*(REPO / tree for tree in TREES)))
    assert found == [], "imports against the floors:\n" + "\n".join(found)


def test_the_formats_floor_needs_only_the_standard_library():
    """A pin's worker imports the formats in vLLM's own environment, where the harness's
    dependencies are not installed."""
    for module in imports_of(REPO / "conformance"):
        if floor_of(module) != 0:
            continue
        path = REPO / (module.replace(".", "/") + ".py")
        path = path if path.exists() else path.with_suffix("") / "__init__.py"  # a package
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or floor_of(name) == 0, f"{module} imports {name}"


def test_the_floor_checker_finds_what_breaks_them():
    assert upward({"conformance.protocol": {"conformance.gate.verdict"}}) == [
        "conformance.protocol (floor 0, formats) imports conformance.gate.verdict (floor 3, comparison and judging)"]
    assert upward({"conformance.gate.run": {"engines.vllm.worker"}}) == [
        "conformance.gate.run imports engines.vllm.worker: the harness runs engines, never imports them"]
    assert upward({"conformance.new_thing": set()})[0].startswith("conformance.new_thing: no floor declared")
    assert upward({"conformance.cli": {"conformance.protocol"}, "engines.vllm.worker": {"conformance.scenario"}}) == []


def test_the_architecture_doc_declares_the_same_floors():
    text = (REPO / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d) \| ([^|]+?) \| ([^|]+?) \| [^|]* \|$", text, re.M)  # floor, name, modules, why
    declared = {int(n): (name, " ".join(m.strip("` ") for m in mods.split(","))) for n, name, mods in rows}
    assert declared == FLOORS
