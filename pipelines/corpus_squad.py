"""SQuAD JSON files: each paragraph ("context") is one document.

Document id `{article_title}#p{paragraph_index}` (the title as SQuAD writes it,
with underscores; the index counts from 0 within the article), so the same file
gives the same ids on every run. The document title is the article title with
underscores shown as spaces.

A SQuAD file is a single JSON value, so it is read whole (the official files
are 5 and 30 MB); the documents still come out one at a time. A file that is
not valid UTF-8 or JSON, or not laid out as SQuAD, gives one `Rejected` naming
the line (or "whole file" where the JSON decoder names none: nesting too deep,
an integer too long to convert), and no documents; the run goes on with its
other inputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dilstore.pipelines.documents import DEFAULT_MAX_DOCUMENT_BYTES, Record, Rejected, make_document
from dilstore.pipelines.source_files import DAMAGED_STREAM_ERRORS, UTF8_BOM, open_source


def read_squad(path: str | Path, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Iterator[Record]:
    """One `Document` or `Rejected` per paragraph, articles and paragraphs in file order.

    Raises DilstoreError at once when the file is missing.
    """
    return _squad_records(str(path), open_source(path), max_bytes)


def paragraph_id(article_title: str, paragraph_index: int) -> str:
    """The document id of a SQuAD paragraph: `{article_title}#p{paragraph_index}`."""
    return f"{article_title}#p{paragraph_index}"


def _squad_records(source: str, stream: BinaryIO, max_bytes: int) -> Iterator[Record]:
    try:
        with stream:
            raw = stream.read()
    except DAMAGED_STREAM_ERRORS as error:
        yield Rejected(source, "whole file", f"truncated or corrupt file: {error}")
        return
    raw = raw.removeprefix(UTF8_BOM)  # JSONL, TSV and XML take one; json.loads refused the whole file for it
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        yield Rejected(source, line, f"invalid UTF-8 at byte {error.start} of the file")
        return
    try:
        squad = json.loads(text)
    except json.JSONDecodeError as error:
        yield Rejected(source, error.lineno, f"bad JSON: {error.msg} at column {error.colno}")
        return
    except (ValueError, RecursionError) as error:  # an integer of over 4,300 digits; nesting deeper than the stack
        yield Rejected(source, "whole file", f"bad JSON: {error}")
        return
    articles = squad.get("data") if isinstance(squad, dict) else None
    if not isinstance(articles, list):
        yield Rejected(source, 1, "not a SQuAD file: no 'data' list of articles")
        return
    for index, article in enumerate(articles):
        yield from _article_records(source, index, article, max_bytes)


def _article_records(source: str, index: int, article: Any, max_bytes: int) -> Iterator[Record]:
    title = article.get("title") if isinstance(article, dict) else None
    if not isinstance(title, str) or not title.strip():
        yield Rejected(source, f"article {index}", "bad record: article without a title")
        return
    paragraphs = article.get("paragraphs")
    if not isinstance(paragraphs, list):
        yield Rejected(source, title, "bad record: article without a 'paragraphs' list")
        return
    display_title = title.replace("_", " ")
    for number, paragraph in enumerate(paragraphs):
        doc_id = paragraph_id(title, number)
        context = paragraph.get("context") if isinstance(paragraph, dict) else None
        if not isinstance(context, str):
            yield Rejected(source, doc_id, "bad record: paragraph without a 'context' string")
            continue
        yield make_document(source, doc_id, doc_id, display_title, context, max_bytes)
