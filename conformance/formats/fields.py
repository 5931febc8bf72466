"""What every part of a scenario file checks the same way: the error that names the file and
the field, JSON type names, model folders, speculative methods.

Shared by formats/scenario.py, formats/workload.py and formats/method_matrix.py, so it imports
none of them (imports flow one way: fields <- workload, matrix <- scenario). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.files import InputFileError, read_bytes

METHODS_WITH_DRAFT_MODEL = {"eagle", "eagle3", "dflash", "dspark", "draft_model", "mtp", "medusa"}
METHODS = METHODS_WITH_DRAFT_MODEL | {"ngram", "suffix"}


class ScenarioError(InputError):
    """A scenario file is malformed. The message names the file and the field."""

    def __init__(self, source: str, field: str, problem: str):
        super().__init__(f"{source}: {field}: {problem}")
        self.source, self.field, self.problem = source, field, problem


def type_name(value: object) -> str:
    """A value's JSON type, as an error message names it."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def model_dir(src: str, field: str, value: str, base: Path) -> tuple[str, str]:
    """Absolute path for the engine, and the hash of what the folder says for the scenario
    hash: its config.json, and its weights.json where the project generates the weights (a
    tiny model's seed decides what the engine layers record)."""
    if "\x00" in value:
        raise ScenarioError(src, field, "a path may not contain a NUL character")
    try:
        folder = (base / value).resolve()
        config = folder / "config.json"
        found = config.is_file()
    except (OSError, ValueError) as exc:  # too long, unencodable (lone surrogate), ...
        raise ScenarioError(src, field, f"{value[:80]!r} is not a usable path: {exc}") from None
    if not found:
        raise ScenarioError(src, field, f"{value!r} is not a local folder with a config.json "
                            f"(looked in {folder}); hub ids are not allowed")
    digest = hashlib.sha256()
    for name in ("config.json", "weights.json"):
        path = folder / name
        if name == "weights.json" and not path.is_file():
            continue
        try:
            data = read_bytes(path, "model config")
            json.loads(data.decode("utf-8"))
        except InputFileError as exc:
            raise ScenarioError(src, field, str(exc)) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ScenarioError(src, field, f"{path} is not valid JSON: {exc}") from None
        except RecursionError:
            raise ScenarioError(src, field, f"{path} is nested too deeply") from None
        digest.update(data)
    return str(folder), "sha256:" + digest.hexdigest()
