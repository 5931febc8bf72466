"""Every relative link in README.md, docs/*.md, scenarios/README.md and engines/PROTOCOL.md
points at a file that exists, and every #anchor at a heading of its page (GitHub's anchor rule).
No network: links to other sites are not followed."""

import re
from pathlib import Path

from tests.helpers import DOC_PAGES as PAGES, REPO
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to dashes,
    a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not (m := re.match(r"#{1,6} (.+)", line)):
            continue
        slug = re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken(page: Path, root: Path = REPO) -> list[str]:
    bad = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: another site
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            bad.append(f"{page.relative_to(root)}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            bad.append(f"{page.relative_to(root)}: {target}: no heading #{anchor} in {where.relative_to(root)}")
    return bad


def test_every_doc_link_resolves():
    assert len(PAGES) >= 7  # README, scenarios/README, PROTOCOL and the docs/ pages
    found = [b for page in PAGES for b in broken(page)]
    assert found == [], "\n".join(found)


def test_a_broken_link_and_a_broken_anchor_are_named(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# The gate: verdicts\n## Goldens\n## Goldens\n")
    page.write_text("[ok](b.md#the-gate-verdicts) [ok](b.md#goldens-1) [web](https://x.y/z)\n"
                    "[gone](c.md) [no anchor](b.md#pins) [self](#nowhere)\n```\n[code](d.md)\n```\n")
    assert broken(page, tmp_path) == ["a.md: c.md: no such file", "a.md: b.md#pins: no heading #pins in b.md",
                            "a.md: #nowhere: no heading #nowhere in a.md"]
