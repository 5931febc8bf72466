"""The block pool's contract (engines/PROTOCOL.md, "The KV cache and its block pool"): its worked
example is what the oracle recorded on `block_pool_contract`, so a port can reproduce the block
ids from the document, and the document cannot drift from the oracle."""

import re

import pytest

from conformance.formats.pins import load_pins
from conformance.judging.goldens import GOLDENS
from tests.helpers import REPO

PROTOCOL_MD = REPO / "engines" / "PROTOCOL.md"
MARKER = "<!-- worked example: block_pool_contract -->"
# one scheduled request in the table's second column: `a` new `[[1, 2, 3]]` (0), or `a` `null`
ENTRY = re.compile(r"`(?P<id>[a-z0-9_]+)` (?P<new>new )?`(?P<blocks>null|\[\[[0-9, ]*\]\])`"
                   r"(?: \((?P<cached>\d+)\))?")


def doc_rows(text: str) -> dict[int, dict]:
    """The worked example's table: step -> what it says the step recorded."""
    table = text.split(MARKER, 1)[1].lstrip("\n").split("\n\n", 1)[0].splitlines()[2:]
    rows = {}
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        step, scheduled, finished, _queue, blocks, common = cells
        requests = {}
        for m in ENTRY.finditer(scheduled):
            ids = None if m["blocks"] == "null" else [[int(b) for b in re.findall(r"\d+", m["blocks"])]]
            requests[m["id"]] = {"block_ids": ids, "cached_tokens": int(m["cached"] or 0)}
        assert len(requests) == scheduled.count("`") // 4, f"step {step}: cannot read {scheduled!r}"
        free, used, cached = (int(n) for n in blocks.split(" / "))
        rows[int(step)] = {"requests": requests, "finished": re.findall(r"`([a-z0-9_]+)`", finished),
                           "kv_blocks": {"free": free, "used": used, "cached": cached},
                           "num_common_prefix_blocks": [int(common)]}
    return rows


def recorded(steps: list[dict]) -> dict[int, dict]:
    return {s["step"]: {"requests": {rid: {k: e[k] for k in ("block_ids", "cached_tokens")}
                                     for rid, e in s["requests"].items()},
                        "finished": s["finished"], "kv_blocks": s["kv_blocks"],
                        "num_common_prefix_blocks": s["num_common_prefix_blocks"]} for s in steps}


def test_the_worked_example_is_what_the_oracle_recorded():
    golden = GOLDENS.load("block_pool_contract", load_pins().oracle)
    assert doc_rows(PROTOCOL_MD.read_text(encoding="utf-8")) == recorded(golden.layers["steps"])


@pytest.mark.parametrize("old, new", [("`b` new `[[1, 2, 5]]` (8)", "`b` new `[[1, 2, 6]]` (8)"),
                                      ("| 3 / 8 / 10 |", "| 3 / 8 / 9 |"),
                                      ("`e` new `[[1, 2, 5]]` (8)", "`e` new `[[1, 2, 5]]` (4)")])
def test_the_check_sees_a_table_that_drifts(old, new):
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    assert old in text
    golden = GOLDENS.load("block_pool_contract", load_pins().oracle)
    assert doc_rows(text.replace(old, new, 1)) != recorded(golden.layers["steps"])
