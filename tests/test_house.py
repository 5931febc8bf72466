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
    0: ("formats", "conformance conformance.protocol conformance.serve conformance.refusal conformance.fields "
        "conformance.workload conformance.method_matrix conformance.gate conformance.gate.engine_ref "
        "conformance.scenario conformance.trace conformance.record_schema conformance.files "
        "conformance.pins conformance.progress conformance.scope conformance.mutation conformance.gpu"),
    1: ("the vLLM side", "engines engines.vllm engines.vllm.* engines.cpp.tests.gen_vectors"),
    2: ("processes and environments", "conformance.fidelity conformance.envs conformance.engine "
        "conformance.keeper conformance.selfcheck conformance.coverage_run"),
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


# Engine texts and golden files belong to conformance/gate/: EngineRef parses every form an
# engine is given in, GoldenStore reads and writes every golden. Everything else asks them.
OUTSIDE_GATE = ("conformance", "parity", "benchmarks", "tests/doubles", "conftest.py")
ENGINE_TEXT_PARSERS = {"parse_pin", "release_of", "_pin_form"}
READS = {"load", "loads", "load_trace", "loads_trace", "read_text", "read_bytes", "open"}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _mentions_golden(node: ast.AST, tainted: set[str] = frozenset()) -> bool:
    """Names a golden file: a name that says golden (the store's reads aside), the store's
    path of one, or a variable that holds one."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "path" and getattr(sub.value, "id", "") == "GOLDENS":
            return True
        words = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else ""
        if (words != "GOLDENS" and "golden" in words.lower()) or (isinstance(sub, ast.Name) and sub.id in tainted):
            return True
    return False


def _golden_variables(tree: ast.AST) -> set[str]:
    """Variables that hold a golden's path (or paths), assigned or looped over."""
    tainted: set[str] = set()
    for _ in range(3):  # a path handed on through a variable or two
        for node in ast.walk(tree):
            pairs = ([(t, node.value) for t in node.targets] if isinstance(node, ast.Assign) else
                     [(node.target, node.iter)] if isinstance(node, (ast.For, ast.comprehension)) else [])
            for target, value in pairs:
                if _mentions_golden(value, tainted):
                    tainted.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return tainted


def outside_the_gate(source: str) -> list[str]:
    """What a module outside conformance/gate/ must not do: parse an engine text (a `+mutant:`
    literal, a pin parser) or read a golden file itself (a path under goldens/, a read of
    anything named golden that is not the store)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    scope_of, taint = {}, {}  # each call's innermost function (variables are the function's own)
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        taint[id(scope)] = _golden_variables(scope)
        scope_of.update((id(n), id(scope)) for n in ast.walk(scope))  # inner functions come later
    in_paths = {id(arg) for node in ast.walk(tree) for arg in  # the parts of a path: a / b, join(a, b), Path(a)
                ([node.left, node.right] if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) else
                 node.args if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
                 in ("join", "Path", "joinpath", "open") else [])}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value.startswith("+mutant:"):
                found.append(f"line {node.lineno}: builds or parses an engine text ({node.value!r}): use EngineRef")
            if (node.value == "goldens" or node.value.startswith("goldens/")) and id(node) in in_paths:
                found.append(f"line {node.lineno}: a path under goldens/ ({node.value!r}): use GoldenStore")
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ENGINE_TEXT_PARSERS:
                found.append(f"line {node.lineno}: parses an engine text ({name}): use EngineRef")
            owner = node.func.value if isinstance(node.func, ast.Attribute) else None
            if owner is not None and isinstance(owner, ast.Name) and owner.id == "GOLDENS":
                continue
            if name in READS and _mentions_golden(node, taint[scope_of[id(node)]]):
                found.append(f"line {node.lineno}: reads a golden file itself ({name}): use GoldenStore")
    return found


def test_only_the_gate_package_parses_engine_texts_and_reads_goldens():
    paths = []
    for root in OUTSIDE_GATE:
        path = REPO / root
        paths += [path] if path.is_file() else sorted(path.rglob("*.py"))
    found = [f"{p.relative_to(REPO)} {problem}" for p in paths if "gate" not in p.relative_to(REPO).parts[:2]
             for problem in outside_the_gate(p.read_text())]
    assert found == [], "engine texts or goldens handled outside conformance/gate/:\n" + "\n".join(found)


def test_the_gate_checker_finds_what_it_forbids():
    assert outside_the_gate('"""Serves 0.27.1+mutant:NAME."""\nhelp = "a pin (0.27.1+mutant:NAME)"\n') == []
    assert outside_the_gate('x = f"{pin}+mutant:{name}"')[0].endswith("use EngineRef")
    assert outside_the_gate('pin, _, m = text.partition("+mutant:")')[0].endswith("use EngineRef")
    assert outside_the_gate('release = parse_pin(text, pins)')[0].endswith("(parse_pin): use EngineRef")
    assert outside_the_gate('g = json.loads(golden_path(s, r).read_text())')[0].endswith("use GoldenStore")
    assert outside_the_gate('p = os.path.join(here, "goldens", name)')[0].endswith("use GoldenStore")
    assert outside_the_gate('old = json.loads(old_golden)') != []
    assert outside_the_gate('p = REPO_ROOT / "goldens"')[0].endswith("use GoldenStore")
    assert outside_the_gate('sub.add_parser("goldens", help="regenerate")') == []
    assert outside_the_gate('g = GOLDENS.load(s, r)\nb = GOLDENS.content(s, r)') == []
    assert outside_the_gate('ps = GOLDENS.path(s, a), GOLDENS.path(s, b)\nx = [json.loads(p.read_text()) for p in ps]') != []


def test_every_text_read_and_write_names_its_encoding():
    """conformance/, engines/, parity/, benchmarks/ and the test doubles: open() in text mode,
    read_text, write_text, fdopen and subprocess's text mode, each with encoding=."""
    import ast

    def unnamed(source: str) -> list[int]:
        found = []
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", None) if isinstance(func, ast.Attribute) else None
            position = 1 if isinstance(func, ast.Name) or name == "fdopen" else 0
            mode = next((k.value for k in node.keywords if k.arg == "mode"),
                        node.args[position] if len(node.args) > position else None)
            binary = isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "b" in mode.value
            text_mode = any(k.arg in ("text", "universal_newlines") and not (
                isinstance(k.value, ast.Constant) and k.value.value is False) for k in node.keywords)
            if ((name in ("read_text", "write_text") and isinstance(func, ast.Attribute))
                    or (((name == "open" and owner != "os") or name == "fdopen") and not binary) or text_mode):
                found.append(node.lineno)
        return found

    assert unnamed('p.read_text()\nopen(p, "w")\nopen(p, "rb")\nos.open(p, 1)\nrun(a, text=True)\n'
                   'read_text(p, "scenario")\np.open()\nos.fdopen(fd, "w")\n') == [1, 2, 5, 7, 8]
    roots = [REPO / d for d in ("conformance", "engines", "parity", "benchmarks", "tests/doubles")]
    found = [f"{p.relative_to(REPO)}:{line}" for root in roots for p in sorted(root.rglob("*.py"))
             for line in unnamed(p.read_text(encoding="utf-8"))]
    assert found == [], "text read or written in the locale's encoding:\n" + "\n".join(found)
