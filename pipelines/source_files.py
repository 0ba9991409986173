"""Opening corpus files as byte streams and reading them line by line, bounded.

Readers work on bytes and decode each record themselves, so that invalid UTF-8
in one record becomes a dead letter for that record instead of an exception
that ends the whole file.
"""

from __future__ import annotations

import bz2
import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from dilstore.pipelines.documents import Rejected
from dilstore.storage.errors import DilstoreError

# The byte-order mark some editors put first in a UTF-8 file; every reader drops it.
UTF8_BOM = b"\xef\xbb\xbf"
# What reading a truncated or corrupt compressed file raises: gzip's EOFError and BadGzipFile (an OSError), bzip2's
# OSError, and zlib.error, neither of those, for a damaged deflate stream ("invalid distance too far back"): a .gz with
# such damage ended `precompute` with a traceback, or a worker's read with an exception (fuzz60 F2).
DAMAGED_STREAM_ERRORS = (EOFError, OSError, zlib.error)
_CHUNK_BYTES = 1 << 20


def open_source(path: str | Path) -> BinaryIO:
    """The file as a binary stream, decompressed on the fly for `.gz` and `.bz2` (in any case, as the format is told:
    `PAGES.XML.BZ2` was read compressed, and refused as not XML).

    Raises DilstoreError when the file does not exist or is not a file.
    """
    path = Path(path)
    if not path.exists():
        raise DilstoreError(f"corpus file not found: {path}")
    if not path.is_file():
        raise DilstoreError(f"corpus path is not a file: {path}")
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, "rb")
    if suffix == ".bz2":
        return bz2.open(path, "rb")
    return path.open("rb")


class ReadUpToDamage:
    """A (decompressing) stream whose `read(n)` hands over every byte decoded before a truncated or corrupt part,
    and raises the error at the next read.

    `BufferedReader.read(n)` drops the bytes it gathered when the decompressor
    raises: the XML parser reads 16 KiB at a time, so a cut `.xml.bz2` lost up
    to 16 KiB of complete pages before the damage, counted nowhere.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._error: BaseException | None = None

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all with -1); the damage found during a read comes at the next call, after the bytes
        read before it."""
        if self._error is not None:
            raise self._error
        parts: list[bytes] = []
        got = 0
        try:
            while size < 0 or got < size:
                part = self._stream.read1(size - got if size >= 0 else _CHUNK_BYTES)  # type: ignore[attr-defined]
                if not part:
                    break
                parts.append(part)
                got += len(part)
        except DAMAGED_STREAM_ERRORS as error:
            if not parts:
                raise
            self._error = error
        return b"".join(parts)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> ReadUpToDamage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True)
class Line:
    """One line of a file: its 1-based number and its bytes without the line ending.

    `data` is None when the line was longer than the limit; `size` is then its
    full length, counted without keeping it in memory.
    """

    number: int
    data: bytes | None
    size: int


def bounded_lines(stream: BinaryIO, max_bytes: int) -> Iterator[Line]:
    """Every line of the stream, streaming; lines over `max_bytes` come back without their bytes.

    The line ending (`\\n` or `\\r\\n`) and a UTF-8 byte-order mark on the first
    line are removed. Memory stays bounded by `max_bytes` even for a file that
    has no line breaks at all.
    """
    number = 0
    while True:
        data = stream.readline(max_bytes + 2)  # room for the content and "\r\n"
        if not data:
            return
        number += 1
        complete = data.endswith(b"\n") or len(data) < max_bytes + 2
        rest = 0 if complete else _skip_rest_of_line(stream)
        if number == 1:
            data = data.removeprefix(UTF8_BOM)
        content = data.removesuffix(b"\n").removesuffix(b"\r") if complete else data
        size = len(content) + rest
        yield Line(number, content if size <= max_bytes else None, size)


def source_lines(source: str, stream: BinaryIO, max_bytes: int) -> Iterator[Line | Rejected]:
    """`bounded_lines` of a corpus file, closing it at the end.

    A compressed file that is truncated or corrupt ends with one `Rejected`
    saying after which line reading stopped, instead of an exception.
    """
    last = 0
    with stream:
        try:
            for line in bounded_lines(stream, max_bytes):
                last = line.number
                yield line
        except DAMAGED_STREAM_ERRORS as error:
            yield Rejected(source, f"after line {last}", f"truncated or corrupt file: {error}")


def _skip_rest_of_line(stream: BinaryIO) -> int:
    """Read past the end of the current line; the number of bytes skipped, ending excluded."""
    skipped = 0
    while True:
        chunk = stream.readline(_CHUNK_BYTES)
        if chunk.endswith(b"\n"):
            return skipped + len(chunk.removesuffix(b"\n").removesuffix(b"\r"))
        if not chunk:
            return skipped
        skipped += len(chunk)


def decode_line(source: str, line: Line, max_text_bytes: int) -> str | Rejected:
    """The line as text, or the `Rejected` for a line that is too long or not UTF-8."""
    if line.data is None:
        return Rejected(
            source,
            line.number,
            f"document too large: record of {line.size:,} bytes (limit {max_text_bytes:,} bytes of text)",
        )
    try:
        return line.data.decode("utf-8")
    except UnicodeDecodeError as error:
        return Rejected(source, line.number, f"invalid UTF-8 at byte {error.start} of the line")
