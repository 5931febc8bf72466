"""Fuzzing the harness's three readers of untrusted input, with a bounded budget:

(a) the scenario loader: arbitrary JSON and mutations of the real scenario files must end in a
    Scenario that really satisfies the schema, or a ScenarioError naming the file: never any
    other exception, never a silent pass of a bad field;
(b) the protocol decoder: arbitrary bytes and JSON objects give a ProtocolError or a message
    the harness can carry into a trace (valid fields, finite numbers, encodable text);
(c) the engine reader end to end: a scripted TEST DOUBLE engine (tests/doubles/scripted_engine.py)
    prints hypothesis-chosen lines after a valid hello; EngineProcess.run returns exactly what a
    reference reading of the protocol says, or fails with that EngineFailure kind, and leaves
    no process behind.

A known bug would be pinned by a strict-xfail test in tests/process/test_faults.py and tolerated by
the fuzzers only through KNOWN_BUGS below (empty: every bug found so far is fixed).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conformance.formats import protocol
from conformance.formats.method_matrix import K_MAX, K_MIN, ROW_SPEC_KEYS
from conformance.formats.scenario import (ENGINE_ARGS, MAX_TOKENS_LIMIT, METHODS, METHODS_WITH_DRAFT_MODEL,
                                          SCHEMA, SIZE_FIELDS, SPECULATIVE_CONFIG, TOP_LEVEL, Scenario,
                                          ScenarioError, load_scenario)
from conformance.formats.trace import dumps
from conformance.formats.workload import expected_output, request_prompts
from conformance.process.client import EngineFailure, EngineProcess
from conformance.process.launch import EngineSpec
from tests.helpers import GATE, REPO, alive

SCENARIOS = sorted((REPO / "scenarios").glob("*.json"))
BASES = {p.name: json.loads(p.read_text()) for p in SCENARIOS}
SCRIPTED = REPO / "tests" / "doubles" / "scripted_engine.py"
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# The reference rules an accepted scenario must satisfy (from scenarios/README.md's schema table and
# conformance/formats/workload.py's docstring), written here independently of the loader.
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")          # fullmatch: no trailing newline
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
ROW_NAME = re.compile(r"[a-z0-9-]{1,32}")
MATRIX_ROW = re.compile(r"[A-Z][A-Z0-9-]{1,40}")  # an engine-matrix row, e.g. ENG-SCHED-CORE
OPTIONAL_INT_RANGES = {  # optional integers outside SIZE_FIELDS: the "absurd size" rule
    "seed": (0, (1 << 63) - 1), "long_prefill_token_threshold": (0, MAX_TOKENS_LIMIT),
    "prompt_lookup_max": (1, MAX_TOKENS_LIMIT), "prompt_lookup_min": (1, MAX_TOKENS_LIMIT),
}

# Bugs the fuzzers once found are fixed; none is tolerated now. A new one goes here, named
# after the strict-xfail test in tests/process/test_faults.py that pins it, until it is fixed.
KNOWN_BUGS: dict = {}
KNOWN_ACCEPTED: dict = {}  # violations (see schema_violations) a known bug lets through


def known_bug(exc: BaseException, text: str) -> str | None:
    return next((name for name, match in KNOWN_BUGS.items() if match(exc, text)), None)


# ---------------------------------------------------------------------------------------------
# (a) the scenario loader
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scenario_dir(tmp_path_factory):
    """A temporary folder holding a copy of scenarios/models, where fuzzed files are written."""
    folder = tmp_path_factory.mktemp("fuzz-scenarios")
    shutil.copytree(REPO / "scenarios" / "models", folder / "models")
    return folder


SPECIAL_STRINGS = [
    "", "../", "../../../../etc/passwd", "models/../models/qwen3-27b", "models/qwen3-27b/",
    "/", "/etc", "models/qwen3-27b\x00", "a\x00b", "x" * 300, "x/" * 2100, "abc\n", "dflash\n",
    "r0\n", "Qwen/Qwen3-32B", "dummy", "dflash", "mtp", "ngram", "\u00e9t\u00e9", "\ud800",
    "models/qwen3-27b/config.json", "models", "NaN",
]
SPECIAL_NUMBERS = [
    0, 1, -1, 2, 16, 4096, MAX_TOKENS_LIMIT, MAX_TOKENS_LIMIT + 1, 2**31, 2**63, 2**64, -(2**63),
    10**30, 10**300, 1.5, -0.0, 1e308, 4096.0,
]


def json_values(max_leaves: int = 8):
    leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
            | st.sampled_from(SPECIAL_STRINGS) | st.sampled_from(SPECIAL_NUMBERS))
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=max_leaves)


NEST = re.compile(r'"@@nest(\d+)@@"')  # placeholder, replaced by raw nested text after dumps


def nested_text(depth: int) -> str:
    return '[{"k":' * (depth // 2) + '"junk"' + "}]" * (depth // 2)


def _paths(value, prefix=()):
    """Every path (tuple of keys / indices) into a JSON value, containers included."""
    stack = [(value, prefix)]
    while stack:
        item, path = stack.pop()
        yield path
        if isinstance(item, dict):
            stack += [(v, path + (k,)) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(v, path + (i,)) for i, v in enumerate(item)]


# Keys some part of a scenario allows: adding one in the wrong place must still be refused.
KNOWN_KEYS = sorted(set(ENGINE_ARGS) | set(SPECULATIVE_CONFIG) | TOP_LEVEL | set(ROW_SPEC_KEYS)
                    | {"seed", "vocab_size", "max_steps", "requests", "id", "arrival_step", "prompt_len",
                       "max_tokens", "stop_token_ids", "acceptance", "ks", "rows", "name", "target",
                       "prefixes", "len", "prefix", "continues", "abort_step", "priority", "min_tokens",
                       "eos_token_id", "repetition_detection", "max_pattern_size", "min_pattern_size",
                       "min_count", "lora"})


@st.composite
def mutated_scenarios(draw) -> str:
    """The text of a real scenario file after a few structural mutations (or raw JSON junk)."""
    if draw(st.integers(0, 9)) == 0:
        return json.dumps(draw(json_values(20)))
    data = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        paths = list(_paths(data))
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["tweak", "tweak", "tweak", "set", "special", "drop", "add",
                                   "retype", "nest"]))
        new: object
        if op == "add" or not path:
            target = parent if not path else (parent[path[-1]] if isinstance(parent[path[-1]], dict) else None)
            if isinstance(target, dict):
                key = draw(st.sampled_from(KNOWN_KEYS) | st.text(max_size=8))
                target[key] = draw(json_values())
            continue
        key = path[-1]
        if op == "drop":
            del parent[key]
            continue
        old = parent[key]
        if op == "tweak":  # same type, other value: the likeliest way to slip past a check
            new = draw({bool: st.booleans(), int: st.sampled_from(SPECIAL_NUMBERS[:12]) | st.integers(-5, 2**21),
                        str: st.sampled_from(SPECIAL_STRINGS) | st.text(max_size=6),
                        float: st.floats(), type(None): st.none(),
                        list: st.lists(st.integers(-2, 70), max_size=3),
                        dict: st.just({})}[type(old)])
        elif op == "special":
            new = draw(st.sampled_from(SPECIAL_STRINGS + SPECIAL_NUMBERS + [True, False, None, [], {}]))
        elif op == "retype":
            new = {bool: lambda v: int(v), int: lambda v: str(v), str: lambda v: [v], float: int,
                   list: lambda v: {"0": v}, dict: lambda v: [v], type(None): lambda v: 0}[type(old)](old)
        elif op == "nest":
            new = f"@@nest{draw(st.sampled_from([3, 50, 300, 3000]))}@@"
        else:
            new = draw(json_values())
        parent[key] = new
    text = NEST.sub(lambda m: nested_text(int(m.group(1))), json.dumps(data, ensure_ascii=draw(st.booleans())))
    raw = draw(st.sampled_from(["none"] * 15 + ["truncate", "nan", "huge-float", "bom", "duplicate"]))
    if raw == "truncate":
        text = text[:draw(st.integers(0, max(0, len(text) - 1)))]
    elif raw == "nan":
        text = text.replace("16", "NaN", 1).replace("4096", "Infinity", 1)
    elif raw == "huge-float":
        text = text.replace("4096", "1e400", 1)
    elif raw == "bom":
        text = "\ufeff" + text
    elif raw == "duplicate" and text.startswith("{") and len(text) > 2:
        text = '{"schema": "x", ' + text[1:]
    return text


def stop_violations(where: str, req: dict, vocab_size: int, typed) -> list[str]:
    """What an accepted request's stops break: min_tokens 1..max_tokens (0 is left out), the eos
    a token of the vocabulary, repetition detection as vLLM's RepetitionDetectionParams checks it
    (switched off, max_pattern_size 0, is kept: vLLM still calls its check)."""
    bad = []
    if "min_tokens" in req and not (typed(req["min_tokens"], int) and 1 <= req["min_tokens"] <= req["max_tokens"]):
        bad.append(f"{where}.min_tokens {req['min_tokens']!r}")
    if "eos_token_id" in req and not (typed(req["eos_token_id"], int) and 0 <= req["eos_token_id"] < vocab_size):
        bad.append(f"{where}.eos_token_id {req['eos_token_id']!r}")
    rep = req.get("repetition_detection")
    if rep is not None:
        sizes = [rep.get(k) for k in ("max_pattern_size", "min_pattern_size", "min_count")]
        if not (isinstance(rep, dict) and len(rep) == 3 and all(typed(x, int) and 0 <= x <= 1024 for x in sizes)
                and 0 <= sizes[1] <= sizes[0] and (sizes[0] == 0 or sizes[2] >= 2)):
            bad.append(f"{where}.repetition_detection {rep!r}")
    return bad


def schema_violations(s: Scenario, raw: dict) -> list[str]:
    """What an accepted scenario breaks, checked independently of the loader's own code."""
    bad: list[str] = []

    def typed(value, typ) -> bool:
        return isinstance(value, typ) and not (typ is int and isinstance(value, bool))

    def model_ok(where: str, value) -> None:
        if not (isinstance(value, str) and Path(value).is_absolute()
                and (Path(value) / "config.json").is_file()):
            bad.append(f"{where} {value!r} is not an absolute folder with a config.json")

    if set(raw) - TOP_LEVEL:
        bad.append(f"unknown top-level keys {sorted(set(raw) - TOP_LEVEL)}")
    if raw.get("schema") != SCHEMA:
        bad.append(f"schema {raw.get('schema')!r}")
    if not (isinstance(s.name, str) and NAME.fullmatch(s.name)):
        bad.append(f"name {s.name!r}")
    if not isinstance(s.description, str):
        bad.append(f"description {s.description!r}")
    rows = getattr(s, "rows", ("ENG-SCHED-CORE",))
    if not (rows and all(isinstance(r, str) and MATRIX_ROW.fullmatch(r) for r in rows)):
        bad.append(f"rows {rows!r}")
    if not re.fullmatch(r"[0-9a-f]{64}", s.sha256):
        bad.append(f"sha256 {s.sha256!r}")
    args = s.engine_args
    for where, obj, schema in (("engine_args", args, ENGINE_ARGS),
                               ("engine_args.speculative_config", args.get("speculative_config"),
                                SPECULATIVE_CONFIG)):
        if obj is None:
            continue
        for key in set(obj) - set(schema):
            bad.append(f"{where}.{key} unknown key accepted")
        for key, (typ, required) in schema.items():
            if key not in obj:
                if required:
                    bad.append(f"{where}.{key} required but absent")
                continue
            if not typed(obj[key], typ):
                bad.append(f"{where}.{key} wrong type {obj[key]!r}")
            elif key in SIZE_FIELDS and not 1 <= obj[key] <= MAX_TOKENS_LIMIT:
                bad.append(f"{where}.{key} size out of range {obj[key]!r}")
            elif key in OPTIONAL_INT_RANGES:
                low, high = OPTIONAL_INT_RANGES[key]
                if not low <= obj[key] <= high:
                    bad.append(f"{where}.{key} out of range {obj[key]!r}")
    if args.get("load_format") != "dummy":
        bad.append(f"load_format {args.get('load_format')!r}")
    model_ok("engine_args.model", args.get("model"))
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        method = spec.get("method")
        if method not in METHODS:
            bad.append(f"speculative_config.method {method!r}")
        if "model" in spec:
            model_ok("engine_args.speculative_config.model", spec["model"])
        elif method in METHODS_WITH_DRAFT_MODEL and method != "mtp":
            bad.append(f"method {method!r} without a draft model")
    workload = s.workload
    if workload is not None:
        if not {"seed", "vocab_size", "max_steps", "requests"} <= set(workload) <= \
                {"seed", "vocab_size", "max_steps", "requests", "prefixes", "prefix_cache_resets"}:
            bad.append(f"workload keys {sorted(workload)}")
        steps = [r.get("step") for r in workload.get("prefix_cache_resets", [])]
        if any(not typed(n, int) or not 0 <= n < workload["max_steps"] for n in steps) or steps != sorted(set(steps)) \
                or any(not set(r) <= {"step", "reset_running_requests", "reset_connector"}
                       for r in workload.get("prefix_cache_resets", [])):
            bad.append(f"workload.prefix_cache_resets {workload['prefix_cache_resets']!r}")
        prefixes = {}
        for i, prefix in enumerate(workload.get("prefixes", [])):
            name, n = prefix.get("name"), prefix.get("len")
            if set(prefix) != {"name", "len"} or not (isinstance(name, str) and REQUEST_ID.fullmatch(name)) \
                    or name in prefixes or not typed(n, int) or not 1 <= n <= args["max_model_len"]:
                bad.append(f"workload.prefixes[{i}] {prefix!r}")
            prefixes[name] = n
        seen, length = set(), {}  # length: each request's whole prompt, shared part included
        for i, req in enumerate(workload.get("requests", [])):
            rid = req.get("id")
            if not (isinstance(rid, str) and REQUEST_ID.fullmatch(rid)) or rid in seen:
                bad.append(f"workload.requests[{i}].id {rid!r}")
            seen.add(rid)
            shared = "prefix" in req or "continues" in req
            for key in ("arrival_step", "prompt_len", "max_tokens"):
                if not typed(req.get(key), int) or req[key] < (0 if key == "arrival_step" or (
                        key == "prompt_len" and shared) else 1):
                    bad.append(f"workload.requests[{i}].{key} {req.get(key)!r}")
            base = 0
            if "prefix" in req and ("continues" in req or req["prefix"] not in prefixes):
                bad.append(f"workload.requests[{i}].prefix {req['prefix']!r}")
            elif "prefix" in req:
                base = prefixes[req["prefix"]]
            elif "continues" in req:
                earlier = next((r for r in workload["requests"][:i] if r["id"] == req["continues"]), None)
                if earlier is None or "abort_step" in earlier or "min_tokens" in earlier:
                    bad.append(f"workload.requests[{i}].continues {req['continues']!r}")
                else:  # the earlier turn's prompt and the stand-in's answer to it
                    base = length[earlier["id"]] + len(expected_output(
                        workload["seed"], request_prompts(workload, args["max_model_len"])[earlier["id"]],
                        earlier["max_tokens"], earlier.get("stop_token_ids", []), args["max_model_len"],
                        workload["vocab_size"], 0, earlier.get("eos_token_id"),
                        earlier.get("repetition_detection")))
            if "abort_step" in req and not (typed(req["abort_step"], int)
                                            and req["arrival_step"] <= req["abort_step"] < workload["max_steps"]):
                bad.append(f"workload.requests[{i}].abort_step {req['abort_step']!r}")
            if "priority" in req and not (typed(req["priority"], int) and -2 ** 31 <= req["priority"] < 2 ** 31):
                bad.append(f"workload.requests[{i}].priority {req['priority']!r}")
            bad += stop_violations(f"workload.requests[{i}]", req, workload["vocab_size"], typed)
            if all(typed(req.get(k), int) for k in ("prompt_len", "max_tokens")):
                length[rid] = base + req["prompt_len"]
                if length[rid] + req["max_tokens"] > args["max_model_len"]:
                    bad.append(f"workload.requests[{i}] longer than max_model_len")
    matrix = s.method_matrix
    if matrix is not None:
        ks = matrix.get("ks")
        if not (isinstance(ks, list) and ks and all(typed(k, int) and K_MIN <= k <= K_MAX for k in ks)
                and len(set(ks)) == len(ks)):
            bad.append(f"method_matrix.ks {ks!r}")
        for i, row in enumerate(matrix.get("rows", [])):
            if not (isinstance(row.get("name"), str) and ROW_NAME.fullmatch(row["name"])):
                bad.append(f"method_matrix.rows[{i}].name {row.get('name')!r}")
            spec = row.get("speculative_config", {})
            if set(spec) - set(ROW_SPEC_KEYS) or spec.get("method") not in METHODS:
                bad.append(f"method_matrix.rows[{i}].speculative_config {spec!r}")
            for key, typ in ROW_SPEC_KEYS.items():
                if key in spec and not typed(spec[key], typ):
                    bad.append(f"method_matrix.rows[{i}].speculative_config.{key} {spec[key]!r}")
            if "model" in spec:
                model_ok(f"method_matrix.rows[{i}].speculative_config.model", spec["model"])
            if "target" in row:
                model_ok(f"method_matrix.rows[{i}].target", row["target"])
    try:  # what an engine receives must be sendable as a protocol message
        protocol.encode({"type": "run", "id": "r", "scenario": s.to_wire(), "layers": s.layers})
    except (ValueError, TypeError) as exc:
        bad.append(f"to_wire() cannot be sent: {exc}")
    return bad


