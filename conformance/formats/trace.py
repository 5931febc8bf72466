"""Traces: what one engine did on one scenario, as plain JSON (a golden is an oracle's trace).

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
  unsupported_features  present only when the run was not sent because the scenario needs
              features the engine's hello does not declare (hello.features): those features, in
              formats/features.py's order; layers then empty. Never in a golden.
"""

from __future__ import annotations

import io
import json
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


def make_trace(label: str, hello: dict, scenario, layers: dict, failure: dict | None = None,
               not_served: list[str] | None = None, unsupported_features=()) -> dict:
    trace = {
        "schema": SCHEMA,
        "engine": {"label": label, "name": hello.get("engine"), "version": hello.get("version"),
                   "protocol": hello.get("protocol")},
        "scenario": _scenario_block(scenario),
        "provenance": {"harness": __version__, "environment": hello.get("environment", {})},
        "layers": {name: records for name, records in layers.items() if not isinstance(records, DigestSink)},
    }
    digests = {name: sink.to_json() for name, sink in layers.items() if isinstance(sink, DigestSink)}
    if digests:
        trace["digests"] = digests
    if failure is not None:
        trace["failure"] = failure
    if not_served:
        trace["not_served"] = list(not_served)
    if unsupported_features:
        trace["unsupported_features"] = list(unsupported_features)
    return trace


def _scenario_block(scenario) -> dict:
    block = {"name": scenario.name, "sha256": scenario.sha256}
    if getattr(scenario, "logprob_atol", None) is not None:  # engine layers: their tolerance
        block["logprob_atol"] = scenario.logprob_atol
    if getattr(scenario, "logprob_noise", None) is not None:  # and the noise it was calibrated on
        block["logprob_noise"] = scenario.logprob_noise
    return block


def dumps(trace: dict) -> str:
    """Canonical text: sorted keys, two-space indent, one trailing newline. Byte-stable.
    Written chunk by chunk: json.dumps with an indent first makes a list of every chunk (about
    50 bytes for each value, 8x the text), which a run of small values would pay in memory."""
    out = io.StringIO()
    for chunk in _ENCODER.iterencode(trace):
        out.write(chunk)
    out.write("\n")
    return out.getvalue()


_ENCODER = json.JSONEncoder(indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)


def load_trace(path: Path) -> dict:
    try:
        text = read_text(path, "trace")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except InputFileError as exc:
        raise TraceError(str(exc)) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read: {exc}") from None
    return loads_trace(text, path)


def loads_trace(text: str, path) -> dict:
    """A trace from its text; `path` names where it came from in every error."""
    try:
        trace = loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON (truncated or corrupted?): {exc}") from None
    except ValueError as exc:  # NaN, Infinity, 1e400, a 30-digit integer: never in a trace
        raise TraceError(f"{path}: a trace holds finite numbers only (as the protocol does): {exc}") from None
    except RecursionError:
        raise TraceError(f"{path}: nested too deeply to be a trace") from None
    if not isinstance(trace, dict) or trace.get("schema") != SCHEMA:
        got = trace.get("schema") if isinstance(trace, dict) else type(trace).__name__
        raise TraceError(f"{path}: expected schema {SCHEMA!r}, got {got!r}; regenerate it "
                         "with `make goldens` if it is a golden of an older schema")
    for key, typ in (("engine", dict), ("scenario", dict), ("layers", dict), ("provenance", dict)):
        if not isinstance(trace.get(key), typ):
            raise TraceError(f"{path}: field {key!r} is missing or not an object")
    if not isinstance(trace["provenance"].get("environment", {}), dict):
        raise TraceError(f"{path}: field provenance.environment must be an object")
    for key, sub in (("engine", "label"), ("scenario", "name"), ("scenario", "sha256")):
        if not isinstance(trace[key].get(sub), str):
            raise TraceError(f"{path}: field {key}.{sub} is missing or not a string")
    for layer, records in trace["layers"].items():
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise TraceError(f"{path}: layers.{layer} must be a list of objects")
    digests = trace.get("digests", {})
    if not isinstance(digests, dict):
        raise TraceError(f"{path}: field 'digests' must be an object")
    for layer, form in digests.items():
        problem = f"digests.{layer}: not a layer kept in the digest form {DIGEST_LAYERS}" \
            if layer not in DIGEST_LAYERS or layer in trace["layers"] else check_form(layer, form)
        if problem:
            raise TraceError(f"{path}: {problem}")
    served = trace.get("not_served", [])
    if not isinstance(served, list) or not all(isinstance(x, str) for x in served):
        raise TraceError(f"{path}: not_served must be a list of layer names")
    declared = trace.get("capabilities", [])
    if not isinstance(declared, list) or not all(isinstance(x, str) for x in declared):
        raise TraceError(f"{path}: capabilities must be a list of layer names")
    lacking = trace.get("unsupported_features", [])
    if not isinstance(lacking, list) or not all(isinstance(x, str) for x in lacking):
        raise TraceError(f"{path}: unsupported_features must be a list of feature names")
    return trace


def checked(trace: dict) -> dict:
    """The trace with every record judged against its layer's declaration (record_schema), as
    every comparison needs it: fields no table names left out. At the first record that is not
    what its layer declares, the records from it on are left out and the run is a `protocol`
    failure naming the engine, scenario, layer, record, field and value (a failure the run
    then had is named after it)."""
    layers, problem = check_layers(trace["layers"])
    out = dict(trace, layers=layers)
    if problem is None:  # a digest layer judged each record as it arrived
        problem = next((f"layer {layer}, {form['problem']}" for layer, form in trace.get("digests", {}).items()
                        if "problem" in form), None)
    if problem is None:
        return out
    message = (f"{trace['engine']['label']} on {trace['scenario']['name']}: a record that is not what "
               f"protocol {PROTOCOL_VERSION} declares (engines/PROTOCOL.md): {problem}")
    earlier = trace.get("failure")
    if isinstance(earlier, dict):
        message += f"\nthe run then ended: {earlier.get('kind')}: {earlier.get('message')}"
    out["failure"] = {"kind": Kind.PROTOCOL, "message": message}
    return out
