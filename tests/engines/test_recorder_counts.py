"""The two counts the recorder keeps instead of reading them at every step (engines/vllm/recorder.py
CachedBlocks and NullBlocks) equal the reads they replace, at every step of scenarios that cache,
evict, reset the prefix cache, and hold null blocks (a sliding window, mamba), on the oracle's
release; and the check sees a count that is wrong."""

import json
import subprocess

import pytest

from conformance.formats.pins import load_pins
from tests.helpers import REPO

FULL_ATTENTION = ("steady_decode", "kv_pressure", "prefix_cache_reset_idle", "kv_events_eviction")
NULL_BLOCKS = ("sliding_window_prefix_hits", "sliding_window_kv_pressure", "mamba_align_prefix_hits")


def counted(*args: str) -> dict:
    from conformance.process.envs import ensure_env

    python = ensure_env(load_pins().oracle, log=lambda m: None)
    done = subprocess.run([str(python), str(REPO / "tests" / "engines" / "recorder_counts.py"), str(REPO), *args],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.oracle
def test_the_kept_counts_equal_the_reads_they_replace():
    found = counted(*FULL_ATTENTION, *NULL_BLOCKS)
    for name, c in found.items():
        assert c["wrong_blocks"] == 0 and c["wrong_cached"] == 0, (name, c)
    # full attention alone: no request ever holds the null block, so no block is read
    assert all(found[n]["read"] == 0 and found[n]["skipped"] > 0 for n in FULL_ATTENTION), found
    # a sliding window and mamba: their requests hold null blocks, which are read and counted
    assert all(found[n]["read"] > 0 for n in NULL_BLOCKS), found


@pytest.mark.oracle
def test_the_check_sees_a_null_block_count_that_is_wrong():
    """TEST DEVICE: NullBlocks told that no request holds the null block; the sliding window's
    requests do, and their counts then include it."""
    found = counted("--device-blind-nulls", "sliding_window_prefix_hits")
    assert found["sliding_window_prefix_hits"]["wrong_blocks"] > 0, found