def check_loader(folder: Path, text: str) -> None:
    path = folder / "scenario.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        assert str(path) in str(exc), f"the error does not name the file: {exc}"
        # The field is named (an unknown key is named as itself, even the empty key "").
        assert isinstance(exc.field, str) and (exc.field or "unknown key" in exc.problem), exc
        event("refused: " + exc.field.split(".")[0].split("[")[0])
        return
    except Exception as exc:  # noqa: BLE001 - the property under test: nothing else escapes
        bug = known_bug(exc, text)
        if bug:
            event(f"known bug ({bug})")
            return
        raise AssertionError(f"load_scenario raised {type(exc).__name__} (not ScenarioError): {exc!r:.300}") from exc
    raw = json.loads(text.lstrip("\ufeff"))
    bad = []
    for violation in schema_violations(scenario, raw):
        bug = next((name for name, rx in KNOWN_ACCEPTED.items() if rx.search(violation)), None)
        if bug:
            event(f"known bug ({bug})")
        else:
            bad.append(violation)
    assert not bad, f"accepted a scenario that breaks the schema: {bad}"
    assert load_scenario(path) == scenario, "loading the same file twice differs"
    event("accepted")


@FUZZ
@given(text=mutated_scenarios())
def test_fuzz_scenario_loader(scenario_dir, text):
    check_loader(scenario_dir, text)


