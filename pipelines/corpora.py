"""Reading a corpus file of any supported format: the entry point for pipelines and the CLI.

Every reader is a plain generator over one file that yields, in file order, a
`Document` per good record, a `Rejected` per malformed one (the dead-letter
output) and a `Skipped` per record left out on purpose (Wikipedia redirects and
non-article pages). Readers stream the file (SQuAD excepted: one JSON value)
and decode each record strictly as UTF-8, so bad input never raises; only a
missing file or an unknown format raises DilstoreError, at once.

Formats:
    jsonl      {"id","contents"} (pyserini JsonCollection) or {"id","title","text"}; .jsonl
    msmarco    pid<TAB>text per line (MS MARCO collection.tsv); .tsv
    squad      SQuAD JSON, one document per paragraph; .json
    wikipedia  pages-articles XML dump; .xml

Each is also read compressed, named with .gz or .bz2 after its suffix (`open_source`).

Duplicate ids are not caught per file: see `pipelines.duplicate_ids`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dilstore.pipelines.corpus_jsonl import read_jsonl
from dilstore.pipelines.corpus_msmarco import read_msmarco
from dilstore.pipelines.corpus_squad import read_squad
from dilstore.pipelines.corpus_wikipedia import read_wikipedia
from dilstore.pipelines.documents import DEFAULT_MAX_DOCUMENT_BYTES, Document, Record, Rejected, Skipped
from dilstore.pipelines.source_files import DAMAGED_STREAM_ERRORS, UTF8_BOM, open_source
from dilstore.reader.text.files import COMPRESSIONS, HEAD_BYTES, compression_of, wide_encoding, wide_text_refusal
from dilstore.storage.errors import DilstoreError

__all__ = [
    "DEFAULT_MAX_DOCUMENT_BYTES",
    "FORMATS",
    "Document",
    "ReadTask",
    "Record",
    "Rejected",
    "Skipped",
    "check_format",
    "format_for_path",
    "read_corpus",
]

Reader = Callable[..., Iterator[Record]]


@dataclass(frozen=True)
class ReadTask:
    """One input file to read: its path (absolute, as workers see it) and corpus format.

    Here rather than beside the pipeline steps (pipelines/routing.py, which imports torch and transformers), so that
    `precompute` checks its inputs before those load (ci59 F2)."""

    path: str
    format: str


FORMATS: dict[str, Reader] = {
    "jsonl": read_jsonl,
    "msmarco": read_msmarco,
    "squad": read_squad,
    "wikipedia": read_wikipedia,
}

# File name endings that tell the format, each also with a compression's suffix after it (`open_source` reads both).
_FORMAT_BY_SUFFIX = {".xml": "wikipedia", ".jsonl": "jsonl", ".tsv": "msmarco", ".json": "squad"}


def read_corpus(path: str | Path, format: str, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Iterator[Record]:
    """The records of one corpus file in the named format (see the module docstring).

    Raises DilstoreError when the format is unknown or the file is missing.
    """
    reader = FORMATS.get(format)
    if reader is None:
        raise DilstoreError(f"unknown corpus format {format!r}; expected one of: {', '.join(FORMATS)}")
    if max_bytes < 1:
        raise DilstoreError(f"the maximum document size must be at least 1 byte, not {max_bytes}")
    return reader(path, max_bytes=max_bytes)


def format_for_path(path: str | Path) -> str:
    """The corpus format a file name implies (`corpus.jsonl.gz` → "jsonl"; `.gz` or `.bz2` may follow any).

    Raises DilstoreError when the name does not tell, asking for the format by name.
    """
    name = Path(Path(path).name.lower())
    if name.suffix in COMPRESSED_MAGIC:  # corpus.jsonl.gz: the format's suffix is the one before
        name = name.with_suffix("")
    format = _FORMAT_BY_SUFFIX.get(name.suffix)
    if format is not None:
        return format
    raise DilstoreError(f"cannot tell the corpus format of {path} from its name; give --format, one of: "
                        f"{', '.join(FORMATS)}")


def _is_json_object(line: bytes) -> bool:
    """Whether `line` is a whole JSON object: False for one that does not parse, however it fails (a line nested
    deeper than the stack was a RecursionError traceback from `check_format`, complex61 F5)."""
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, an integer of over 4,300 digits; nesting too deep
        return False


def _json_lines_opening(lines: list[bytes]) -> bool:
    """A JSON object per line: not an object spread over lines (`{` alone), not a SQuAD file's opening."""
    return lines[0].startswith(b"{") and lines[0] != b"{" and not lines[0].startswith((b'{"data"', b'{"version"'))


