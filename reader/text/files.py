"""Reading UTF-8 text files: line by line (plain or gzipped), or one JSON document, with errors that name the file."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import first_clause


def numbered_lines(path: Path, what: str = "file", *, gzipped: bool = False) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded text with its line break) for each line of the UTF-8 file `path`.

    `what` names the expected kind of file in the error for a directory
    ("a JSONL file", "a file"). With `gzipped` the file is decompressed as
    it is read. A byte-order mark opening the file is dropped (editors on
    Windows write one; kept, it would join the first id). A missing or
    unreadable file, a line that is not UTF-8 and a truncated or corrupt gzip
    stream raise DilstoreError naming the file (and the line).
    """
    raw = _open_binary(path, what)
    if not gzipped:
        try:
            _refuse_compressed(path, raw.peek(HEAD_BYTES)[:HEAD_BYTES])
        except DilstoreError:
            raw.close()
            raise
    stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
    number = 0
    try:
        with raw, stream:
            for number, line in enumerate(stream, start=1):
                yield number, _decoded(path, number, line)
    except gzip.BadGzipFile as error:
        if number == 0:  # not even a gzip header: a plain file named .gz
            raise DilstoreError(
                f"{path}: not a gzip file ({error}); a plain text file needs a name without .gz"
            ) from None
        raise DilstoreError(f"{path}: not a complete gzip file (after line {number}: {error})") from None
    except (EOFError, zlib.error) as error:
        raise DilstoreError(f"{path}: not a complete gzip file (after line {number}: {error})") from None