@settings(max_examples=60, deadline=None)
@given(value=json_values(30))
def test_fuzz_scenario_loader_arbitrary_json(scenario_dir, value):
    check_loader(scenario_dir, json.dumps(value))


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=200))
def test_fuzz_scenario_loader_arbitrary_bytes(scenario_dir, data):
    path = scenario_dir / "bytes.json"
    path.write_bytes(data)
    try:
        load_scenario(path)
    except ScenarioError as exc:
        assert str(path) in str(exc)


def test_every_real_scenario_passes_the_reference_schema():
    for path in SCENARIOS:
        assert schema_violations(load_scenario(path), json.loads(path.read_text())) == [], path


def test_reference_schema_catches_a_bad_field(scenario_dir):
    """The independent schema check is not vacuous: it flags what it is meant to flag."""
    s = load_scenario(GATE)
    raw = json.loads(GATE.read_text())
    broken = dataclasses.replace(s, name=s.name + "\n", engine_args=dict(s.engine_args, max_num_seqs=True, extra=1))
    bad = schema_violations(broken, raw)
    assert any(v.startswith("name ") for v in bad)
    assert any("max_num_seqs wrong type" in v for v in bad)
    assert any("extra unknown key" in v for v in bad)



def test_reference_schema_catches_bad_stops():
    """The reference's stop rules flag what the loader must refuse."""
    path = REPO / "scenarios" / "stop_repetition.json"
    s, raw = load_scenario(path), json.loads(path.read_text())
    reqs = [dict(r) for r in s.workload["requests"]]
    reqs[0]["min_tokens"] = reqs[0]["max_tokens"] + 1
    reqs[1]["eos_token_id"] = s.workload["vocab_size"]
    reqs[2]["repetition_detection"] = {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}
    reqs[3]["repetition_detection"] = {"max_pattern_size": 2, "min_pattern_size": 0, "min_count": 1}
    bad = schema_violations(dataclasses.replace(s, workload=dict(s.workload, requests=reqs)), raw)
    assert [v.split(" ")[0] for v in bad] == ["workload.requests[0].min_tokens", "workload.requests[1].eos_token_id",
                                              "workload.requests[2].repetition_detection",
                                              "workload.requests[3].repetition_detection"], bad