def _one_json_document_opening(lines: list[bytes]) -> bool:
    """One JSON object: not a whole object on the first line with another object opening the next (JSON Lines,
    often named .json: it ran the whole job to an empty store, every record dead-lettered as "Extra data")."""
    one_a_line = len(lines) > 1 and lines[1].startswith(b"{") and _is_json_object(lines[0])
    return lines[0].startswith(b"{") and not one_a_line


# What the first two non-blank lines of a file in each format look like, and how to say it.
_FORMAT_OPENINGS = {
    "jsonl": (_json_lines_opening, "a JSON object per line (a SQuAD file is --format squad)"),
    # Two columns: a file of more (MS MARCO documents, DPR's id/text/title) would glue them into every text. One
    # of the first two lines with one tab will do, as a passage may hold a tab.
    "msmarco": (lambda lines: b"\t" in lines[0] and any(line.count(b"\t") == 1 for line in lines),
                "pid<TAB>text lines of two columns (convert others to JSONL)"),
    "squad": (_one_json_document_opening, "one JSON object, not one per line (that is --format jsonl)"),
    "wikipedia": (lambda lines: lines[0].startswith(b"<"), "XML"),
}
# The formats read a record a line, by `\n` (a `\r` before it is dropped).
_LINE_FORMATS = ("jsonl", "msmarco")
# How far into a file the first non-blank line is looked for.
_SNIFF_BYTES = 1 << 16
# For `squad`, how far the first line is read on to see whether a whole JSON object ends it and another line
# follows (JSON Lines named .json): a document-sized first record passes 64 KiB.
_SQUAD_SNIFF_BYTES = 16 << 20
# The first bytes of every file of the compressions `open_source` reads, by suffix (lower case).
COMPRESSED_MAGIC = {suffix: magic for _, magic, suffix in COMPRESSIONS if suffix in (".gz", ".bz2")}


def _named_as(head: bytes, suffix: str) -> str:
    """What to do with a file named `suffix` that begins with `head`, which is not that compression's start."""
    found = compression_of(head)
    if found is None:
        return f"a plain text file needs a name without {suffix}"
    name, actual = found
    if actual not in COMPRESSED_MAGIC:
        return f"it is {name}-compressed, which dilstore does not read: decompress it"
    return f"it is a {actual[1:]} file: name it with {actual} in place of {suffix}"


def check_format(path: str | Path, format: str) -> None:
    """A DilstoreError when the file's first non-blank line cannot begin a corpus of `format`.

    A wrong --format would otherwise dead-letter every record and finish with
    an empty store; this catches it before anything is written. An empty
    file passes (it simply holds no records).
    """
    looks_right, expected = _FORMAT_OPENINGS[format]
    suffix = Path(path).suffix.lower()
    if suffix in COMPRESSED_MAGIC:
        magic = COMPRESSED_MAGIC[suffix]
        with open(path, "rb") as raw:
            head = raw.read(HEAD_BYTES)
        if head and not head.startswith(magic):  # every record would be a dead letter, and the run exit 1 with nothing
            raise DilstoreError(f"--input {path}: not a {suffix[1:]} file; {_named_as(head, Path(path).suffix)}")
    with open_source(path) as stream:
        try:
            head = stream.read(_SQUAD_SNIFF_BYTES if format == "squad" else _SNIFF_BYTES)
        except DAMAGED_STREAM_ERRORS:
            return  # a damaged compressed file: the reader dead-letters it where it breaks
    found = None if suffix in COMPRESSED_MAGIC else compression_of(head)
    if found is not None:
        name, actual = found
        how = f"name it with {actual} at the end" if actual in COMPRESSED_MAGIC else f"dilstore does not read {name}"
        raise DilstoreError(f"--input {path}: it is {name}-compressed but has a plain name; {how}")
    if (encoding := wide_encoding(head)) is not None:
        raise wide_text_refusal(f"--input {path}", encoding, "corpus files are UTF-8")
    if format in _LINE_FORMATS and b"\r" in head and b"\n" not in head:  # read as one line: one merged record
        raise DilstoreError(f"--input {path}: its lines end in a bare carriage return (CR), which {format} files do "
                            "not use; convert them to newlines (e.g. `tr '\\r' '\\n'`)")  # fmt: skip
    lines = [line.strip() for line in head.removeprefix(UTF8_BOM).splitlines() if line.strip()][:2]
    if lines and not looks_right(lines):
        shown = lines[0][:40].decode("utf-8", "replace")
        raise DilstoreError(
            f"--format {format} does not fit {path}: {format} files hold {expected}, but it begins {shown!r}"
        )
