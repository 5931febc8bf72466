"""A syrupy extension that keeps each oracle trace at goldens/<scenario>/vllm-<release>.json.

syrupy drives the run (compare, `--snapshot-update` to rewrite, unused-golden report); every
decision is the golden store's, the one lifecycle `parity goldens` runs too
(conformance/judging/goldens.py GoldenStore.update): where a golden lives, how a trace is
serialized (the canonical text of conformance.formats.trace.dumps), when a regenerated trace still
matches (so a golden that holds within tolerance on another machine is not rewritten), who may
write one and how (atomically; parity/test_goldens.py prints what the rewrite changes first).
"""

from __future__ import annotations

import json
from pathlib import Path

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from conformance.formats.trace import dumps
from conformance.judging.goldens import GOLDENS


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
        # an unreadable golden never matches: it is rewritten on update
        return not GOLDENS.update(json.loads(serialized_data), self.release, snapshot_data).changes

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(GOLDENS.path(cls.scenario, cls.release).parent)

    @classmethod
    def discovery_dirname(cls, *, test_location) -> str:
        return str(GOLDENS.path(cls.scenario, cls.release).parent)

    @classmethod
    def get_snapshot_name(cls, *, test_location, index=0) -> str:
        return GOLDENS.path(cls.scenario, cls.release).stem

    @classmethod
    def get_file_basename(cls, *, test_location, index=0) -> str:
        return GOLDENS.path(cls.scenario, cls.release).stem

    @classmethod
    def matches_test_location(cls, *, test_location, snapshot_location: str) -> bool:
        return Path(snapshot_location) == GOLDENS.path(cls.scenario, cls.release)

    def owns_snapshot_collection(self, *, filepath: str, test_location) -> bool:
        return Path(filepath).parent == GOLDENS.path(self.scenario, self.release).parent and filepath.endswith(".json")

    @classmethod
    def write_snapshot_collection(cls, *, snapshot_collection, name_order=None) -> None:
        update = GOLDENS.update(json.loads(next(iter(snapshot_collection)).data), cls.release)
        if update.path != Path(snapshot_collection.location):
            raise ValueError(f"syrupy would write {snapshot_collection.location}, the store {update.path}")
        GOLDENS.write(update)  # parity/test_goldens.py printed what changes