# ---------------------------------------------------------------------------------------------
# (b) the protocol decoder
# ---------------------------------------------------------------------------------------------

def _depth(value, level: int = 1) -> int:
    stack, deepest = [(value, level)], level
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(item, dict):
            stack += [(v, d + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, d + 1) for v in item]
    return deepest


def _field_values(types):
    good = {int: st.integers(-3, 10**20), str: st.text(max_size=10), list: st.lists(st.text(max_size=5), max_size=3),
            dict: st.dictionaries(st.text(max_size=5), json_values(), max_size=4), type(None): st.none()}
    return st.one_of(*(good[t] for t in types)) | json_values()


@st.composite
def messages(draw) -> dict:
    kind = draw(st.sampled_from(sorted(protocol.MESSAGES) + ["bogus", ""]) | json_values(3))
    message = {"type": kind} if draw(st.integers(0, 20)) else {}
    fields = protocol.MESSAGES.get(kind, {}) if isinstance(kind, str) else {}
    for name, types in fields.items():
        if draw(st.integers(0, 6)):
            message[name] = draw(_field_values(types))
    if draw(st.booleans()):
        message.update(draw(st.dictionaries(st.text(max_size=6), json_values(), max_size=2)))
    return message


RAW_LINES = [
    b"", b"\n", b"{}", b"null", b"[]", b'"type"', b"\xff\xfe{}", b"\x00", b'{"type": []}',
    b'{"type": {"record": 1}}', b'{"type": 1}', b'\xef\xbb\xbf{"type": "shutdown"}',
    '{"type": "shutdown"}'.encode("utf-16"),
    b'{"type":"record","id":"r","layer":"config","seq":0,"data":{"x":1e400}}',
    b'{"type":"record","id":"r","layer":"config","seq":0,"data":{"x":-1e999}}',
    b'{"type":"record","id":"r","layer":"config","seq":0,"data":{"x":NaN}}',
    b'{"type":"record","id":"r","layer":"config","seq":0,"data":{"x":"\\ud800"}}',
    b'{"type":"record","id":"r","layer":"config","seq":0,"data":{"\\udfff":1}}',
    b'{"type":"error","id":"\\ud83d","kind":"internal","message":"m"}',
    b'{"type":"record","id":"r","layer":"config","seq":0,"data":' + b'{"a":' * 400 + b"1" + b"}" * 401,
    b'{"type":"record","id":"r","layer":"config","seq":0,"data":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}",
    b"[" * 100000,
    b'{"type":"done","id":"r","records":' + b"9" * 5000 + b"}",
    b'{"type":"done","id":"r","records":1.0}',
    b'{"type":"done","id":"r","records":true}',
    b'{"type":"hello","protocol":1,"engine":"e","version":"v","capabilities":[]}\r',
]


