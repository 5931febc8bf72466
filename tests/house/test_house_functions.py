"""The house rule on length: a function does one job and is at most LIMIT lines long. Every
function of conformance/ (methods and nested functions too) is measured from its `def` to its
last line; a longer one fails unless docs/architecture.md's table of long functions lists it
with why it reads better whole, and a listed one that is no longer long fails too, so the
table stays true."""

import ast
import re
from pathlib import Path

from tests.helpers import REPO

LIMIT = 60
DOC = REPO / "docs" / "architecture.md"
BEGIN, END = "<!-- long functions", "<!-- end long functions -->"
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


def long_functions(root: Path) -> dict[str, int]:
    """`path.py:Qualified.name` (the path under `root`) -> its lines, for each function over LIMIT."""
    found = {}

    def visit(node, where: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                if lines > LIMIT:
                    found[f"{where}:{prefix}{child.name}"] = lines
                visit(child, where, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, where, f"{prefix}{child.name}.")
            else:
                visit(child, where, prefix)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), path.relative_to(root).as_posix(), "")
    return found


def listed(text: str) -> dict[str, str]:
    """The table of long functions in the doc's text: function -> why (empty when no reason)."""
    if BEGIN not in text or END not in text:
        raise AssertionError(f"docs/architecture.md has no table of long functions ({BEGIN} ... {END})")
    table = text.split(BEGIN, 1)[1].split("\n", 1)[1].split(END, 1)[0]
    rows = {}
    for line in table.splitlines():
        match = ROW.match(line.strip())
        if match and match[1] != "function":
            rows[match[1]] = match[2].strip()
    return rows


def test_no_function_is_longer_than_the_limit_unless_listed_with_why():
    allowed = listed(DOC.read_text(encoding="utf-8"))
    found = long_functions(REPO / "conformance")
    unlisted = [f"{name}: {lines} lines" for name, lines in sorted(found.items()) if name not in allowed]
    assert unlisted == [], (f"functions over {LIMIT} lines: split each by job, or list it with why in "
                            "docs/architecture.md's table of long functions:\n" + "\n".join(unlisted))
    assert all(allowed.values()), f"a long function listed without why: {[n for n, w in allowed.items() if not w]}"
    stale = sorted(set(allowed) - set(found))
    assert stale == [], f"listed in docs/architecture.md as over {LIMIT} lines, and no longer are (or gone): {stale}"


def test_the_length_check_finds_a_long_method_and_reads_the_table(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT - 1))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        f"class A:\n    def long(self):\n{body}\n\n    def short(self):\n        return 1\n\n"
        f"def exact():\n{body}\n", encoding="utf-8")
    assert long_functions(tmp_path) == {}  # LIMIT lines each: the def and LIMIT - 1 more
    (tmp_path / "pkg" / "m.py").write_text(
        f"class A:\n    def long(self):\n{body}\n        return 0\n", encoding="utf-8")
    assert long_functions(tmp_path) == {"pkg/m.py:A.long": LIMIT + 1}
    doc = (f"text\n{BEGIN}: x -->\n| function | why |\n|---|---|\n| `pkg/m.py:A.long` | one table, read whole |\n"
           f"| `pkg/m.py:B.c` |  |\n{END}\n| `outside.py:f` | not read |\n")
    assert listed(doc) == {"pkg/m.py:A.long": "one table, read whole", "pkg/m.py:B.c": ""}
