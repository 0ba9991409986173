"""Ranking training files: gzipped JSONL triples and the paragraphs they point at.

    triples.jsonl.gz     {"qid": str, "query": str, "pos": paragraph id, "negs": [paragraph id, ...]} per line
    paragraphs.jsonl.gz  {"id": str, "contents": str} per line (pyserini's JsonCollection fields)

They are written with a zero gzip timestamp and no file name in the header,
so the same triples give the same bytes, and read back with every problem a
DilstoreError naming the file and the 1-based line: malformed JSON, a
missing or mistyped field, a duplicate paragraph id, a triple whose positive
or negative id is not in the paragraphs file, or too few negatives. Files
whose name does not end in .gz are read as plain JSONL.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dilstore.reader.text.files import json_line, numbered_lines
from dilstore.reader.text.surrogates import require_unicode
from dilstore.storage.atomic_files import atomic_write_bytes
from dilstore.storage.errors import DilstoreError

TRIPLES_FILE = "triples.jsonl.gz"
PARAGRAPHS_FILE = "paragraphs.jsonl.gz"
# What makes a line blank: the bytes bytes.strip() removes, not the wider Unicode whitespace of str.strip().
_ASCII_WHITESPACE = " \t\n\r\x0b\x0c"


@dataclass(frozen=True)
class Triple:
    """One training group: a query, its positive paragraph id and its negative paragraph ids."""

    qid: str
    query: str
    positive: str
    negatives: tuple[str, ...]
    line: int | None = field(default=None, compare=False)  # of the triples file it was read from, if any

    def to_dict(self) -> dict[str, Any]:
        """The JSONL object: `{"qid", "query", "pos", "negs"}`."""
        return {"qid": self.qid, "query": self.query, "pos": self.positive, "negs": list(self.negatives)}


def write_triples(path: Path, triples: Iterable[Triple]) -> int:
    """Write triples as gzipped JSONL (deterministic bytes); returns how many were written."""
    return _write_jsonl_gz(path, (triple.to_dict() for triple in triples))


def write_paragraphs(path: Path, paragraphs: Mapping[str, str]) -> int:
    """Write `{id: text}` as gzipped `{"id", "contents"}` JSONL in the mapping's order; returns the count."""
    return _write_jsonl_gz(path, ({"id": pid, "contents": text} for pid, text in paragraphs.items()))


def read_paragraphs(path: Path) -> dict[str, str]:
    """`{id: text}` from a paragraphs file, in file order; ids must be unique and texts non-empty."""
    paragraphs: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, record in _read_jsonl(path):
        where = f"{path}:{number}"
        pid = _string(record, "id", where)
        contents = _string(record, "contents", where)
        if not contents.strip():
            raise DilstoreError(f"{where}: paragraph {pid!r} has empty contents")
        if pid in paragraphs:
            raise DilstoreError(f"{where}: paragraph id {pid!r} appears twice (first on line {first_line[pid]})")
        paragraphs[pid], first_line[pid] = contents, number
    if not paragraphs:
        raise DilstoreError(f"{path}: no paragraphs")
    return paragraphs


def read_triples(
    path: Path, paragraphs: Mapping[str, str], paragraphs_file: Path, negatives: int | None = None
) -> list[Triple]:
    """Triples from `path`, each checked against the paragraph ids of `paragraphs_file`.

    With `negatives`, every line must hold at least that many and only the
    first `negatives` are kept (a uniformly random subset, as the builder
    writes them in sampled order). A line's negatives must be distinct (a
    repeat would put one paragraph twice into one list or softmax group); a
    qid may recur on other lines, as in MS MARCO's triples, with other
    positives or negatives.
    """
    triples = []
    for number, record in _read_jsonl(path):
        where = f"{path}:{number}"
        qid = _string(record, "qid", where)
        query = _string(record, "query", where)
        if not query.strip():
            raise DilstoreError(f"{where}: the query of {qid!r} is empty")
        positive = _string(record, "pos", where)
        negs = record.get("negs")
        if not isinstance(negs, list) or not all(isinstance(pid, str) for pid in negs):
            raise DilstoreError(f'{where}: "negs" must be a list of paragraph id strings')
        for pid in (positive, *negs):
            if pid not in paragraphs:
                raise DilstoreError(f"{where}: paragraph id {pid!r} is not in {paragraphs_file}")
        if positive in negs:
            raise DilstoreError(f"{where}: the positive {positive!r} of {qid!r} is also listed as a negative")
        repeated = next((pid for n, pid in enumerate(negs) if pid in negs[:n]), None)
        if repeated is not None:
            raise DilstoreError(f"{where}: the negative {repeated!r} of {qid!r} is listed twice")
        if negatives is not None and len(negs) < negatives:
            raise DilstoreError(f"{where}: {qid!r} has {len(negs)} negatives, fewer than the {negatives} asked for")
        kept = negs if negatives is None else negs[:negatives]
        triples.append(Triple(qid=qid, query=query, positive=positive, negatives=tuple(kept), line=number))
    if not triples:
        raise DilstoreError(f"{path}: no triples")
    return triples


def _write_jsonl_gz(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """Gzipped JSONL written atomically (storage/atomic_files.py): no reader ever sees half a file."""
    path = Path(path)
    buffer = io.BytesIO()
    count = 0
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as handle:
        for record in records:
            handle.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
            count += 1
    try:
        atomic_write_bytes(path, buffer.getvalue(), named_by_user=True)
    except OSError as error:
        raise DilstoreError(f"cannot write {path}: {error.strerror or error}") from None
    return count


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, JSON object) for each non-blank line of a gzipped or plain JSONL file."""
    path = Path(path)
    for number, line in numbered_lines(path, "a JSONL file", gzipped=path.name.endswith(".gz")):
        if line.strip(_ASCII_WHITESPACE):
            yield number, _parse_line(path, number, line)


def _parse_line(path: Path, number: int, line: str) -> dict[str, Any]:
    """One JSONL line as a JSON object; a DilstoreError naming file and line otherwise."""
    record = json_line(line, f"{path}:{number}")
    if not isinstance(record, dict):
        raise DilstoreError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
    return record


def _string(record: dict[str, Any], key: str, where: str) -> str:
    """record[key], which must be a non-empty string of Unicode text (no lone surrogate)."""
    value = record.get(key)
    if not isinstance(value, str) or not value:
        raise DilstoreError(f"{where}: {key!r} must be a non-empty string, got {json.dumps(value)[:60]}")
    return require_unicode(value, f"{where}: {key!r}")