def check_decoded(line: bytes, expect) -> None:
    try:
        message = protocol.decode(line, expect)
    except protocol.ProtocolError as exc:
        assert str(exc).startswith("expected"), f"a ProtocolError must say what was expected: {exc}"
        return
    # No other exception escaped; what was accepted is a valid message the harness can carry.
    assert isinstance(message, dict) and message["type"] in protocol.MESSAGES
    if expect is not None:
        assert message["type"] in expect
    for name, types in protocol.MESSAGES[message["type"]].items():
        value = message[name]
        assert isinstance(value, types) and not (int in types and isinstance(value, bool)), (name, value)
    assert _depth(message) <= protocol.MAX_DEPTH
    assert protocol.decode(protocol.encode(message), expect) == message  # finite numbers only
    text = dumps({"message": message})  # a trace holding it is written as UTF-8 text
    text.encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(line=st.binary(max_size=300) | st.sampled_from(RAW_LINES),
       expect=st.none() | st.sampled_from([("hello",), ("record", "done", "error"), ("run", "shutdown")]))
def test_fuzz_decode_bytes(line, expect):
    check_decoded(line, expect)


@settings(max_examples=300, deadline=None)
@given(message=messages(), ascii_only=st.booleans(),
       expect=st.none() | st.sampled_from([("hello", "error"), ("record", "done", "error")]))
