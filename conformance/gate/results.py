"""Results folders: what a shard leaves for `parity merge`, and how a merge reads every shard's
folder back, checking that they are all the shards of one gate run, made by this checkout.

A results folder:
    manifest.json   what the run was (oracle, pins, scenario set, goldens, tool version,
                    engines, plan) and which units this shard ran, with their trace files and
                    each trace's sha256 (merge refuses a trace changed since)
    verdicts.json   each unit's verdict, for reading (merge judges again from the traces)
    traces/         one trace per unit
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from pathlib import Path

from conformance.formats.engine_ref import EngineRef
from conformance.formats.features import FEATURES
from conformance.formats.files import (InputFileError, read_bytes, read_text, remove_stale_temporaries,
                                       write_text_atomic)
from conformance.formats.pins import Pins
from conformance.formats.protocol import LAYERS
from conformance.formats.trace import Trace, TraceError, dumps, loads_trace
from conformance.gate.plan import RunManifest, digest, goldens_digest, tool_identity
from conformance.gate.shards import GROUPS, ShardError, Unit
from conformance.judging.verdict import ROLES

SCHEMA = "vllm-parity/results/1"
# Fields every shard of one gate run has in common; merge refuses a set where any differs.
IDENTITY = ("tool", "oracle", "pins", "scenario_set", "goldens", "engines", "layers",
            "require_layers", "require_features", "plan", "device", "count")


def write_results(folder: Path, manifest: RunManifest, index: int, done: list[tuple[Unit, Trace, dict]]) -> None:
    """The results folder of shard `index` (1 for a whole run); done: (unit, its trace, its
    verdict summary) for each unit of its share. Called while the run holds the folder's claim.

    The manifest goes first and comes back last, each file written whole: a writer killed
    meanwhile (kill -9) leaves a folder that is plainly not a shard's (no manifest.json), never
    an old manifest over new traces, and its temporary files are removed by the next writer."""
    (folder / "manifest.json").unlink(missing_ok=True)
    traces = folder / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder)
    remove_stale_temporaries(traces)
    for stale in traces.glob("*.json"):  # a folder reused from an earlier run holds only this one's
        stale.unlink()
    entries, verdicts = [], []
    for number, (unit, trace, summary) in enumerate(done, 1):
        name = f"traces/{number:04d}-{_slug(unit.key)}.json"
        text = dumps(trace)
        write_text_atomic(folder / name, text)
        # merge checks each trace against its digest: a trace rewritten later is refused
        entries.append({"key": unit.key, "engine": unit.engine, "scenario": unit.scenario,
                        "group": unit.group, "layers": list(unit.layers), "trace": name,
                        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()})
        verdicts.append(dict(summary, unit=unit.key))
    write_text_atomic(folder / "verdicts.json", json.dumps(verdicts, indent=2, sort_keys=True) + "\n")
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    data = dict(manifest.to_json(), index=index, created=created, schema=SCHEMA, units=entries)
    write_text_atomic(folder / "manifest.json", json.dumps(data, indent=2, sort_keys=True) + "\n")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:100]


def read_results(folders: list[Path], pins: Pins) -> tuple[RunManifest, dict[str, Trace]]:
    """Every shard's results folder, checked (load_results) and made by this checkout: the
    run's manifest and each unit's trace by unit key."""
    manifest, traces = load_results(folders)
    here = {"tool": tool_identity(), "oracle": pins.oracle, "pins": list(pins.releases),
            "goldens": goldens_digest([s["name"] for s in manifest["scenarios"]], pins.releases)}
    for key, value in here.items():
        if manifest[key] != value:
            raise ShardError(f"the shards were made with another {key} than this checkout's "
                             f"({json.dumps(manifest[key])} vs {json.dumps(value)}): merge them "
                             "in a checkout of the commit that made them")
    if digest(manifest["scenarios"]) != manifest["scenario_set"]:
        raise ShardError("the shards' manifests list other scenarios than their scenario set's digest")
    try:
        engines = [EngineRef.from_json(e, pins) for e in manifest["engines"]]
    except ValueError as exc:
        raise ShardError(f"the shards' manifests list engines in another form: {exc}") from None
    run = RunManifest(tool=manifest["tool"], oracle=manifest["oracle"], pins=manifest["pins"],
                      scenarios=manifest["scenarios"], goldens=manifest["goldens"], engines=engines,
                      layers=manifest["layers"], require_layers=manifest["require_layers"],
                      units=_units(engines, manifest), device=manifest["device"], count=manifest["count"],
                      require_features=manifest["require_features"])
    if run.plan != manifest["plan"]:
        raise ShardError("the shards' units do not make up the plan their manifests name")
    return run, traces


def _units(engines: list[EngineRef], manifest: dict) -> list[Unit]:
    """The units in plan order, rebuilt from what the shards ran."""
    order_e = {e.key: i for i, e in enumerate(engines)}
    order_s = {s["name"]: i for i, s in enumerate(manifest["scenarios"])}
    order_g = {g: i for i, g in enumerate(GROUPS)}
    try:
        return sorted((Unit(e["engine"], e["scenario"], e["group"], tuple(e["layers"]), 0.0)
                       for e in manifest["units"]),
                      key=lambda u: (order_e[u.engine], order_s[u.scenario], order_g[u.group]))
    except (KeyError, TypeError) as exc:
        raise ShardError(f"the shards' manifests name a unit outside their plan ({exc})") from None


def load_results(folders: list[Path]) -> tuple[dict, dict[str, Trace]]:
    """Check that `folders` are every shard of one gate run, once each; return the common
    manifest (its `units` those of every shard) and each unit's trace by unit key. Anything else is a ShardError saying which
    folder and what."""
    if not folders:
        raise ShardError("no results folders given")
    manifests = [(folder, _manifest(folder)) for folder in folders]
    first_folder, first = manifests[0]
    for folder, manifest in manifests[1:]:
        for key in IDENTITY:
            if manifest.get(key) != first.get(key):
                raise ShardError(
                    f"{folder} and {first_folder} are not shards of one gate run: they differ in "
                    f"{_IDENTITY_WORDS.get(key, key)} ({_difference(first.get(key), manifest.get(key))}); "
                    "merge the shards of one run, all made by the same commit")
    count = first["count"]
    seen: dict[int, Path] = {}
    for folder, manifest in manifests:
        index = manifest["index"]
        if index in seen:
            raise ShardError(f"shard {index}/{count} given twice: {seen[index]} and {folder}")
        seen[index] = folder
    missing = [i for i in range(1, count + 1) if i not in seen]
    if missing:
        raise ShardError(f"shard{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(f'{i}/{count}' for i in missing)} missing: a merge needs every "
                         f"shard of the run (given: {', '.join(f'{i}/{count}' for i in sorted(seen))})")
    traces: dict[str, Trace] = {}
    for folder, manifest in manifests:
        for entry in manifest["units"]:
            if entry["key"] in traces:
                raise ShardError(f"{folder}: unit {entry['key']} was also run by another shard")
            path = folder / entry["trace"]
            try:  # read once: the bytes checked against the digest are the bytes parsed
                traces[entry["key"]] = loads_trace(_checked(path, entry["sha256"]).decode("utf-8"), path)
            except (TraceError, UnicodeDecodeError) as exc:
                raise ShardError(f"{folder}: unit {entry['key']}: {exc}") from None
    if len(traces) != first["planned"]:
        raise ShardError(f"the shards hold {len(traces)} units; the plan has {first['planned']}")
    merged = dict(first, units=[u for _, m in manifests for u in m["units"]])
    merged.pop("index", None)
    return merged, traces


_IDENTITY_WORDS = {"tool": "tool version", "oracle": "oracle", "pins": "pins",
                   "scenario_set": "scenario set", "goldens": "goldens", "engines": "engines",
                   "layers": "layers", "require_layers": "required layers",
                   "require_features": "required features", "plan": "plan", "device": "device", "count": "shard count"}


def _manifest(folder: Path) -> dict:
    path = folder / "manifest.json"
    try:
        manifest = json.loads(read_text(path, "manifest"))
    except FileNotFoundError:
        raise ShardError(f"{folder}: not a shard's results folder (no manifest.json); "
                         "make one with `parity gate --shard I/N --results FOLDER`") from None
    except InputFileError as exc:
        raise ShardError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path}: cannot be read as JSON: {exc}") from None
    except RecursionError:
        raise ShardError(f"{path}: nested too deeply to be a manifest") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        got = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise ShardError(f"{path}: expected schema {SCHEMA!r}, got {got!r}")
    _check_shape(path, manifest, MANIFEST, "")
    if not 1 <= manifest["index"] <= manifest["count"]:
        raise ShardError(f"{path}: field 'index': expected a shard number from 1 to count "
                         f"({manifest['count']}), got {manifest['index']}")
    for i, unit in enumerate(manifest["units"]):
        key = f"{unit['engine']} / {unit['scenario']} / {unit['group']}"
        if unit["key"] != key:
            raise ShardError(f"{path}: field 'units[{i}].key': expected {key!r} (its engine, scenario "
                             f"and group), got {_short(unit['key'])}")
    return manifest


# The shape of a manifest, field by field: a manifest edited by hand is refused naming the field,
# before anything reads it. A spec is a type name, a tuple of allowed values, ("list", item),
# ("null or", spec), ("int >=", low), or a dict of required fields (others are allowed).
_LAYER = tuple(LAYERS)
_FEATURE = tuple(FEATURES)
_UNIT = {"key": "str", "engine": "str", "scenario": "str", "group": tuple(GROUPS), "layers": ("list", _LAYER),
         "trace": "relative path", "sha256": "sha256"}
MANIFEST = {
    "tool": {"version": "str", "sources": "str"}, "oracle": "str", "pins": ("list", "str"),
    "scenario_set": "str", "goldens": "str", "plan": "str", "device": ("cpu", "gpu"),
    "scenarios": ("list", {"name": "str", "sha256": "str", "rows": ("list", "str"), "layers": ("list", _LAYER),
                           "method_matrix": "bool", "features": ("list", _FEATURE)}),
    "engines": ("list", {"key": "str", "role": ROLES, "engine": "str", "name": ("null or", "str"),
                         "command": ("null or", "str")}),
    "layers": ("null or", ("list", _LAYER)), "require_layers": ("null or", ("list", _LAYER)),
    "require_features": ("null or", ("list", _FEATURE)),
    "planned": ("int >=", 0), "count": ("int >=", 1), "index": ("int >=", 1), "units": ("list", _UNIT),
}


def _check_shape(path: Path, value, spec, where: str) -> None:
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            _wrong(path, where.rstrip("."), "an object", value)
        for key, sub in spec.items():
            if key not in value:
                raise ShardError(f"{path}: field {where + key!r} is missing")
            _check_shape(path, value[key], sub, f"{where}{key}.")
        return
    field = where.rstrip(".")
    if isinstance(spec, tuple) and spec[0] in ("list", "null or", "int >="):
        kind, sub = spec
        if kind == "null or":
            if value is not None:
                _check_shape(path, value, sub, where)
        elif kind == "int >=":
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= sub):
                _wrong(path, field, f"an integer of at least {sub}", value)
        elif not isinstance(value, list):
            _wrong(path, field, "a list", value)
        else:
            for i, item in enumerate(value):
                _check_shape(path, item, sub, f"{field}[{i}].")
        return
    if isinstance(spec, tuple):
        ok, expected = isinstance(value, str) and value in spec, f"one of {', '.join(spec)}"
    elif spec == "relative path":
        ok = isinstance(value, str) and bool(value) and not Path(value).is_absolute() \
            and ".." not in Path(value).parts
        expected = "a path inside the folder"
    elif spec == "sha256":
        ok, expected = isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None, "a sha256"
    else:
        ok = isinstance(value, {"str": str, "bool": bool}[spec])
        expected = {"str": "a string", "bool": "true or false"}[spec]
    if not ok:
        _wrong(path, field, expected, value)


def _wrong(path: Path, field: str, expected: str, value) -> None:
    raise ShardError(f"{path}: field {field!r}: expected {expected}, got {_short(value)}; a manifest is "
                     "written by `parity gate --shard I/N --results FOLDER`: run the shard again "
                     "rather than edit it")


def _checked(path: Path, expected: str) -> bytes:
    """A trace file's bytes, refused unless they are those its shard wrote."""
    try:
        data = read_bytes(path, "trace")
    except InputFileError as exc:
        raise ShardError(str(exc)) from None
    except OSError as exc:
        raise ShardError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ShardError(f"{path}: changed after its shard wrote it (sha256 {actual[:16]}..., the "
                         f"manifest says {expected[:16]}...): merge only what the shards wrote")
    return data


def _difference(a, b) -> str:
    """Where two manifest values differ, shortly: the first differing item of a list (an
    engine, say) and its differing fields, else both values."""
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                if isinstance(x, dict) and isinstance(y, dict):
                    fields = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                    name = x.get("key") or y.get("key") or f"#{i + 1}"
                    return f"{name}: " + "; ".join(f"{k} {_pair(x.get(k), y.get(k))}" for k in fields)
                return f"item {i + 1}: {_pair(x, y)}"
        if len(a) != len(b):
            longer = a if len(a) > len(b) else b
            return f"{len(a)} vs {len(b)} items; the first unmatched: {_short(longer[min(len(a), len(b))])}"
    return _pair(a, b)


def _pair(a, b) -> str:
    """Two values side by side; two long strings from a little before where they part."""
    if isinstance(a, str) and isinstance(b, str) and max(len(a), len(b)) > 70:
        cut = max(0, len(os.path.commonprefix([a, b])) - 20)
        if cut:
            a, b = "..." + a[cut:], "..." + b[cut:]
    return f"{_short(a)} vs {_short(b)}"


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
