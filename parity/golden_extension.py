"""A syrupy extension that shows syrupy each golden at goldens/<scenario>/vllm-<release>.json,
as the golden front door (conformance/regenerate/lifecycle.py, GoldenStore.regenerate) decided
it for one oracle run: syrupy reports a golden that is missing, and every decision is the
store's, made once per golden: where it lives, its canonical text (formats/trace.py dumps),
whether it holds (a golden that holds within tolerance on another machine is not rewritten),
who may write one and how (with --snapshot-update, the front door wrote it already).
"""

from __future__ import annotations

from pathlib import Path

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from conformance.judging.goldens import GoldenOutcome


class GoldenExtension(SingleFileSnapshotExtension):
    _write_mode = WriteMode.TEXT
    file_extension = "json"
    outcome: GoldenOutcome

    @classmethod
    def of(cls, outcome: GoldenOutcome) -> type["GoldenExtension"]:
        return type(f"Golden_{outcome.path.parent.name}_{outcome.path.stem}", (cls,), {"outcome": outcome})

    def serialize(self, data, **kwargs) -> str:
        return data.update.text

    def matches(self, *, serialized_data, snapshot_data) -> bool:
        # the store's decision, not a second comparison: it holds, or the front door wrote it
        return not self.outcome.changes or self.outcome.written

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(cls.outcome.path.parent)

    @classmethod
    def discovery_dirname(cls, *, test_location) -> str:
        return str(cls.outcome.path.parent)

    @classmethod
    def get_snapshot_name(cls, *, test_location, index=0) -> str:
        return cls.outcome.path.stem

    @classmethod
    def get_file_basename(cls, *, test_location, index=0) -> str:
        return cls.outcome.path.stem

    @classmethod
    def matches_test_location(cls, *, test_location, snapshot_location: str) -> bool:
        return Path(snapshot_location) == cls.outcome.path

    def owns_snapshot_collection(self, *, filepath: str, test_location) -> bool:
        return Path(filepath).parent == self.outcome.path.parent and filepath.endswith(".json")

    @classmethod
    def write_snapshot_collection(cls, *, snapshot_collection, name_order=None) -> None:
        # reached only for a golden syrupy found missing: the front door has written it by now
        if Path(snapshot_collection.location) != cls.outcome.path or not cls.outcome.written:
            raise ValueError(f"syrupy would write {snapshot_collection.location}; goldens are written by "
                             f"the golden front door (parity goldens), which wrote {cls.outcome.path}: "
                             f"{'yes' if cls.outcome.written else 'no'}")
