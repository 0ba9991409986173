"""JSON Lines corpora: one document object per line.

Two schemas are recognised per record: pyserini's JsonCollection
`{"id", "contents"}` (an optional "title" is kept) and `{"id", "title", "text"}`
(the title may be absent). Integer ids are accepted and kept as their decimal
string. Blank lines are not records and are passed over.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dilstore.pipelines.documents import DEFAULT_MAX_DOCUMENT_BYTES, Record, Rejected, make_document
from dilstore.pipelines.source_files import Line, decode_line, open_source, source_lines

# A JSON string escape (\u0001) takes up to 6 bytes for one byte of text, so a
# line longer than this cannot hold a document within the size limit; such a
# line is rejected without being parsed. The allowance covers id and title.
_ESCAPE_EXPANSION = 6
_FIELD_ALLOWANCE_BYTES = 1 << 16
_CR_LINE_END = re.compile(r"\r[ \t]*(?=\{)")  # a bare CR where a record could begin: a line end, read as none


def read_jsonl(path: str | Path, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Iterator[Record]:
    """One `Document` or `Rejected` per non-blank line of a JSONL file (plain or .gz), in file order.

    Raises DilstoreError at once when the file is missing; every problem inside
    the file becomes a `Rejected` naming its line.
    """
    return _jsonl_records(str(path), open_source(path), max_bytes)


def _jsonl_records(source: str, stream: BinaryIO, max_bytes: int) -> Iterator[Record]:
    line_limit = _ESCAPE_EXPANSION * max_bytes + _FIELD_ALLOWANCE_BYTES
    for line in source_lines(source, stream, line_limit):
        record = line if isinstance(line, Rejected) else jsonl_record(source, line, max_bytes)
        if record is not None:
            yield record


def jsonl_record(source: str, line: Line, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Record | None:
    """The record one JSONL line holds; None for a blank line."""
    text = decode_line(source, line, max_bytes)
    if isinstance(text, Rejected):
        return text
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return _bad_json(source, line.number, text, f"{error.msg} (column {error.colno})")
    except (ValueError, RecursionError) as error:
        return _bad_json(source, line.number, text, str(error))
    if not isinstance(value, dict):
        return Rejected(source, line.number, f"bad record: a JSON {type(value).__name__}, not an object")
    return _document_from_object(source, line.number, value, max_bytes)


def _bad_json(source: str, number: int, text: str, problem: str) -> Rejected:
    """The dead letter of a line that is not JSON, saying so when the line holds bare carriage returns: lines of CR
    ends in a file of newlines (a Mac file appended to a Unix one) are read as one line, their records as one
    "Extra data" dead letter (pipe48 F5). Only a CR followed by the opening of an object is taken for a line end: a
    CR inside a string (itself bad JSON) is not, and converting it to a newline would split the record."""
    returns = len(_CR_LINE_END.findall(text))
    joined = (f"; the line holds {returns:,} bare carriage return(s) (CR): records joined by CR line ends? Convert "
              "them to newlines" if returns else "")  # fmt: skip
    return Rejected(source, number, f"bad JSON: {problem}{joined}")


def _document_from_object(source: str, number: int, value: dict, max_bytes: int) -> Record:
    """Detect the schema of one decoded object and check its fields."""
    if "contents" in value and "text" in value:
        return Rejected(source, number, "bad record: both 'contents' and 'text' fields")
    field = "contents" if "contents" in value else "text" if "text" in value else None
    if field is None:
        return Rejected(source, number, "bad record: neither a 'contents' nor a 'text' field")
    text = value[field]
    if not isinstance(text, str):
        return Rejected(source, number, f"bad record: '{field}' is not a string")
    title = value.get("title")
    if title is None:
        title = ""
    elif not isinstance(title, str):
        return Rejected(source, number, "bad record: 'title' is not a string")
    return make_document(source, number, value.get("id"), title, text, max_bytes)
