"""Protocol self-check: run any engine through the protocol's rules and list what it breaks.

Checks: a valid hello with the supported protocol version (its `features`, when given, known
feature names); every scenario given run on the layers it has that the hello declares (every
declared layer on one scenario at least; a scenario needing a feature the hello does not declare
is left out, saying so), each
answered by ordered records (at least one per layer) and a `done` whose count matches; every
record what its layer declares in this protocol version (conformance/formats/record_schema.py, as the
gate judges it: a record of an older version is missing fields); a declared layer answered
with something other than refusals somewhere (a refused configuration's record checks nothing
of the layer); a garbage line answered by a bad_request error without dying; an unknown layer
answered by an unsupported error; the same scenario giving the same records twice (a warm
engine keeps no state between runs); shutdown honoured.
"""

from __future__ import annotations

from collections.abc import Callable

from conformance.formats.kinds import Kind
from conformance.formats import protocol
from conformance.formats.features import declared, not_declared
from conformance.formats.log import log
from conformance.formats.record_schema import LAYERS as DECLARED, check_layers
from conformance.formats.scenario import Scenario
from conformance.process.client import SHUTDOWN_GRACE, EngineFailure, EngineProcess
from conformance.process.launch import EngineSpec
from conformance.process.session import EngineSession

ANSWER_TIMEOUT = 30.0  # seconds an engine has to answer bad input


def exercise(declared: list, scenarios: list[Scenario], features: frozenset[str] | None = None,
             log=log, needs: Callable[[Scenario], tuple[str, ...]] | None = None) -> list[tuple[Scenario, list[str]]]:
    """Every scenario with the declared layers it has, in order (a scenario with none of them
    is left out, and so is one needing a feature not among `features`, the hello's, saying so).
    `needs`: a scenario's features as the gate decides them (the caller's: async scheduling left
    to vLLM's default is decided by the oracle's golden, which this floor does not read);
    default, what the scenario alone says."""
    plan = []
    for scenario in scenarios:
        lacking = not_declared(needs(scenario) if needs else scenario.features, features)
        if lacking:
            log(f"[selfcheck] {scenario.name}: left out, it needs {', '.join(lacking)}, "
                "which the hello does not declare (hello.features)")
            continue
        layers = [layer for layer in scenario.layers if layer in declared]
        if layers:
            plan.append((scenario, layers))
    return plan


def refusals_only(answers: list[tuple[Scenario, dict]]) -> list[str]:
    """The layers whose every record, over every scenario, was a refused configuration's: the
    engine refused every configuration they were asked on, so nothing of them was checked."""
    out = []
    for layer, spec in DECLARED.items():
        records = [r for _, records in answers for r in records.get(layer, [])]
        refused = [r for r in records if spec.shape(r) is not spec.record]
        if records and len(refused) == len(records) and any(key == "refused" for key, _ in spec.variants):
            names = [s.name for s, records in answers if records.get(layer)]
            out.append(f"the declared layer {layer} was answered only with refusals ({', '.join(names)}): "
                       "none of its records was checked; give a --scenario whose configuration the "
                       "engine accepts")
    return out


def selfcheck(spec: EngineSpec, scenarios: list[Scenario], log=log,
              needs: Callable[[Scenario], tuple[str, ...]] | None = None) -> list[str]:
    """The protocol's rules an engine breaks (the module docstring); `needs` as in `exercise`."""
    problems: list[str] = []
    session = EngineSession(spec)
    try:
        hello = session.start().hello
    except EngineFailure as exc:
        return [f"handshake: {exc}"]
    caps = hello.get("capabilities")
    if not all(isinstance(c, str) for c in caps):
        problems.append(f"hello.capabilities must be strings, got {caps!r}")
    if not any(layer in caps for layer in protocol.LAYERS):
        problems.append(f"hello.capabilities names no known layer {list(protocol.LAYERS)}: {caps!r}")
    features = declared(hello)
    log(f"[selfcheck] {spec.label}: features "
        + (", ".join(sorted(features)) or "none" if features is not None else "every one (hello.features absent)"))
    plan = exercise(caps, scenarios, features, log, needs) or [(scenarios[0], ["config"])]
    covered = {layer for _, layers in plan for layer in layers}
    unexercised = [layer for layer in protocol.LAYERS if layer in caps and layer not in covered]
    if unexercised:
        problems.append(f"no scenario given has the declared layer(s) {unexercised}: give one with --scenario")
    log(f"[selfcheck] {spec.label}: {hello['engine']} {hello['version']}, layers {sorted(covered, key=protocol.LAYERS.index)}")
    answers = []
    for scenario, layers in plan:
        log(f"[selfcheck] {scenario.name}: layers {layers}")
        trace = session.trace(scenario, layers, repeat=2)  # the same scenario twice
        failure = trace.failure
        if failure is not None and failure.kind != Kind.NONDETERMINISTIC:
            session.close()
            return problems + [f"run of {scenario.name} ({', '.join(layers)}): {failure.message}"]
        first = trace.layers
        answers.append((scenario, first))
        if failure is not None:
            problems.append(f"{scenario.name}: the same scenario run twice gave different records "
                            "(state kept between runs?)")
        problems += [f"{scenario.name}: the declared layer {layer} was asked for and sent no record"
                     for layer in layers if not first.get(layer)]
        _, wrong = check_layers(first)
        if wrong is not None:
            problems.append(f"{scenario.name}: a record that is not what protocol "
                            f"{protocol.PROTOCOL_VERSION} declares (engines/PROTOCOL.md): {wrong}")
    problems += refusals_only(answers)
    return problems + _bad_input(session, *plan[0])


def _bad_input(session: EngineSession, scenario: Scenario, layers: list[str]) -> list[str]:
    """The rules on bad input: a garbage line and an unknown layer each answered by an error,
    then the scenario run again and a clean shutdown."""
    proc = session.start()
    problems = _expect_error(proc, b"this is not json\n", None, "bad_request", "a garbage line")
    if not proc.alive:
        return problems
    run_id = "selfcheck-unknown-layer"
    line = protocol.encode({"type": "run", "id": run_id, "scenario": scenario.to_wire(), "layers": ["no-such-layer"]})
    problems += _expect_error(proc, line, run_id, Kind.UNSUPPORTED, "an unknown layer")
    if not proc.alive:  # it broke the protocol answering bad input, and was ended
        return problems
    failure = session.trace(scenario, layers).failure
    if failure is not None:
        session.close()
        return problems + [f"the engine did not survive bad input: {failure.message}"]
    if not session.close():
        problems.append(f"shutdown: the engine was still running {SHUTDOWN_GRACE:.0f} s after shutdown")
    return problems


def _expect_error(proc: EngineProcess, line: bytes, run_id, kind: str, what: str) -> list[str]:
    """`line` sent as it is; the engine must answer with an error of `kind` for `run_id`."""
    try:
        proc.send_line(line, what)
        message = proc.answer(("error",), f"the answer to {what}", ANSWER_TIMEOUT)
    except EngineFailure as exc:
        return [f"{what}: expected an error message, got: {exc}"]
    problems = []
    if message["id"] != run_id:
        problems.append(f"{what}: expected error id {run_id!r}, got {message['id']!r}")
    if message["kind"] != kind:
        problems.append(f"{what}: expected error kind {kind!r}, got {message['kind']!r}")
    return problems
