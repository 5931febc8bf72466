"""The `method_matrix` key of a scenario: speculative methods x K, for the `methods` layer.

    "method_matrix": {
      "ks": [8, 16],
      "rows": [
        {"name": "eagle3", "speculative_config": {"method": "eagle3", "model": "models/..."}},
        {"name": "mtp", "target": "models/...", "speculative_config": {"method": "mtp"}},
        ...
      ]
    }

Each row is one speculative method as a user would configure it (vLLM's --speculative-config
keys, without num_speculative_tokens: K comes from `ks`). `target` optionally replaces the
scenario's engine_args.model for that row (MTP drafts with the target's own layers, so it
needs an MTP-capable target). Model paths are resolved relative to the scenario file and
must be local folders holding a config.json, as everywhere else in a scenario.

Standard library only.
"""

from __future__ import annotations

import re

from conformance.formats.fields import (METHODS, METHODS_WITH_DRAFT_MODEL, ScenarioError,
                                        model_dir as _model_dir)
from conformance.formats.fields import type_name as _tname

ROW_NAME = re.compile(r"^[a-z0-9-]{1,32}$")
K_MIN, K_MAX = 1, 64
MATRIX_KEYS = {"ks", "rows"}
ROW_KEYS = {"name", "speculative_config", "target"}
# --speculative-config keys a row may set. num_speculative_tokens is deliberately absent.
ROW_SPEC_KEYS: dict[str, type] = {
    "method": str,
    "model": str,
    "parallel_drafting": bool,
    "prompt_lookup_max": int,
    "prompt_lookup_min": int,
}


def validate_method_matrix(raw: object, source: str, base_dir) -> tuple[dict, dict]:
    """Validate a scenario's `method_matrix` value.

    Returns (normalised, hashed): `normalised` has every model path made absolute (what the
    engine receives); `hashed` is the same structure with each model path replaced by
    "sha256:<hex of its config.json bytes>", for the scenario's content hash. Raises
    conformance.formats.scenario.ScenarioError(source, field, problem) naming the offending field.
    """
    from pathlib import Path

    base = Path(base_dir)
    where = "method_matrix"
    if not isinstance(raw, dict):
        raise ScenarioError(source, where, f"must be an object, got {_tname(raw)}")
    for key in raw:
        if key not in MATRIX_KEYS:
            raise ScenarioError(source, f"{where}.{key}", f"unknown key; allowed: {sorted(MATRIX_KEYS)}")
    for key in sorted(MATRIX_KEYS):
        if key not in raw:
            raise ScenarioError(source, f"{where}.{key}", "is required")
    ks = _ks(raw["ks"], source, where)
    rows = raw["rows"]
    if not isinstance(rows, list) or not rows:
        got = "an empty array" if rows == [] else _tname(rows)
        raise ScenarioError(source, f"{where}.rows", f"must be a non-empty array of objects, got {got}")
    out_rows, hashed_rows, seen = [], [], set()
    for i, row in enumerate(rows):
        out, hashed = _row(row, f"{where}.rows[{i}]", seen, source, base)
        out_rows.append(out)
        hashed_rows.append(hashed)
    return {"ks": list(ks), "rows": out_rows}, {"ks": list(ks), "rows": hashed_rows}


def _ks(ks: object, source: str, where: str) -> list:
    """`method_matrix.ks`: distinct integers from K_MIN to K_MAX, at least one."""
    if not isinstance(ks, list) or not ks:
        got = "an empty array" if ks == [] else _tname(ks)
        raise ScenarioError(source, f"{where}.ks", f"must be a non-empty array of integers, got {got}")
    for i, k in enumerate(ks):
        if not isinstance(k, int) or isinstance(k, bool):
            raise ScenarioError(source, f"{where}.ks[{i}]", f"must be an integer, got {_tname(k)}")
        if not K_MIN <= k <= K_MAX:
            raise ScenarioError(source, f"{where}.ks[{i}]", f"must be between {K_MIN} and {K_MAX}, got {k}")
        if k in ks[:i]:
            raise ScenarioError(source, f"{where}.ks[{i}]", f"repeats K={k}")
    return ks


def _row(row: object, at: str, seen: set, source: str, base) -> tuple[dict, dict]:
    """One row of the matrix, (normalised, hashed); its name is added to `seen`."""
    if not isinstance(row, dict):
        raise ScenarioError(source, at, f"must be an object, got {_tname(row)}")
    for key in row:
        if key not in ROW_KEYS:
            raise ScenarioError(source, f"{at}.{key}", f"unknown key; allowed: {sorted(ROW_KEYS)}")
    name = row.get("name")
    if not isinstance(name, str) or not ROW_NAME.fullmatch(name):
        raise ScenarioError(source, f"{at}.name", f"must be 1-32 characters of a-z 0-9 - (it names records), got {name!r}")
    if name in seen:
        raise ScenarioError(source, f"{at}.name", f"repeats row name {name!r}")
    seen.add(name)
    out, hashed = {"name": name}, {"name": name}

    if "target" in row:
        target = row["target"]
        if not isinstance(target, str):
            raise ScenarioError(source, f"{at}.target", f"must be a string, got {_tname(target)}")
        out["target"], hashed["target"] = _model_dir(source, f"{at}.target", target, base)
    out["speculative_config"], hashed["speculative_config"] = _speculative_config(
        row.get("speculative_config"), f"{at}.speculative_config", source, base)
    return out, hashed


def _speculative_config(spec: object, sat: str, source: str, base) -> tuple[dict, dict]:
    """A row's `speculative_config`, (normalised, hashed): its method known, K left to `ks`."""
    if not isinstance(spec, dict):
        raise ScenarioError(source, sat, f"must be an object, got {_tname(spec)}")
    for key in spec:
        if key == "num_speculative_tokens":
            raise ScenarioError(source, f"{sat}.{key}", "must not be set: K comes from method_matrix.ks")
        if key not in ROW_SPEC_KEYS:
            raise ScenarioError(source, f"{sat}.{key}", f"unknown key; allowed: {sorted(ROW_SPEC_KEYS)}")
    if "method" not in spec:
        raise ScenarioError(source, f"{sat}.method", "is required")
    for key, typ in ROW_SPEC_KEYS.items():
        if key in spec:
            value = spec[key]
            if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
                raise ScenarioError(source, f"{sat}.{key}", f"must be {_tname(typ())}, got {_tname(value)}")
            if typ is int and not K_MIN <= value <= K_MAX:
                raise ScenarioError(source, f"{sat}.{key}", f"must be between {K_MIN} and {K_MAX}, got {value}")
    method = spec["method"]
    if method not in METHODS:
        raise ScenarioError(source, f"{sat}.method", f"unknown method {method!r}; expected one of {sorted(METHODS)}")
    if method in METHODS_WITH_DRAFT_MODEL and method != "mtp" and "model" not in spec:
        raise ScenarioError(source, f"{sat}.model", f"method {method!r} needs a draft model config folder")
    spec_out, spec_hashed = dict(spec), dict(spec)
    if "model" in spec:
        spec_out["model"], spec_hashed["model"] = _model_dir(source, f"{sat}.model", spec["model"], base)
    return spec_out, spec_hashed
