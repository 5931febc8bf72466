"""A report page as a reader sees it: loaded by headless Chromium in a laptop-sized window, its
script run, its elements read back (tests/report/test_report_html.py, test_first_screen.py)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Elements(HTMLParser):
    """Every element of a page: (tag, attributes, its own text)."""

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, dict, list[str]]] = []
        self._open: list[list[str]] = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs), []))
        self._open.append(self.found[-1][2])

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        if self._open:
            self._open[-1].append(data)

    def having(self, tag: str, cls: str | None = None) -> list[tuple[dict, str]]:
        return [(a, "".join(t)) for g, a, t in self.found
                if g == tag and (cls is None or cls in a.get("class", "").split())]


SCREEN = (1366, 768)  # a laptop's screen: what a reviewer sees before scrolling


def render(page: Path) -> tuple[Elements, list[str]]:
    """The page's DOM after Chromium loaded it in a SCREEN-sized window and ran its script
    (which marks what the first screen shows), and its console errors."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         f"--window-size={SCREEN[0]},{SCREEN[1]}", "--hide-scrollbars", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "CONSOLE" in line and
              ("Uncaught" in line or "Error" in line)]
    dom = Elements()
    dom.feed(done.stdout)
    return dom, errors


def check_first_screen(dom: Elements) -> list[str]:
    """The first screen shows what failed: every row of the verdicts that did not pass, before
    the grid (folded), before the layers table. The rows' scenario names."""
    rows = [(a, text) for tag, a, text in ((g, a, "".join(t)) for g, a, t in dom.found)
            if tag == "tr" and a.get("data-failing")]
    assert rows, "no verdict that did not pass is listed"
    assert all(a.get("data-seen") == "1" for a, _ in rows), [a for a, _ in rows if a.get("data-seen") != "1"]
    order = [(g, a.get("class")) for g, a, _ in dom.found if g == "table"]
    assert order.index(("table", "not-passing")) < order.index(("table", "matrix"))
    if ("table", "layers") in order:
        assert order.index(("table", "matrix")) < order.index(("table", "layers"))
    # every status of a failing grid cell (`diverged+crash` too) has its row in the first table
    grid = within(dom, "matrix")
    statuses = {grid[i + 1][2].split()[0] for i, (tag, a, _) in enumerate(grid) if tag == "td" and a.get("data-failing")}
    assert statuses <= {text for tag, _, text in within(dom, "not-passing") if tag == "td"}, statuses
    return [text for _, text in dom.having("a") if text]


def within(dom: Elements, cls: str) -> list[tuple[str, dict, str]]:
    """The elements of the page's table of class `cls`, in order, each with its own text."""
    out, inside = [], False
    for tag, attrs, text in dom.found:
        if tag == "table":
            inside = cls in attrs.get("class", "").split()
        elif inside:
            out.append((tag, attrs, "".join(text)))
    return out