def test_fuzz_decode_messages(message, ascii_only, expect):
    line = json.dumps(message, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    check_decoded(line, expect)


@pytest.mark.parametrize("line", RAW_LINES, ids=range(len(RAW_LINES)))
def test_decode_raw_lines(line):
    check_decoded(line, None)


# ---------------------------------------------------------------------------------------------
# (c) the engine reader, end to end with a real (scripted) process
# ---------------------------------------------------------------------------------------------

RUN_ID = "run-1"  # the id EngineProcess gives its first run


def small_dicts():
    return st.dictionaries(st.text(max_size=6), json_values(6), max_size=3)


def junk_lines():
    def no_newline(b: bytes) -> bytes:
        return b.replace(b"\n", b" ")

    return st.one_of(
        st.binary(max_size=60).map(no_newline),
        json_values(8).map(lambda v: json.dumps(v).encode()),
        messages().map(lambda m: json.dumps(m).encode("utf-8", "surrogatepass")),
        st.sampled_from([l for l in RAW_LINES if b"\n" not in l and len(l) < 20000]),
        st.builds(lambda i, layer, seq: json.dumps({"type": "record", "id": i, "layer": layer, "seq": seq,
                                                    "data": {}}).encode(),
                  st.sampled_from([RUN_ID, "run-2", None, 1]), st.sampled_from(["config", "steps", "methods", ""]),
                  st.integers(-1, 3)),
        st.sampled_from([json.dumps({"type": "hello", "protocol": 1, "engine": "e", "version": "v",
                                     "capabilities": []}).encode(),
                         json.dumps({"type": "shutdown"}).encode(),
                         json.dumps({"type": "error", "id": None, "kind": "bad_request", "message": "?"}).encode()]),
    )


@st.composite
def scripts(draw):
    layers = draw(st.sampled_from([["config"], ["config", "steps"], ["steps"]]))
    lines, seqs = [], {layer: 0 for layer in layers}
    for _ in range(draw(st.integers(0, 4))):
        layer = draw(st.sampled_from(layers))
        lines.append(json.dumps({"type": "record", "id": RUN_ID, "layer": layer, "seq": seqs[layer],
                                 "data": draw(small_dicts())}).encode())
        seqs[layer] += 1
    end = draw(st.sampled_from(["done", "done", "error", "none"]))
    if end == "done":
        count = sum(seqs.values()) + draw(st.sampled_from([0, 0, 0, 1, -1]))
        lines.append(json.dumps({"type": "done", "id": RUN_ID, "records": count}).encode())
    elif end == "error":
        lines.append(json.dumps({"type": "error", "id": draw(st.sampled_from([RUN_ID, RUN_ID, None])),
                                 "kind": draw(st.sampled_from(protocol.ERROR_KINDS)),
                                 "message": draw(st.text(max_size=20))}).encode("utf-8", "surrogatepass"))
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["replace", "insert", "swap", "drop"]))
        if op == "insert" or not lines:
            lines.insert(draw(st.integers(0, len(lines))), draw(junk_lines()))
        elif op == "replace":
            lines[draw(st.integers(0, len(lines) - 1))] = draw(junk_lines())
        elif op == "swap":
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            del lines[draw(st.integers(0, len(lines) - 1))]
    exit_mode = draw(st.sampled_from(["exit", "exit", "silent"]))
    status = draw(st.sampled_from([0, 1, 3, 70]))
    return layers, lines, exit_mode, status


