"""The gate's side in CI: GitHub Actions' step summary and the Buildkite annotation, both the
markdown summary (render_ci.markdown)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conformance.formats.settings import SettingError
from conformance.report.render_ci import markdown
from conformance.report.report_files import write_text
from conformance.report.view import GateView


def check_summary_target() -> None:
    """$GITHUB_STEP_SUMMARY, when set, must name a file that can be appended to: checked
    before any engine runs, so a wrong value is bad input, not a traceback after the verdict."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    path = Path(summary)
    if path.is_dir():
        raise SettingError(f"$GITHUB_STEP_SUMMARY={summary}: is a folder, not a file")
    if not path.parent.is_dir():
        raise SettingError(f"$GITHUB_STEP_SUMMARY={summary}: its folder {path.parent} does not exist")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise SettingError(f"$GITHUB_STEP_SUMMARY={summary}: cannot be written")


def ci_summaries(view: GateView, reports: Path | None, log) -> None:
    """GitHub Actions: the markdown summary appended to $GITHUB_STEP_SUMMARY. Buildkite: an
    annotation file in the reports folder, and, on a Buildkite agent ($BUILDKITE set), the
    same text handed to `buildkite-agent annotate` where that program exists."""
    text = markdown(view)  # Buildkite renders the same markdown, tables included
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as stream:
            stream.write(text)
        log(f"[gate] appended the summary to $GITHUB_STEP_SUMMARY ({summary})")
    if reports:
        path = reports / "annotation.md"
        reports.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        log(f"[gate] wrote {path} (a Buildkite annotation)")
    agent = shutil.which("buildkite-agent") if os.environ.get("BUILDKITE") else None
    if agent:
        style = ("success", "error", "error")[view.status]
        done = subprocess.run([agent, "annotate", "--style", style, "--context", "vllm-parity"],
                              input=text, capture_output=True, encoding="utf-8", errors="replace")
        log(f"[gate] buildkite-agent annotate: {'done' if done.returncode == 0 else done.stderr.strip()[:200]}")
    elif os.environ.get("BUILDKITE"):
        log("[gate] BUILDKITE is set but buildkite-agent is not on PATH: annotation left in the reports folder")
