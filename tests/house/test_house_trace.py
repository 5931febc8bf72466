"""A trace is a type (conformance/formats/trace.py Trace), read by its attributes: no module of
conformance/ but formats/trace.py looks a trace's part up by its JSON key (trace["layers"],
golden.get("digests"), "failure" in trace). Such a lookup on a dict that is not a trace is
allowed only on the names NOT_TRACES lists, each with what it is. The tests and benchmarks are
held to it too, by the last name an expression is read through (TESTS_NOT_TRACES adds theirs):
a test that edits a trace as JSON reads it with json.loads or .to_json() and names it `edited`."""

import ast

from tests.helpers import REPO

# the parts of a trace's JSON (formats/trace.py's schema)
TRACE_KEYS = {"schema", "engine", "scenario", "provenance", "layers", "digests", "failure", "not_served",
              "capabilities", "features", "unsupported_features"}
# dicts that share a key with a trace and are not one, by the name they are read through
NOT_TRACES = {
    "hello": "an engine's handshake (formats/protocol.py)",
    "message": "a protocol message (formats/serve.py)",
    "wanted": "a GPU request (formats/gpu.py)",
    "raw": "a scenario file's JSON (formats/scenario.py)",
    "identity": "what a scenario's sha256 is taken of (formats/scenario.py)",
    "wire": "a scenario as the protocol sends it (formats/scenario.py)",
    "data": "an engine reference's JSON (formats/engine_ref.py)",
    "manifest": "a results folder's manifest (gate/results.py)",
    "unit": "a results folder's unit entry (gate/results.py)",
    "e": "a results folder's unit entry (gate/results.py)",
    "summary": "a unit's verdict summary (gate/run.py)",
    "s": "a plan's scenario entry (gate/plan.py RunManifest.scenarios)",
    "scenario": "a plan's scenario entry (judging/judging.py judge_layers)",
    "result": "adequacy's cached result of a mutant (adequacy/measure.py)",
    "caught": "adequacy's cached result of a mutant (adequacy/measure.py)",
    "g": "a report's group of rows (report/)",
    "old_json": "an old golden's text read as plain JSON for the change text (judging/golden_changes.py)",
}


# dicts of the tests and benchmarks that share a key with a trace, by the last name they are read through
TESTS_NOT_TRACES = {
    "loads": "a file read as plain JSON (json.loads), to check or edit its text",
    "to_json": "a trace's JSON (Trace.to_json), to check what the file holds",
    "edited": "a trace's JSON that a test edits, then writes or reads back (tests.helpers.trace_of)",
    "kit_golden": "a golden of the C++ kit read as plain JSON (tests/engines/test_cpp_kit.py)",
    "v": "an entry of a results folder's verdicts.json",
    "u": "a results folder's unit entry (gate/results.py)",
    "meta": "a tiny model's meta.json (tests/engines/tiny_*.py)",
    "outputs": "output records by request id (a request named `schema`)",
    "older": "a golden's JSON given an older schema (tests/process/test_faults.py)",
    "rule": "a hostile engine's rule (tests/doubles/hostile_engine.py)",
}


def _root(node: ast.expr) -> str:
    """The name an expression is read through: `hello` for hello["engine"], `x.y` for x.y["k"]."""
    return ast.unparse(node)


def lookups(tree: ast.AST):
    """(line, expression, key) of each lookup of a trace key: x["k"], x.get("k"), "k" in x."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            yield node.lineno, node.value, node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args
              and isinstance(node.args[0], ast.Constant)):
            yield node.lineno, node.func.value, node.args[0].value
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and isinstance(node.ops[0], (ast.In, ast.NotIn))):
            yield node.lineno, node.comparators[0], node.left.value


def test_no_trace_is_read_by_its_json_keys_outside_formats_trace():
    found = []
    for path in sorted((REPO / "conformance").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name == "conformance/formats/trace.py":
            continue
        for line, value, key in lookups(ast.parse(path.read_text(encoding="utf-8"))):
            if key in TRACE_KEYS and _root(value) not in NOT_TRACES:
                found.append(f"{name}:{line} {_root(value)}[{key!r}]")
    assert not found, ("a trace read by its JSON key: use the Trace's attributes (trace.layers, "
                       "trace.failure, trace.scenario_name, trace.served(...)), or, for a dict that is "
                       "not a trace, name it in NOT_TRACES\n" + "\n".join(found))


def _last_name(node: ast.expr) -> str:
    """The last name an expression is read through: `hello` for session.start().hello,
    `loads` for json.loads(text), `kit_golden` for kit_golden(name)."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, (ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        else:
            return ast.unparse(node)


def test_no_test_or_benchmark_reads_a_trace_by_its_json_keys():
    allowed = set(NOT_TRACES) | set(TESTS_NOT_TRACES)
    found = []
    for root in ("tests", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            for line, value, key in lookups(ast.parse(path.read_text(encoding="utf-8"))):
                if key in TRACE_KEYS and _last_name(value) not in allowed:
                    found.append(f"{path.relative_to(REPO).as_posix()}:{line} {_root(value)}[{key!r}]")
    assert not found, ("a trace read by its JSON key: use the Trace's attributes (trace.layers, "
                       "trace.failure.kind, trace.failure is None, trace.scenario_name); a trace edited as "
                       "JSON is read with .to_json() or json.loads and named `edited`; another dict is "
                       "named in TESTS_NOT_TRACES\n" + "\n".join(found))


def test_the_check_finds_a_trace_read_by_its_keys():
    """The check itself: each form of lookup is found, and a listed name is not."""
    code = ('trace["layers"]\ngolden.get("digests")\n"failure" in part\ntraces[key]["engine"]\n'
            'hello["engine"]\nx.layers["steps"]')
    hits = [(ast.unparse(value), key) for _, value, key in lookups(ast.parse(code))
            if key in TRACE_KEYS and ast.unparse(value) not in NOT_TRACES]
    assert hits == [("trace", "layers"), ("golden", "digests"), ("part", "failure"), ("traces[key]", "engine")]
    # in the tests, by the last name: a session's hello and a file read as JSON are not traces
    code += '\nsession.start().hello["engine"]\njson.loads(text)["layers"]\nGOLDENS.load(n, r)["layers"]'
    allowed = set(NOT_TRACES) | set(TESTS_NOT_TRACES)
    hits = [(ast.unparse(value), key) for _, value, key in lookups(ast.parse(code))
            if key in TRACE_KEYS and _last_name(value) not in allowed]
    assert hits == [("trace", "layers"), ("golden", "digests"), ("part", "failure"), ("traces[key]", "engine"),
                    ("GOLDENS.load(n, r)", "layers")]


def test_every_part_of_a_trace_has_its_join_rule():
    """gate/run.py assemble joins a unit's parts with Trace.joined: every field has its rule, so
    none is dropped (the production digests once were, when the keys were listed by hand)."""
    from dataclasses import fields

    from conformance.formats.trace import JOIN, Trace

    assert set(JOIN) == {f.name for f in fields(Trace)}
