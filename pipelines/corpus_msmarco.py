"""MS MARCO passage collections: `pid<TAB>text` per line (collection.tsv).

The id is everything before the first tab, exactly as written (TREC runs and
qrels refer to it); the text is everything after it, so a tab inside a text
is kept. A file whose first two lines have more than two columns is refused
before the run (corpora.check_format): its columns would be glued into every text.
A first line that names the columns (`id<TAB>text`, `pid<TAB>passage`, ...) is
skipped as a header, not stored as a passage of id "id". Documents have no
title. Blank lines are passed over.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dilstore.pipelines.documents import DEFAULT_MAX_DOCUMENT_BYTES, Record, Rejected, Skipped, make_document
from dilstore.pipelines.source_files import Line, decode_line, open_source, source_lines

# Lines longer than the text limit plus this allowance for the id are rejected unparsed.
_ID_ALLOWANCE_BYTES = 1 << 10
# A first line of these two column names is a header.
_ID_HEADERS = frozenset({"id", "pid", "docid", "doc_id", "passage_id", "_id"})
_TEXT_HEADERS = frozenset({"text", "passage", "contents", "content", "body", "document"})


def read_msmarco(path: str | Path, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Iterator[Record]:
    """One `Document` or `Rejected` per non-blank line of a TSV collection (plain or .gz), in file order.

    Raises DilstoreError at once when the file is missing.
    """
    return _msmarco_records(str(path), open_source(path), max_bytes)


def _msmarco_records(source: str, stream: BinaryIO, max_bytes: int) -> Iterator[Record]:
    for line in source_lines(source, stream, max_bytes + _ID_ALLOWANCE_BYTES):
        record = line if isinstance(line, Rejected) else msmarco_record(source, line, max_bytes)
        if record is not None:
            yield record


def msmarco_record(source: str, line: Line, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Record | None:
    """The record one TSV line holds; None for a blank line."""
    text = decode_line(source, line, max_bytes)
    if isinstance(text, Rejected):
        return text
    if not text.strip():
        return None
    pid, tab, passage = text.partition("\t")
    if not tab:
        return Rejected(source, line.number, "bad record: no tab between id and text")
    if line.number == 1 and pid.strip().lower() in _ID_HEADERS and passage.strip().lower() in _TEXT_HEADERS:
        return Skipped(source, 1, f"a header line ({pid.strip()}, {passage.strip()})")
    return make_document(source, line.number, pid, "", passage, max_bytes)
