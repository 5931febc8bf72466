"""What test files share: the checkout's paths, the gate configuration, the TEST DOUBLE engines'
command lines, a gate run in this process or in a process of its own, and the waits on engine
processes. A plain module (conftest.py keeps only pytest's hooks and fixtures), imported as
`from tests.helpers import REPO, ...`."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GATE = REPO / "scenarios" / "dflash_27b_gate.json"
DOUBLE = REPO / "tests" / "doubles" / "double_engine.py"
HOSTILE = REPO / "tests" / "doubles" / "hostile_engine.py"
CANDIDATE_PINS = "candidate pins"  # the xdist group of the tests driving a pin other than the oracle
# The release the C++ reference engine implements (engines/cpp/reference_engine.cpp): its records
# are judged against that release's goldens, whichever pin is the gate oracle.
KIT_RELEASE = "0.27.1"
# The pages the docs are: their links are followed (tests/house/test_links.py), their command lines run
# (tests/house/test_doc_commands.py, all but docs/results/)
DOC_PAGES = [REPO / "README.md", REPO / "scenarios" / "README.md", REPO / "engines" / "PROTOCOL.md",
             *sorted((REPO / "docs").rglob("*.md"))]


def gate_engine(text: str, role: str):
    """An engine of a gate run with its role, as `parity gate` makes one (NAME=COMMAND names it)."""
    from conformance.formats.engine_ref import EngineRef
    from conformance.formats.pins import load_pins

    return EngineRef.parse(text, load_pins(), named=True).with_role(role)


def records_of(session, scenario, layers=None) -> dict:
    """The records of a unit that must run to its end on `session` (its failure said otherwise)."""
    trace = session.trace(scenario, layers)
    assert trace.failure is None, trace.failure
    return trace.layers


# -- the TEST DOUBLE engines' command lines ---------------------------------------------------

def double_command(*options: str) -> str:
    """The TEST DOUBLE engine (tests/doubles/double_engine.py) with `options`, as one command line."""
    return shlex.join([sys.executable, str(DOUBLE), *options])


def double_spec(*options: str):
    """The TEST DOUBLE engine with `options`, as an EngineSpec named `double`."""
    from conformance.process.launch import EngineSpec

    return EngineSpec("double", (sys.executable, str(DOUBLE), *options))


def hostile_double(folder: Path, name: str, plan: dict) -> str:
    """The hostile TEST DOUBLE's command line (tests/doubles/hostile_engine.py), its `plan` (that
    module's doc) written to FOLDER/plan-NAME.json."""
    path = folder / f"plan-{name}.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return shlex.join([sys.executable, str(HOSTILE), "--plan", str(path)])


# -- a gate run ---------------------------------------------------------------------------------

def double_gate_engines(*candidate_options: str):
    """A gate's engines: the TEST DOUBLE as oracle (3 steps) and as candidate with `candidate_options`."""
    return [gate_engine(double_command("--steps", "3"), "oracle"),
            gate_engine("TEST-DOUBLE-candidate=" + double_command(*candidate_options), "candidate")]


def run_gate(engines, reports: Path | None, scenarios=(GATE,), shard=None, results=None, said=None):
    """A gate of `engines` in this process on the config layer; (its status, what it said)."""
    from conformance.formats.pins import load_pins
    from conformance.formats.scenario import load_scenario
    from conformance.gate import run as gate_run
    from conformance.gate.context import RunContext

    lines = said if said is not None else []
    context = RunContext(load_pins(), log=lines.append, out=lines.append, reports=reports, shard=shard,
                         results=results, layers=["config"])
    status = gate_run.gate(context, [load_scenario(s) for s in scenarios], engines)
    return status, "\n".join(lines)


# `parity` in a process of its own, the gate's oracle and candidate the engine texts given
# (NAME=COMMAND names one): argv REPO ORACLE CANDIDATE PARITY-ARGUMENTS...
GATE_DRIVER = """
import sys
sys.path[:0] = [sys.argv[1]]
from conformance import cli
from conformance.formats.engine_ref import EngineRef
from conformance.gate import plan
oracle, candidate = sys.argv[2], sys.argv[3]
plan.gate_engines = lambda pins, candidates, log, stand_ins=None: [
    EngineRef.parse(oracle, pins, named=True).with_role("oracle"),
    EngineRef.parse(candidate, pins, named=True).with_role("candidate")]
sys.exit(cli.main(sys.argv[4:]))
"""


def gate_driver(oracle: str, candidate: str, *argv: str) -> list[str]:
    """The command line of GATE_DRIVER running `parity ARGV` with these two engines."""
    return [sys.executable, "-c", GATE_DRIVER, str(REPO), oracle, candidate, *argv]


# -- engine processes: alive, their pids, ended, and a bound on a call that could hang ----------

def alive(pid: int) -> bool:
    """A zombie counts as ended: only its parent's reaping is left."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def read_pids(pidfile: Path, seconds: float = 10) -> list[int]:
    """The pids a TEST DOUBLE wrote to `pidfile` (--pidfile), once it has written them all."""
    deadline = time.monotonic() + seconds
    while not (pidfile.exists() and pidfile.read_text(encoding="utf-8").endswith("\n")):
        assert time.monotonic() < deadline, f"the double never wrote {pidfile}"
        time.sleep(0.02)
    return [int(p) for p in pidfile.read_text(encoding="utf-8").split()]


def still_running(pids: list[int], seconds: float) -> list[int]:
    """The pids still running after up to `seconds` (a bound, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def assert_ended(pids: list[int], grace: float = 2.0) -> None:
    left = still_running(pids, grace)
    assert not left, f"processes outlived the engine's failure: {left}"


def bounded(fn, seconds: float, cleanup_pids=lambda: []):
    """fn() in a thread; fail (and kill what it left) if it takes longer than `seconds`, so a
    regression into a hang fails this test instead of hanging the suite. (fn's value, its time)."""
    import pytest

    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for pid in cleanup_pids():
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        pytest.fail(f"still running after {seconds} s: the harness hung")
    if "error" in result:
        raise result["error"]
    return result["value"], time.monotonic() - start


def trace_of(data):
    """A Trace (conformance/formats/trace.py) from a test's JSON of one, a dict or a Trace read
    as one, the parts it leaves out empty: tests edit a trace as JSON, the harness takes the type."""
    from conformance.formats.trace import Failure, Trace

    data = data.to_json() if isinstance(data, Trace) else dict(data)
    failure = data.get("failure")
    lists = {k: tuple(data[k]) for k in ("not_served", "capabilities", "features", "unsupported_features")
             if k in data}
    return Trace(engine=data.get("engine", {}), scenario=data.get("scenario", {}),
                 provenance=data.get("provenance", {}), layers=data.get("layers", {}), digests=data.get("digests"),
                 failure=None if failure is None else Failure(failure["kind"], failure.get("message", "")), **lists)


def json_values(alphabet: str):
    """A hypothesis strategy of JSON values (strings over `alphabet`, keys over JSON's own
    punctuation), for the tests that read a line two ways and expect one answer."""
    from hypothesis import strategies as st

    return st.recursive(
        st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
        | st.floats(allow_nan=False, allow_infinity=False) | st.text(alphabet=alphabet),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(
            st.text(alphabet="ab[]{}\"\\", max_size=3), children, max_size=4),
        max_leaves=30)
