"""Traces: what one engine did on one scenario (a golden is an oracle's trace). A trace is
parsed once where it enters (an engine's run, make_trace; a file, load_trace) and passed as a
`Trace`; its JSON is the file format.

Schema (version 1):
  schema      "vllm-parity/trace/1"
  engine      {label, name, version, protocol}   from the handshake (capabilities are not
              recorded: serving a new layer must not change an existing golden)
  scenario    {name, sha256}
  provenance  {harness, environment}   environment is what the engine reported (python/torch/vllm)
  layers      {layer name: [record, ...]}   records in the order the engine sent them
  digests     present only for a production-scale scenario: {layer name: its digest form}
              (conformance/formats/digest.py) for `steps` and `outputs`, which are then not in
              `layers`
  failure     present only when the run did not finish: {kind, message}; layers then hold
              the partial records, kept for debugging
  not_served  present only when the engine was not asked for some of the scenario's layers
              because its `hello` does not declare them (a candidate under the gate): those
              layers, which the gate reports as not judged. Never in a golden.
  capabilities  with not_served's asking: the layers the engine's hello declared
  features    with not_served's asking, when the hello lists them: the features it declared
              (how it is judged: vllm_log_lines)
  unsupported_features  present only when the run was not sent because the scenario needs
              features the engine's hello does not declare (hello.features): those features, in
              formats/features.py's order; layers then empty. Never in a golden.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from conformance import __version__
from conformance.formats.kinds import Kind
from conformance.formats.errors import InputError
from conformance.formats.files import InputFileError, read_text
from conformance.formats.digest import LAYERS as DIGEST_LAYERS, DigestSink, check_form
from conformance.formats.protocol import PROTOCOL_VERSION, loads
from conformance.formats.record_schema import check_layers

SCHEMA = "vllm-parity/trace/1"


class TraceError(InputError):
    """A trace or golden file is missing, truncated, not JSON or of another schema."""


@dataclass(frozen=True)
class Failure:
    """Why a run did not finish: its kind (formats/kinds.py) and the engine's or harness's words."""

    kind: str
    message: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class Trace:
    """One trace (the module's schema). The optional parts are None where the file has no such
    key. `extra`: top-level keys the schema does not name, kept so that the file reads back
    whole and a golden carrying one is refused (judging/provenance.py).

    It is read by its attributes only, never by its JSON's keys (tests/house/test_house_trace.py):
    to_json() is its JSON."""

    engine: dict
    scenario: dict
    provenance: dict
    layers: dict
    digests: dict | None = None
    failure: Failure | None = None
    not_served: tuple[str, ...] | None = None
    capabilities: tuple[str, ...] | None = None
    features: tuple[str, ...] | None = None
    unsupported_features: tuple[str, ...] | None = None
    extra: dict | None = None

    # -- what is read of it
    @property
    def label(self) -> str:
        return self.engine["label"]

    @property
    def scenario_name(self) -> str:
        return self.scenario["name"]

    @property
    def sha256(self) -> str:
        return self.scenario["sha256"]

    @property
    def environment(self) -> dict:
        return self.provenance.get("environment", {})

    @property
    def forms(self) -> dict:
        """The digest forms ({} for a trace without any)."""
        return self.digests or {}

    @property
    def sent(self) -> bool:
        """Whether the run was sent: not refused whole for features the engine does not declare."""
        return not self.unsupported_features

    def served(self, layers) -> list[str]:
        """`layers` but those the engine was not asked for (its hello does not declare them)."""
        skipped = self.not_served or ()
        return [layer for layer in layers if layer not in skipped]

    def only(self, layers) -> Trace:
        """The trace restricted to `layers` (all of it with None)."""
        if layers is None:
            return self
        return replace(self, layers={k: v for k, v in self.layers.items() if k in layers},
                       digests=None if self.digests is None else
                       {k: v for k, v in self.digests.items() if k in layers})

    def with_label(self, label: str) -> Trace:
        return replace(self, engine=dict(self.engine, label=label))

    # -- its JSON
    def to_json(self) -> dict:
        out = dict(self.extra or {})
        out.update(schema=SCHEMA, engine=self.engine, scenario=self.scenario, provenance=self.provenance,
                   layers=self.layers)
        if self.digests is not None:
            out["digests"] = self.digests
        if self.failure is not None:
            out["failure"] = self.failure.to_json()
        for name in ("not_served", "capabilities", "features", "unsupported_features"):
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value)
        return out

    @classmethod
    def from_json(cls, data: dict, path) -> Trace:
        """A trace from its parsed JSON, checked (the module's schema); TraceError naming `path`."""
        return _from_json(data, path)

    @classmethod
    def joined(cls, parts: list[Trace], label: str) -> Trace:
        """One trace made of several runs of one engine on one scenario (a gate's units, each of
        some of its layers), labelled `label`. Every part of the type has its rule (JOIN): a
        part added to Trace without one fails at import, so none is dropped."""
        base = next((p for p in parts if p.engine.get("name")), parts[0])
        joined = cls(**{name: rule(base, parts) for name, rule in JOIN.items()})
        return joined.with_label(label)

    __hash__ = None  # a trace holds lists: compared, never hashed


def _merged(name: str):
    """The parts' dicts of `name` in one (None where no part has any)."""
    def rule(_base, parts):
        held = [getattr(p, name) for p in parts if getattr(p, name)]
        return {k: v for d in held for k, v in d.items()} if held else None
    return rule


def _concatenated(name: str):
    def rule(_base, parts):
        held = [x for p in parts for x in getattr(p, name) or ()]
        return tuple(held) if held else None
    return rule


def _last(name: str, present=lambda value: value is not None):
    def rule(_base, parts):
        return next((getattr(p, name) for p in reversed(parts) if present(getattr(p, name))), None)
    return rule


JOIN = {
    "engine": lambda base, _parts: dict(base.engine),  # the part whose engine said its name
    "scenario": lambda base, _parts: base.scenario,
    "provenance": lambda base, _parts: base.provenance,
    "extra": lambda base, _parts: base.extra,
    "layers": lambda _base, parts: {k: v for p in parts for k, v in p.layers.items()},
    "digests": _merged("digests"),  # a production run's steps and outputs, digested as they came
    "failure": lambda _base, parts: next((p.failure for p in parts if p.failure is not None), None),
    "not_served": _concatenated("not_served"),
    "capabilities": _last("capabilities"),
    "features": _last("features"),
    "unsupported_features": _last("unsupported_features", bool),  # not run: every unit alike
}
assert set(JOIN) == {f.name for f in fields(Trace)}, "every part of a Trace needs its rule in JOIN"


def make_trace(label: str, hello: dict, scenario, layers: dict, failure: Failure | None = None,
               not_served: list[str] | None = None, unsupported_features=(), capabilities=None,
               features=None) -> Trace:
    return Trace(
        engine={"label": label, "name": hello.get("engine"), "version": hello.get("version"),
                "protocol": hello.get("protocol")},
        scenario=_scenario_block(scenario),
        provenance={"harness": __version__, "environment": hello.get("environment", {})},
        layers={name: records for name, records in layers.items() if not isinstance(records, DigestSink)},
        digests={name: sink.to_json() for name, sink in layers.items() if isinstance(sink, DigestSink)} or None,
        failure=failure, not_served=tuple(not_served) if not_served else None,
        capabilities=None if capabilities is None else tuple(capabilities),
        features=None if features is None else tuple(features),
        unsupported_features=tuple(unsupported_features) if unsupported_features else None)


def _scenario_block(scenario) -> dict:
    block = {"name": scenario.name, "sha256": scenario.sha256}
    if getattr(scenario, "logprob_atol", None) is not None:  # engine layers: their tolerance
        block["logprob_atol"] = scenario.logprob_atol
    if getattr(scenario, "logprob_noise", None) is not None:  # and the noise it was calibrated on
        block["logprob_noise"] = scenario.logprob_noise
    return block


def dumps(trace: Trace | dict) -> str:
    """Canonical text (of a Trace, or of any JSON value): sorted keys, two-space indent, one
    trailing newline. Byte-stable. Written chunk by chunk: json.dumps with an indent first makes
    a list of every chunk (about 50 bytes for each value, 8x the text), which a run of small
    values would pay in memory."""
    out = io.StringIO()
    for chunk in _ENCODER.iterencode(trace.to_json() if isinstance(trace, Trace) else trace):
        out.write(chunk)
    out.write("\n")
    return out.getvalue()


_ENCODER = json.JSONEncoder(indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)


def load_trace(path: Path) -> Trace:
    try:
        text = read_text(path, "trace")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except InputFileError as exc:
        raise TraceError(str(exc)) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read: {exc}") from None
    return loads_trace(text, path)


def loads_trace(text: str, path) -> Trace:
    """A trace from its text; `path` names where it came from in every error."""
    try:
        data = loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON (truncated or corrupted?): {exc}") from None
    except ValueError as exc:  # NaN, Infinity, 1e400, a 30-digit integer: never in a trace
        raise TraceError(f"{path}: a trace holds finite numbers only (as the protocol does): {exc}") from None
    except RecursionError:
        raise TraceError(f"{path}: nested too deeply to be a trace") from None
    return Trace.from_json(data, path)


def _from_json(data, path) -> Trace:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise TraceError(f"{path}: expected schema {SCHEMA!r}, got {got!r}; regenerate it "
                         "with `make goldens` if it is a golden of an older schema")
    for key in ("engine", "scenario", "layers", "provenance"):
        if not isinstance(data.get(key), dict):
            raise TraceError(f"{path}: field {key!r} is missing or not an object")
    if not isinstance(data["provenance"].get("environment", {}), dict):
        raise TraceError(f"{path}: field provenance.environment must be an object")
    for key, sub in (("engine", "label"), ("scenario", "name"), ("scenario", "sha256")):
        if not isinstance(data[key].get(sub), str):
            raise TraceError(f"{path}: field {key}.{sub} is missing or not a string")
    for layer, records in data["layers"].items():
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise TraceError(f"{path}: layers.{layer} must be a list of objects")
    digests = data.get("digests")
    if not isinstance(digests, (dict, type(None))):
        raise TraceError(f"{path}: field 'digests' must be an object")
    for layer, form in (digests or {}).items():
        problem = f"digests.{layer}: not a layer kept in the digest form {DIGEST_LAYERS}" \
            if layer not in DIGEST_LAYERS or layer in data["layers"] else check_form(layer, form)
        if problem:
            raise TraceError(f"{path}: {problem}")
    names = {key: _names(data, key, path, what) for key, what in NAME_LISTS.items()}
    known = {f.name for f in fields(Trace)} | {"schema"}
    return Trace(engine=data["engine"], scenario=data["scenario"], provenance=data["provenance"],
                 layers=data["layers"], digests=digests, failure=_failure(data, path), **names,
                 extra={k: v for k, v in data.items() if k not in known} or None)


NAME_LISTS = {"not_served": "layer names", "capabilities": "layer names", "features": "feature names",
              "unsupported_features": "feature names"}


def _names(data: dict, key: str, path, what: str) -> tuple[str, ...] | None:
    value = data.get(key)
    if value is None and key not in data:
        return None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise TraceError(f"{path}: {key} must be a list of {what}")
    return tuple(value)


def _failure(data: dict, path) -> Failure | None:
    if "failure" not in data:
        return None
    failure = data["failure"]
    if (not isinstance(failure, dict) or not isinstance(failure.get("kind"), str)
            or not isinstance(failure.get("message", ""), str)):
        raise TraceError(f"{path}: failure must be an object with a kind and a message (strings)")
    return Failure(failure["kind"], failure.get("message", ""))


def checked(trace: Trace) -> Trace:
    """The trace with every record judged against its layer's declaration (record_schema), as
    every comparison needs it: fields no table names left out. At the first record that is not
    what its layer declares, the records from it on are left out and the run is a `protocol`
    failure naming the engine, scenario, layer, record, field and value (a failure the run
    then had is named after it)."""
    layers, problem = check_layers(trace.layers)
    out = replace(trace, layers=layers)
    if problem is None:  # a digest layer judged each record as it arrived
        problem = next((f"layer {layer}, {form['problem']}" for layer, form in trace.forms.items()
                        if "problem" in form), None)
    if problem is None:
        return out
    message = (f"{trace.label} on {trace.scenario_name}: a record that is not what "
               f"protocol {PROTOCOL_VERSION} declares (engines/PROTOCOL.md): {problem}")
    if trace.failure is not None:
        message += f"\nthe run then ended: {trace.failure.kind}: {trace.failure.message}"
    return replace(out, failure=Failure(Kind.PROTOCOL, message))
