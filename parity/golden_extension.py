"""A syrupy extension that keeps each oracle trace at goldens/<scenario>/vllm-<release>.json.

syrupy owns the lifecycle (compare, `--snapshot-update` to rewrite, unused-golden report);
this extension only says where a golden lives, how a trace is serialized (the canonical
text of conformance.trace.dumps), when a regenerated trace still matches (the comparator role:
conformance.goldens.check_golden, so a golden that holds within tolerance on another machine is
not rewritten) and how it is written (atomically, oracle only; parity/test_goldens.py prints
what the rewrite changes first).
"""

from __future__ import annotations

import json
from pathlib import Path

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from conformance.gate.golden_store import GOLDEN_DIR, GoldenRefused, golden_path, keeps, write_text_atomic
from conformance.trace import dumps


class GoldenExtension(SingleFileSnapshotExtension):
    _write_mode = WriteMode.TEXT
    file_extension = "json"
    scenario = ""
    release = ""

    @classmethod
    def for_golden(cls, scenario: str, release: str) -> type["GoldenExtension"]:
        return type(f"Golden_{scenario}_{release}", (cls,), {"scenario": scenario, "release": release})

    def serialize(self, data, **kwargs) -> str:
        return dumps(data)

    def matches(self, *, serialized_data, snapshot_data) -> bool:
        try:
            golden = json.loads(snapshot_data)
        except ValueError:
            return False  # an unreadable golden never matches: regenerated on update
        return keeps(json.loads(serialized_data), golden).holds

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(GOLDEN_DIR / cls.scenario)

    @classmethod
    def discovery_dirname(cls, *, test_location) -> str:
        return str(GOLDEN_DIR / cls.scenario)

    @classmethod
    def get_snapshot_name(cls, *, test_location, index=0) -> str:
        return f"vllm-{cls.release}"

    @classmethod
    def get_file_basename(cls, *, test_location, index=0) -> str:
        return f"vllm-{cls.release}"

    @classmethod
    def matches_test_location(cls, *, test_location, snapshot_location: str) -> bool:
        return Path(snapshot_location) == golden_path(cls.scenario, cls.release)

    def owns_snapshot_collection(self, *, filepath: str, test_location) -> bool:
        return Path(filepath).parent == GOLDEN_DIR / self.scenario and filepath.endswith(".json")

    @classmethod
    def write_snapshot_collection(cls, *, snapshot_collection, name_order=None) -> None:
        path = Path(snapshot_collection.location)
        text = next(iter(snapshot_collection)).data
        trace = json.loads(text)
        if trace.get("provenance", {}).get("environment", {}).get("vllm") != cls.release:
            raise GoldenRefused(f"refusing to write {path}: it is not the trace of vLLM {cls.release}")
        write_text_atomic(path, text)  # parity/test_goldens.py printed what changes