def reference_outcome(layers: list[str], lines: list[bytes], exit_mode: str):
    """What the protocol says must happen: (kind or None, records so far)."""
    records: dict[str, list] = {layer: [] for layer in layers}
    for line in lines:
        try:
            message = protocol.decode(line + b"\n", ("record", "done", "error"))
        except protocol.ProtocolError:
            return "protocol", records
        if message["id"] != RUN_ID:
            return "protocol", records
        if message["type"] == "error":
            return ("unsupported" if message["kind"] == "unsupported" else "engine_error"), records
        if message["type"] == "done":
            ok = message["records"] == sum(len(v) for v in records.values())
            return (None if ok else "protocol"), records
        if message["layer"] not in records or message["seq"] != len(records[message["layer"]]):
            return "protocol", records
        records[message["layer"]].append(message["data"])
    return ("crash" if exit_mode == "exit" else "timeout"), records


@pytest.fixture(scope="module")
def script_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("scripted-engine")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts())
def test_fuzz_engine_reader(script_dir, script):
    layers, lines, exit_mode, status = script
    kind, partial = reference_outcome(layers, lines, exit_mode)
    event(f"expected: {kind or 'records'}")
    path = script_dir / "script.json"
    path.write_text(json.dumps({"lines": [line.hex() for line in lines], "end": exit_mode, "status": status}))
    scenario = load_scenario(GATE)
    # Only an expected hang waits out its timeout; everything else must end long before.
    timeout = 1.0 if kind == "timeout" else 30
    proc = EngineProcess(EngineSpec("scripted", (sys.executable, "-S", str(SCRIPTED), str(path))),
                         handshake_timeout=30)
    proc.start()
    pid = proc._proc.pid
    try:
        try:
            got = proc.run(scenario, layers, timeout=timeout)
        except EngineFailure as failure:
            assert failure.kind in ("protocol", "crash", "engine_error", "unsupported", "timeout"), failure.kind
            assert failure.kind == kind, f"expected {kind}, got {failure.kind}: {failure}"
            assert failure.partial == partial
            assert str(failure)
        else:
            assert kind is None, f"expected {kind}, got records {got!r:.200}"
            assert got == partial
    finally:
        proc.close()
    assert not alive(pid), "the scripted engine outlived its EngineProcess"
