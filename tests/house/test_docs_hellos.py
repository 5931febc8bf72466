"""Every example hello the docs show is one the current protocol accepts: the version the
harness speaks, the fields and limits a hello is decoded against (formats/protocol.decode),
and feature names the vocabulary knows (a hello naming an unknown feature is refused)."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import REPO
from conformance.formats import protocol

DOCS = [REPO / "README.md", REPO / "engines" / "PROTOCOL.md", REPO / "scenarios" / "README.md",
        *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "engines" / "cpp").glob("*.md"))]


def hellos() -> list[tuple[str, str]]:
    """(where, text) of each JSON object in the docs whose type is hello, read from where it
    opens to where the JSON ends (over several lines)."""
    found = []
    decoder = json.JSONDecoder()
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r'\{\s*"type":\s*"hello"', text):
            value, end = decoder.raw_decode(text, match.start())
            found.append((f"{path.relative_to(REPO)}", text[match.start():end]))
    return found


def test_the_docs_show_hellos():
    where = {w for w, _ in hellos()}
    assert {"docs/porting.md", "engines/PROTOCOL.md"} <= where, where


@pytest.mark.parametrize("where, text", hellos(), ids=lambda x: x if x.endswith(".md") else "")
def test_each_hello_in_the_docs_is_accepted_by_the_current_protocol(where, text):
    line = json.dumps(json.loads(text)).encode()
    hello = protocol.decode(line, expect=("hello",))
    assert hello["protocol"] == protocol.PROTOCOL_VERSION, (where, hello["protocol"])