def _open_binary(path: Path, what: str) -> io.BufferedReader:
    """`path` opened for reading bytes; a DilstoreError naming it when it is missing, a folder or unreadable."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise DilstoreError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DilstoreError(f"{path}: is a directory, not {what}") from None
    except OSError as error:
        raise DilstoreError(f"{path}: cannot be read ({error.strerror or error})") from None


def _decoded(path: Path, number: int, line: bytes) -> str:
    """Line `number` of `path` as text (line 1 without a byte-order mark); a DilstoreError naming file and line when
    it is not UTF-8, or when a later line opens with a byte-order mark.

    Files joined together (`cat a.qrels b.qrels`, one saved by a Windows editor) leave a mark at the start of a
    later line. Read as text it joined the line's first column: a TREC file's qid "\ufeff207786" became a query of
    its own, scored as unjudged or unretrieved, and the metrics moved without a word (rank48 F1).
    """
    if number == 1 and (encoding := wide_encoding(line)) is not None:
        raise wide_text_refusal(str(path), encoding)
    try:
        text = line.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as error:
        raise DilstoreError(f"{path}:{number}: not UTF-8 text (byte {error.start + 1} of the line)") from None
    if text.startswith("\ufeff"):
        where = "with two byte-order marks (U+FEFF)" if number == 1 else (
            "with a byte-order mark (U+FEFF), which only a file's first line may hold")
        raise DilstoreError(f"{path}:{number}: the line begins {where}: were files joined together? Remove it")
    return text


# The byte-order marks of UTF-32 and UTF-16 (UTF-32's first: UTF-32LE's opens with UTF-16LE's), with the name
# `iconv -f` knows the text by, and how many of the first bytes tell such text without one.
_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
# Without a mark, ASCII text: (name, bytes per character, where in it the character's byte is). UTF-32 is looked
# at first, as its NULs also fit UTF-16's pattern.
_WIDE_LAYOUTS = (("UTF-32LE", 4, 0), ("UTF-32BE", 4, 3), ("UTF-16LE", 2, 0), ("UTF-16BE", 2, 1))
_WIDE_SNIFF_BYTES = 32


def wide_encoding(head: bytes) -> str | None:
    """The encoding of a file beginning `head` when it is UTF-16 or UTF-32 text, as `iconv -f` names it: "UTF-16"
    or "UTF-32" with a byte-order mark; "UTF-16LE", "UTF-16BE", "UTF-32LE" or "UTF-32BE" for ASCII with NUL bytes
    beside every character; else None. Read as UTF-8, its first line was quoted back as `'\\x00{\\x00"\\x00i...'`.

    A UTF-32 file was called UTF-16 (its mark and NULs fit UTF-16's too), and the hint's `iconv -f UTF-16` made of
    it UTF-8 text with a NUL after every character, refused again as UTF-16; without a mark, `iconv -f UTF-16`
    reads big-endian text as little-endian (glibc) or the other way round (macOS's libiconv) (left58 F1).
    """
    for mark, name in _WIDE_BOMS:
        if head.startswith(mark):
            return name
    start = head[:_WIDE_SNIFF_BYTES]
    if len(start) < 4:
        return None
    for name, width, text_at in _WIDE_LAYOUTS:
        if not any(byte for index, byte in enumerate(start) if index % width != text_at):
            return name
    return None


def wide_text_refusal(
    where: str, encoding: str, files: str = "dilstore reads its input files as UTF-8"
) -> DilstoreError:
    """The error for a file whose `wide_encoding` is `encoding` (Windows "Unicode", PowerShell's `>`), named by
    `where`; one wording for every input (left57 F3). Outside precompute one said "not UTF-8 text (byte 1 of the
    line)", and one without a byte-order mark was read on: a qrels file's "grade '\\x001\\x00' is not an integer"."""
    return DilstoreError(f"{where}: it looks like {encoding[:6]} text; {files}: convert it (e.g. `iconv -f {encoding} "
                         "-t UTF-8`)")  # fmt: skip


# Compressed formats by their first bytes: (name, magic, the suffix that names them). bzip2's "BZh" is text
# too, so `compression_of` also wants its block-size digit and the first block's (or an empty stream's) magic.
COMPRESSIONS = (
    ("gzip", b"\x1f\x8b", ".gz"),
    ("bzip2", b"BZh", ".bz2"),
    ("xz", b"\xfd7zXZ\x00", ".xz"),
    ("zstd", b"\x28\xb5\x2f\xfd", ".zst"),
)
_BZIP2_BLOCK_MAGIC = (b"1AY&SY", b"\x17rE8P\x90")
HEAD_BYTES = 10  # enough of a file's start for `compression_of`


def compression_of(head: bytes) -> tuple[str, str] | None:
    """(name, suffix) of the compressed format whose file begins with `head` (its first HEAD_BYTES), or None."""
    for name, magic, suffix in COMPRESSIONS:
        if not head.startswith(magic):
            continue
        if name == "bzip2" and not (head[3:4].isdigit() and head[3:4] != b"0" and head[4:10] in _BZIP2_BLOCK_MAGIC):
            continue
        return name, suffix
    return None


def _refuse_compressed(path: Path, head: bytes) -> None:
    """A DilstoreError saying so when `head`, the start of a file read as text, is that of a compressed file."""
    found = compression_of(head)
    if found is not None:
        raise DilstoreError(f"{path}: a {found[0]}-compressed file, read here as plain text; decompress it first")


def read_json(path: str | Path) -> Any:
    """Parse a UTF-8 JSON file (a byte-order mark opening it is dropped); every failure is a DilstoreError naming the
    file. A number of over 4,300 digits is a ValueError of Python's int(), no JSONDecodeError: it ended `evaluate-qa
    --questions`, `evaluate-rc` and the other readers of SQuAD, prediction and model files with a traceback (fuzz60
    F3)."""
    path = Path(path)
    try:
        with _open_binary(path, "a JSON file") as handle:
            data = handle.read()
        if (encoding := wide_encoding(data)) is not None:
            raise wide_text_refusal(str(path), encoding)
        return json.loads(data.decode("utf-8-sig"))
    except OSError as error:
        raise DilstoreError(f"{path}: cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        _refuse_compressed(path, data)
        raise DilstoreError(f"{path}: not UTF-8 text (byte {error.start + 1})") from None
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno}"
        raise DilstoreError(f"{path}: not valid JSON ({where}: {error.msg})") from None
    except ValueError as error:  # an integer of over 4,300 digits, which int() refuses (fuzz60 F3)
        raise DilstoreError(f"{path}: not JSON this reads ({first_clause(error)})") from None
    except RecursionError:  # Python's parser recurses once per level (hostile46 F4)
        raise DilstoreError(f"{path}: its JSON is nested too deep to read") from None


def json_line(line: str, where: str) -> Any:
    """The JSON value one JSONL line holds, its line break left out (parsed with it, a line cut short was "Invalid
    control character at" its end, longrun45 F7); a DilstoreError naming `where` (FILE:LINE) otherwise. A line
    nested thousands of levels deep was a RecursionError and a traceback (`evaluate-qa --questions`, fuzz60 F1).
    """
    try:
        return json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as error:
        raise DilstoreError(f"{where}: not valid JSON (column {error.colno}: {error.msg})") from None
    except ValueError as error:  # an integer of over 4,300 digits (fuzz60 F3)
        raise DilstoreError(f"{where}: not JSON this reads ({first_clause(error)})") from None
    except RecursionError:  # Python's parser recurses once per level, as in `read_json`
        raise DilstoreError(f"{where}: its JSON is nested too deep to read") from None


def read_json_object(path: str | Path, what: str = "a JSON object") -> dict[str, Any]:
    """`read_json` of a file that must hold an object; a DilstoreError "PATH: not WHAT" when it holds another value."""
    document = read_json(path)
    if not isinstance(document, dict):
        raise DilstoreError(f"{path}: not {what}")
    return document
