"""Run in a pin's environment (tests/engines/test_recorder_counts.py): each named scenario driven
by the recorder, its two kept counts checked at every read against the full reads they replace.

    python recorder_counts.py REPO [--device-blind-nulls] SCENARIO...

Prints one JSON line: scenario -> {"skipped": reads that took NullBlocks' shortcut, "read":
reads that read every block, "wrong_blocks": reads whose count differs from every block read,
"wrong_cached": steps whose cached count differs from the hash map's scan}.
--device-blind-nulls is a TEST DEVICE: NullBlocks always says no request holds the null block,
so the check must see the counts it then gets wrong.
"""

import json
import operator
import sys
from pathlib import Path

REPO = Path(sys.argv[1])
sys.path.insert(0, str(REPO))

from engines.vllm import runtime  # noqa: E402

runtime.boot("cpu")

from conformance.formats.scenario import load_scenario  # noqa: E402
from engines.vllm import recorder  # noqa: E402
from engines.vllm.steps_layer import iter_steps  # noqa: E402

if "--device-blind-nulls" in sys.argv:
    recorder.NullBlocks.held = lambda self: False

counts: dict = {}


class Checked(recorder.RecordingScheduler):
    """The recorder, each kept count compared with the read it replaces."""

    def _parity_blocks_held(self):
        kept = super()._parity_blocks_held()
        shortcut = not self._parity_nulls.held()

        def held(rid) -> int:
            every = sum(len(blocks) - operator.countOf(map(recorder._IS_NULL, blocks), True)
                        for blocks in self.kv_cache_manager.coordinator.get_blocks(rid))
            counts["skipped" if shortcut else "read"] += 1
            counts["wrong_blocks"] += kept(rid) != every
            return kept(rid)

        return held

    def _parity_identities_after(self, record: dict, result) -> None:
        super()._parity_identities_after(record, result)
        counts["wrong_cached"] += record["kv_blocks"]["cached"] != recorder._cached_blocks(
            self.kv_cache_manager.block_pool)


found = {}
for name in (a for a in sys.argv[2:] if not a.startswith("--")):
    counts.update(skipped=0, read=0, wrong_blocks=0, wrong_cached=0)
    for _record in iter_steps(load_scenario(REPO / "scenarios" / f"{name}.json").to_wire(), Checked):
        pass
    found[name] = dict(counts)
print(json.dumps(found))
