"""A damaged journal is read up to its damage, never a traceback: the same command goes on from the parts before it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dilstore.runners.journal import JOURNAL_FORMAT, Journal, journal_path

SETTINGS = {"questions": "q.jsonl", "top_p": 29}
HEADER = json.dumps({"journal": JOURNAL_FORMAT, "settings": SETTINGS}) + "\n"
PART = json.dumps({"part": 0, "record": {"q1": "Paris"}}) + "\n"
TOO_DEEP = "[" * 100_000 + "]" * 100_000 + "\n"


@pytest.mark.parametrize(("content", "parts"), [
    (TOO_DEEP + PART, {}),
    (HEADER + PART + TOO_DEEP, {0: {"q1": "Paris"}}),
])
def test_a_journal_line_nested_too_deep_ends_what_is_read(tmp_path: Path, content: str, parts: dict) -> None:
    """(fuzz60 F5) A journal line nested 100 000 levels deep, its header or a part, was a RecursionError traceback
    as `evaluate-qa`, `evaluate-rc` or `rerank` resumed; it now ends what is read, as a line a kill cut short."""
    output = tmp_path / "predictions.json"
    journal_path(output).write_text(content, encoding="utf-8")
    with Journal(output, SETTINGS) as journal:
        assert journal.parts == parts
