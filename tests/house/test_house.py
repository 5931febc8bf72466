"""The house rules that keep the code readable: imports flow one way, down the floors that
conformance/floors.py declares by package (and `parity docs` renders into docs/architecture.md),
never in a circle; and one module owns the golden folder."""

import ast
import sys
from pathlib import Path

from conformance.floors import FLOORS, floor_of
from conformance.report.readme_tables import stale
from tests.helpers import REPO

TREES = ("conformance", "engines", "parity")


def where(module: str) -> str:
    floor = floor_of(module)
    return f"floor {floor.number}, {floor.name}"


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the floors: upward, from the harness into engines/ (the harness
    runs engines as processes, never imports them), or from a module in no declared package."""
    found = []
    for module in sorted(edges):
        here = floor_of(module)
        if here is None:
            found.append(f"{module}: in no package of conformance/floors.py (add its package there)")
            continue
        for target in sorted(edges[module]):
            there = floor_of(target)
            if there is not None and there.number > here.number:
                found.append(f"{module} ({where(module)}) imports {target} ({where(target)})")
            elif target.startswith("engines") and not module.startswith("engines"):
                found.append(f"{module} imports {target}: the harness runs engines, never imports them")
    return found


def modules_of(*roots: Path) -> dict[str, Path]:
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
            for root in roots for p in root.rglob("*.py")}


def imports_of(*roots: Path) -> dict[str, set[str]]:
    """module -> the modules of the given trees it imports (absolute and relative imports)."""
    modules = modules_of(*roots)
    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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


def test_every_module_is_in_a_declared_package():
    modules = modules_of(*(REPO / tree for tree in TREES))
    found = sorted(m for m in modules if floor_of(m) is None)
    assert found == [], f"modules in no package of conformance/floors.py: {found}"
    unused = [name for floor in FLOORS for name in floor.packages
              if not any(floor_of(m) == floor and (m == name.removesuffix(".*") or name.endswith(".*")
                                                   and m.startswith(name[:-1])) for m in modules)]
    assert unused == [], f"conformance/floors.py declares packages that hold no module: {unused}"


def test_imports_go_down_the_floors():
    found = upward(imports_of(*(REPO / tree for tree in TREES)))
    assert found == [], "imports against the floors:\n" + "\n".join(found)


def test_the_formats_floor_needs_only_the_standard_library():
    """A pin's worker imports the formats in vLLM's own environment, where the harness's
    dependencies are not installed."""
    for module, path in modules_of(REPO / "conformance").items():
        floor = floor_of(module)
        if floor is None or floor.number != 0:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                there = floor_of(name)
                assert top in sys.stdlib_module_names or (there and there.number == 0), f"{module} imports {name}"


def test_the_floor_checker_finds_what_breaks_them():
    assert upward({"conformance.formats.protocol": {"conformance.judging.verdict"}}) == [
        "conformance.formats.protocol (floor 0, formats) imports conformance.judging.verdict (floor 3, judging)"]
    assert upward({"conformance.gate.run": {"engines.vllm.worker"}}) == [
        "conformance.gate.run imports engines.vllm.worker: the harness runs engines, never imports them"]
    assert upward({"conformance.new_thing": set()})[0].startswith("conformance.new_thing: in no package")
    assert upward({"conformance.cli": {"conformance.formats.protocol"},
                   "engines.vllm.worker": {"conformance.formats.scenario"}}) == []
    # a command inside a stage's package sits on the commands floor, not its package's
    assert floor_of("conformance.fuzz.command").number == 7 and floor_of("conformance.fuzz.search").number == 6
    assert upward({"conformance.fuzz.search": {"conformance.fuzz.command"}})[0].endswith("(floor 7, commands)")


def test_the_architecture_doc_shows_the_declared_floors():
    """docs/architecture.md's floors table is what `parity docs` renders from conformance/floors.py."""
    doc = REPO / "docs" / "architecture.md"
    assert stale(doc, [], ["floors"]) == [], "run `.venv/bin/parity docs` and commit docs/architecture.md"


def test_a_floors_table_that_drifted_is_named(tmp_path):
    doc = tmp_path / "architecture.md"
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    doc.write_text(text.replace("| 3 | judging |", "| 3 | comparison |"), encoding="utf-8")
    assert stale(doc, [], ["floors"]) == ["floors"]


# The golden folder belongs to judging/goldens.py (GoldenStore): everything else asks it.
GOLDEN_OWNER = Path("conformance/judging/goldens.py")
GOLDEN_CHECKED = ("conformance", "parity", "benchmarks", "tests/doubles", "conftest.py")


def golden_paths(source: str) -> list[int]:
    """The lines that build a path into the golden folder: the string "goldens" (or
    "goldens/...") as a part of a path, an operand of `/` or an argument of Path(), joinpath()
    or os.path.join()."""
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts += [node.left, node.right]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "Path", "join", "joinpath"):
            parts += node.args
    return sorted(p.lineno for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)
                  and (p.value == "goldens" or p.value.startswith("goldens/")))


def test_only_the_golden_store_touches_the_golden_folder():
    paths = []
    for root in GOLDEN_CHECKED:
        path = REPO / root
        paths += [path] if path.is_file() else sorted(path.rglob("*.py"))
    found = [f"{p.relative_to(REPO)}:{line}" for p in paths if p.relative_to(REPO) != GOLDEN_OWNER
             for line in golden_paths(p.read_text(encoding="utf-8"))]
    assert found == [], "a path into goldens/ built outside judging/goldens.py (use GOLDENS):\n" + "\n".join(found)
    assert golden_paths((REPO / GOLDEN_OWNER).read_text(encoding="utf-8")), "the store no longer names goldens/"


