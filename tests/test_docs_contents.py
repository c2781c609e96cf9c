"""The normative documents' tables of contents list every section, with links GitHub resolves.

``docs/protocol.md`` and ``docs/control-table.md`` are normative; a reader finds a rule by its
section, so a heading added without its line in the contents (or a stale line) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
CONTENTS = "## Contents"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), each
    space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> list[tuple[int, str]]:
    """(level, title) of every ``##``/``###`` heading after the contents, outside code fences."""
    out, fenced, after = [], False, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line == CONTENTS:
            after = True
        elif not fenced and after and (m := re.match(r"(#{2,3}) (.+)", line)):
            out.append((len(m.group(1)), m.group(2)))
    return out


def contents_lines(text: str) -> list[str]:
    block = text.split(CONTENTS + "\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in block.splitlines() if line.strip().startswith("* [")]


@pytest.mark.parametrize("name", ["protocol.md", "control-table.md"])
def test_a_normative_document_says_so_and_lists_every_section(name: str) -> None:
    text = (DOCS / name).read_text(encoding="utf-8")
    assert "Status: **normative**" in text.split("\n## ", 1)[0], f"{name} does not state it is normative"
    assert CONTENTS in text, f"{name} has no contents"
    want = [f"{'  ' * (level - 2)}* [{title.replace('`', '')}](#{slug(title)})" for level, title in sections(text)]
    assert contents_lines(text) == want


def test_slug_matches_githubs_rule_on_our_headings() -> None:
    assert slug("1. The authority") == "1-the-authority"
    assert slug("4.1 Accepted-batch manifest — `schema: lightmetrics.accepted_batch.v1`") == \
        "41-accepted-batch-manifest--schema-lightmetricsaccepted_batchv1"
