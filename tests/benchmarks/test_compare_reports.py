"""benchmarks/compare_reports.py compare: two captures of unchanged code compare equal (only
timestamps, pids and the captures' own paths masked), and any other difference is listed."""

from __future__ import annotations

import importlib.util

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("compare_reports", REPO / "benchmarks" / "compare_reports.py")
compare_reports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_reports)


def capture(folder, pid: int, summary: str) -> None:
    """A capture as `capture` writes one: a shard's results folder and the merge's reports, each
    with the claim file (formats/files.py) holding the pid that claimed it."""
    (folder / "shards" / "results-1").mkdir(parents=True)
    (folder / "shards" / "reports").mkdir()
    (folder / "shards" / "results-1" / ".parity-results.lock").write_text(f"{pid}\n", encoding="utf-8")
    (folder / "shards" / "reports" / ".parity-reports.lock").write_text(f"{pid + 1}\n", encoding="utf-8")
    (folder / "shards" / "reports" / "summary.md").write_text(
        f"written 2026-12-01T20:{pid % 60:02d}:00Z from {folder}\n{summary}\n", encoding="utf-8")
    (folder / "captured-from").write_text(f"{REPO}\n{folder}\n", encoding="utf-8")


def test_captures_differing_only_in_pids_times_and_paths_compare_equal(tmp_path, capsys):
    capture(tmp_path / "before", 14918, "3 pass")
    capture(tmp_path / "after", 23747, "3 pass")
    assert compare_reports.compare(tmp_path / "before", tmp_path / "after") == 0, capsys.readouterr().out
    assert "3 files compared (stderr left out), 0 differ" in capsys.readouterr().out


def test_any_other_difference_is_listed(tmp_path, capsys):
    capture(tmp_path / "before", 14918, "3 pass")
    capture(tmp_path / "after", 23747, "2 pass, 1 diverged")
    assert compare_reports.compare(tmp_path / "before", tmp_path / "after") == 1
    out = capsys.readouterr().out
    assert "shards/reports/summary.md: differs" in out and "+2 pass, 1 diverged" in out
    assert "1 differ" in out