def test_the_golden_folder_rule_finds_a_path_under_goldens():
    assert golden_paths('p = REPO_ROOT / "goldens" / name') == [1]
    assert golden_paths('p = os.path.join(here, "goldens", name)') == [1]
    assert golden_paths('x = 1\np = Path("goldens/steady_decode/vllm-0.27.1.json")') == [2]
    assert golden_paths('sub.add_parser("goldens", help="regenerate")\ng = GOLDENS.load(s, r)') == []


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


def test_no_worker_module_shadows_a_module_of_a_pin_environment():
    """The worker runs as a script from engines/vllm/, so that folder comes first on its
    sys.path: a module there named like one vLLM imports (requests.py) would hide it, and no
    pin could start. Checked against every built pin environment's top-level names."""
    import glob

    from conformance.formats.settings import cache_root

    ours = {p.stem for p in (REPO / "engines" / "vllm").glob("*.py")}
    folders = glob.glob(str(cache_root() / "envs" / "vllm-*" / "lib" / "python3*" / "site-packages"))
    if not folders:
        import pytest

        pytest.skip("no pin environment built here")
    for folder in folders:
        theirs = {Path(p).name.split(".")[0] for p in glob.glob(f"{folder}/*")
                  if p.endswith(".py") or Path(p).is_dir() or ".cpython-" in p}
        theirs |= set(sys.stdlib_module_names)
        assert not ours & theirs, f"engines/vllm/ modules named like modules of {folder}: {sorted(ours & theirs)}"


def test_conftest_patches_no_production_code():
    """The shared fixtures reach the harness through its seams (the gate's ENGINE_SESSIONS), never
    by replacing its classes or functions: conftest.py and the warm-engine plugin set nothing."""
    for path in (REPO / "conftest.py", REPO / "tests" / "warm_engines.py"):
        text = path.read_text(encoding="utf-8")
        assert "setattr" not in text and "monkeypatch" not in text and "mock." not in text, path


def test_conftest_holds_only_pytests_hooks_and_fixtures_and_no_test_imports_it():
    """What test files share is plain code in tests/helpers.py (or a package's helper module, such
    as tests/report/chromium.py); conftest.py is pytest's alone, and no test file imports another."""
    tree = ast.parse((REPO / "conftest.py").read_text(encoding="utf-8"))
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    not_pytests = [n.name for n in functions if not n.name.startswith("pytest_")
                   and not any("fixture" in ast.unparse(d) for d in getattr(n, "decorator_list", []))]
    assert not not_pytests, f"conftest.py defines more than hooks and fixtures (to tests/helpers.py): {not_pytests}"
    importers = [str(p.relative_to(REPO)) for top in ("tests", "parity") for p in sorted((REPO / top).rglob("*.py"))
                 for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                 if (isinstance(n, ast.ImportFrom) and n.module == "conftest")
                 or (isinstance(n, ast.Import) and any(a.name == "conftest" for a in n.names))]
    assert not importers, f"import from tests/helpers.py, not conftest: {importers}"
    borrowers = [f"{p.relative_to(REPO)}: {n.module}" for p in sorted((REPO / "tests").rglob("test_*.py"))
                 for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                 if isinstance(n, ast.ImportFrom) and (n.module or "").rsplit(".", 1)[-1].startswith("test_")]
    assert not borrowers, f"a test file's helpers are shared through a helper module, not imported from it: {borrowers}"


# tests/ is laid out like the code: tests/PACKAGE/ tests conformance/PACKAGE/; these folders hold
# the rest, and test_cli.py sits at the top as cli.py does in conformance/.
TEST_FOLDERS_BESIDE_THE_PACKAGES = {"engines", "house", "benchmarks", "doubles", "data"}


def test_tests_are_laid_out_like_the_code():
    packages = {p.parent.name for p in (REPO / "conformance").glob("*/__init__.py")}
    folders = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= packages | TEST_FOLDERS_BESIDE_THE_PACKAGES, sorted(folders - packages)
    at_the_top = sorted(p.name for p in (REPO / "tests").glob("test_*.py"))
    assert at_the_top == ["test_cli.py"], f"put each test file in the folder of what it tests: {at_the_top}"


# Strings that spell a kind and are not one, each with its reason: the house test below finds any
# other string literal of a kind outside the enum (conformance/formats/kinds.py).
NOT_KINDS = {
    ("conformance/judging/goldens.py", "numerics"): "a golden's rule (bytes, tolerance, numerics), not a verdict",
    ("conformance/adequacy/mutation.py", "pass"): "Python's pass statement, put in the place of a removed one",
}


def test_no_kind_is_spelled_outside_its_enum():
    import ast

    from conformance.formats.kinds import Kind

    words = {k.value for k in Kind}
    found = []
    for path in sorted((REPO / "conformance").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name == "conformance/formats/kinds.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        fields = set()  # "protocol" as the hello's field: a key, an index, a .get() argument
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                fields.update(id(k) for k in node.keys if k is not None)
            elif isinstance(node, ast.Subscript):
                fields.add(id(node.slice))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                fields.update(id(a) for a in node.args[:1])
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value in words and (name, node.value) not in NOT_KINDS
                    and not (node.value == "protocol" and id(node) in fields)):
                found.append(f"{name}:{node.lineno} {node.value!r}")
    assert not found, "a kind spelled as a string: use conformance.formats.kinds.Kind\n" + "\n".join(found)
