"""Reading uncompressed arrays of a remote store by byte ranges: coalesced, in one concurrent round per fetch.

Over HTTP or object storage every request is a round trip, and often a billed
operation. zarr-python reads a sharded array slice by slice, each time the
shard index and then every inner chunk the slice touches, so a fetch of 100
passages cost 8 to 10 requests per passage. An uncompressed dilstore array
file is its rows back to back (storage/mapped.py's ContiguousLayout), so the
rows of one passage are one byte range of the file. This module gathers the
byte ranges of every column a fetch needs, merges ranges of the same file
that overlap or lie within COALESCE_GAP bytes of each other, and asks the
filesystem for all merged blocks at once (`cat_ranges`, concurrent on async
filesystems such as HTTP and S3). Only the requested bytes, plus the small
gaps merged over, are transferred; nothing is cached beyond the fetch.

Over HTTP(S) each answer is also checked against the file the reader opened
(`FileVersion`): a store rebuilt in place at its URL was read with the old
build's offsets into the new files, other passages' bytes with nothing said,
until the next manifest check up to 10 s later (stale54 F1). The ETag (or,
without one, the Last-Modified) and the total size in Content-Range of every
206 are compared with the first answer's for the same file, which the shard
read when it opened, and the size with the one its layout gives: a change is
a StoreChangedError at the read itself, without another request.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from dilstore.storage.format import StoreChangedError, StoreFormatError
from dilstore.storage.location import in_this_process
from dilstore.storage.mapped import ContiguousLayout
from dilstore.storage.read_failures import read_failure, refuse_special_file, retry_delay, worth_retrying

if TYPE_CHECKING:  # fsspec's HTTP module imports aiohttp (0.2 s), which a local store never needs
    from fsspec.implementations.http import HTTPFileSystem

# Byte ranges of one file closer than this are read as one block. A round trip to object storage costs
# tens of milliseconds, in which 256 KiB transfer many times over; the cap bounds what a fetch reads
# in vain to 256 KiB per requested range.
COALESCE_GAP = 256 << 10

ByteRange = tuple[str, int, int]  # (file path, first byte, byte after the last)
_CONTENT_RANGE = re.compile(r"bytes\s+\d+-\d+/(\d+)\s*$")
_PARTIAL_CONTENT = 206


@dataclass(frozen=True)
class FileVersion:
    """Which version of a file an HTTP answer read, as far as it says: its ETag and Last-Modified headers and the
    file's total size (a 206's Content-Range), each None when the answer did not send it."""

    etag: str | None = None
    modified: str | None = None
    size: int | None = None

    def change_from(self, opened: FileVersion) -> str | None:
        """How this answer's file differs from the `opened` one, or None when nothing both answers sent differs.
        The ETag decides where both have one (RFC 9110's weak comparison: a proxy that marks it weak,
        `W/"..."`, changes no byte); else the Last-Modified where both have one; and the size."""
        if self.etag is not None and opened.etag is not None:
            if self.etag.removeprefix("W/") != opened.etag.removeprefix("W/"):
                return f"ETag {opened.etag} when opened, now {self.etag}"
        elif self.modified is not None and opened.modified is not None and self.modified != opened.modified:
            return f"Last-Modified {opened.modified} when opened, now {self.modified}"
        if self.size is not None and opened.size is not None and self.size != opened.size:
            return f"{opened.size} bytes when opened, now {self.size}"
        return None


def refuse_replaced(path: str, opened: FileVersion, seen: FileVersion) -> None:
    """A StoreChangedError when an answer's `seen` version of the file at `path` is not the `opened` one (the first
    answer's for it): the store was rebuilt or copied over at its URL, and the bytes were another build's at the
    old build's offsets (stale54 F1). The one check of both read paths: byte ranges here, and zarr-python's reads
    of compressed arrays (storage/zarr_reads.py, left55b F3)."""
    change = seen.change_from(opened)
    if change is not None:
        raise StoreChangedError(f"{path} was replaced after this reader opened it ({change}): the store was rebuilt "
                                "or its files copied over at its URL; open it again")  # fmt: skip


class RangedColumn:
    """An uncompressed array file on an fsspec filesystem, read as row ranges without zarr-python."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, layout: ContiguousLayout) -> None:
        self.fs = fs
        self.path = path
        self.layout = layout
        self.opened: FileVersion | None = None  # what the first answer said of the file (`confirm`)
        self._lock = threading.Lock()

    def confirm(self, seen: FileVersion) -> None:
        """Check an answer's `seen` version of the file against the first one's (kept when this is the first): a
        StoreChangedError when they differ, the file replaced since the shard opened (stale54 F1: another build's
        bytes read at the old offsets); a StoreFormatError when its size is not the one its layout gives."""
        with self._lock:
            if self.opened is None:
                self.opened = seen
            opened = self.opened
        refuse_replaced(self.path, opened, seen)
        if seen.size is not None and seen.size != self.layout.file_size:
            raise StoreFormatError(f"{self.path} is {seen.size} bytes, its metadata says {self.layout.file_size}; "
                                   "run `dilstore verify`")  # fmt: skip

    @property
    def rows(self) -> int:
        return self.layout.shape[0]

    def byte_range(self, start: int, stop: int) -> ByteRange:
        """The bytes of rows start..stop-1."""
        return self.path, start * self.layout.row_bytes, stop * self.layout.row_bytes

    def index_range(self) -> ByteRange:
        """The bytes of the shard index (offset and length per chunk), which `read_row_ranges` checks."""
        return self.path, self.layout.index_offset, self.layout.index_stop


def read_row_ranges(
    fs: fsspec.AbstractFileSystem,
    requests: Sequence[tuple[RangedColumn, np.ndarray, np.ndarray]],
    check: Sequence[RangedColumn] = (),
) -> list[list[np.ndarray]]:
    """Rows starts[i]:stops[i] of each request's column (files on `fs`), read-only, all in one round of requests.

    check: columns whose shard index is read in the same round and must list
    the chunks back to back, which the metadata alone cannot promise (another
    writer may lay chunks out otherwise). A shard reader checks every column
    when it opens; a small array's index then comes in the same block as its rows.
    """
    stored = [column for column in check if column.rows]  # an empty array has no file
    ranges = [
        column.byte_range(start, stop)
        for column, starts, stops in requests
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True)
    ]
    columns = {column.path: column for column in [*stored, *(column for column, _, _ in requests)]}
    raw = read_blocks(fs, [*(column.index_range() for column in stored), *ranges],
                      on_answer=lambda path, seen: columns[path].confirm(seen))  # fmt: skip
    for column, index in zip(stored, raw, strict=False):
        if not column.layout.index_is_contiguous(np.frombuffer(index, dtype="<u8")):
            raise StoreFormatError(f"{column.path}: shard index does not describe contiguous chunks")
    rows = iter(raw[len(stored) :])
    return [
        [
            column.layout.rows_of(next(rows), stop - start)
            for start, stop in zip(starts.tolist(), stops.tolist(), strict=True)
        ]
        for column, starts, stops in requests
    ]


def read_blocks(
    fs: fsspec.AbstractFileSystem,
    ranges: Sequence[ByteRange],
    gap: int = COALESCE_GAP,
    on_answer: Callable[[str, FileVersion], None] | None = None,
) -> list[memoryview]:
    """The bytes of each range of files on `fs`, read as coalesced blocks in one `cat_ranges` call.

    on_answer: called with each block's file and the version of it the answer read, before the bytes are used;
    over HTTP(S) only (`_cat_ranges`), where each answer says it; other filesystems' reads give no versions.

    A block that comes back with other than the bytes asked for (a truncated
    file, or a server that ignores byte ranges and sends the whole file) and a
    missing file are a StoreFormatError naming the file; a request that failed
    in transit (a server error, a cut body, a timeout) a StoreReadError, since
    the same read may work again.
    """
    blocks, placed = coalesce(ranges, gap)
    wanted = [index for index, (_, start, stop) in enumerate(blocks) if stop > start]
    fetched: dict[int, bytes] = {}
    if wanted:
        paths = [blocks[i][0] for i in wanted]
        data, versions = _cat_ranges(fs, paths, [blocks[i][1] for i in wanted], [blocks[i][2] for i in wanted])
        for path, seen in zip(paths, versions, strict=False) if on_answer is not None else ():
            on_answer(path, seen)
        fetched = dict(zip(wanted, data, strict=True))
    for index, data in fetched.items():
        path, start, stop = blocks[index]
        if len(data) > stop - start:  # the server sent more than asked: it ignored the Range header
            raise StoreFormatError(
                f"{path}: asked for bytes {start}..{stop - 1}, got {len(data)} bytes: the server does not answer "
                "byte ranges (`Range: bytes=a-b` with 206); serve the store from one that does"
            )
        if len(data) < stop - start:
            raise StoreFormatError(
                f"{path}: asked for bytes {start}..{stop - 1}, got {len(data)} bytes: the file is shorter than "
                "its metadata says; run `dilstore verify`"
            )
    return [
        memoryview(fetched.get(block, b""))[offset : offset + stop - start]
        for (_, start, stop), (block, offset) in zip(ranges, placed, strict=True)
    ]


def _cat_ranges(
    fs: fsspec.AbstractFileSystem, paths: list[str], starts: list[int], stops: list[int]
) -> tuple[list[bytes], list[FileVersion]]:
    """`fs.cat_ranges` of the blocks, tried again (READ_ATTEMPTS in all) where a remote read failed in transit; a
    missing file is a StoreFormatError, a failure that stays a StoreReadError (or, local, a StoreFormatError).
    Over HTTP(S) the same requests are sent by `_http_cat_ranges`, which also gives what each answer said of its
    file; elsewhere the versions are empty."""
    fs = in_this_process(fs)  # a column opened before a fork reads in the child too (api54 F5)
    local = isinstance(fs, LocalFileSystem)
    for path in dict.fromkeys(paths) if local else ():
        refuse_special_file(path, path)
    attempt, http = 0, is_http(fs)
    while True:  # ends in a return or a raise: worth_retrying bounds the attempts
        try:
            if http:
                return _http_cat_ranges(fs, paths, starts, stops)
            return fs.cat_ranges(paths, starts, stops, on_error="raise"), []
        except FileNotFoundError as error:
            missing = error.args[0] if error.args else paths[0]
            raise StoreFormatError(f"{missing}: not found (the store lacks a file its metadata names); "
                                   "run `dilstore verify`") from None  # fmt: skip
        except Exception as error:  # noqa: BLE001 - each fsspec backend raises its own kind (aiohttp, botocore, ...)
            failure = read_failure(_failed_file(error, paths), error, local=local)
            if not worth_retrying(failure, error, local=local, attempt=attempt):
                raise failure from None
            time.sleep(retry_delay(error, attempt))
            attempt += 1


def is_http(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `fs` is fsspec's HTTP(S) filesystem, told by its protocols so that a local store's reads do not
    import aiohttp."""
    protocol = getattr(fs, "protocol", ())  # a filesystem-like object need not say one
    protocols = (protocol,) if isinstance(protocol, str) else protocol
    return "http" in protocols or "https" in protocols


def _http_cat_ranges(
    fs: HTTPFileSystem, paths: list[str], starts: list[int], stops: list[int]
) -> tuple[list[bytes], list[FileVersion]]:
    """What `fs.cat_ranges(..., on_error="raise")` reads over HTTP(S), the same GETs with the same options
    (`http_read`), at once in fsspec's batches, plus each answer's `FileVersion`: fsspec's `_cat_file` keeps only
    the body."""
    from fsspec.asyn import _run_coros_in_chunks, sync

    async def all_of_them() -> list[tuple[bytes, FileVersion] | BaseException]:
        reads = [http_read(fs, path, f"bytes={start}-{stop - 1}")
                 for path, start, stop in zip(paths, starts, stops, strict=True)]  # fmt: skip
        return await _run_coros_in_chunks(reads, batch_size=fs.batch_size, nofiles=True, return_exceptions=True)

    answers = sync(fs.loop, all_of_them)
    failed = next((answer for answer in answers if isinstance(answer, BaseException)), None)
    if failed is not None:
        raise failed
    return [answer[0] for answer in answers], [answer[1] for answer in answers]  # type: ignore[index]


async def http_read(fs: HTTPFileSystem, path: str, byte_range: str | None) -> tuple[bytes, FileVersion]:
    """One GET of `path` as fsspec's HTTP `_cat_file` sends it (fs.kwargs: headers, auth), with `Range: byte_range`
    when given, and what the answer says of the file (`FileVersion`), which `_cat_file` drops. The size is a 206's
    Content-Range total, or the body's length when the whole file was asked for. A 404 is a FileNotFoundError and
    any other failing status aiohttp's ClientResponseError, as there."""
    options = dict(fs.kwargs)
    headers = {**(options.pop("headers", None) or {}), **({} if byte_range is None else {"Range": byte_range})}
    session = await fs.set_session()
    async with session.get(fs.encode_url(path), headers=headers, **options) as answer:
        body = await answer.read()
        if answer.status == 404:
            raise FileNotFoundError(path)
        answer.raise_for_status()
        size = len(body) if byte_range is None else None
        if answer.status == _PARTIAL_CONTENT:
            total = _CONTENT_RANGE.match(answer.headers.get("Content-Range", ""))
            size = None if total is None else int(total.group(1))
        return body, FileVersion(answer.headers.get("ETag"), answer.headers.get("Last-Modified"), size)


def _failed_file(error: BaseException, paths: Sequence[str]) -> str:
    """What a failed read of byte ranges of `paths` names: the URL the failing request read, when the error tells
    it (aiohttp's), else the first file and "and more": naming the first file of the batch sent the reader of a
    500 on a states chunk to look at an id file (hostile47 F10)."""
    url = getattr(getattr(error, "request_info", None), "real_url", None) or getattr(error, "url", None)
    if url is not None:
        return f"byte ranges of {url}"
    return f"byte ranges of {paths[0]}{' and more' if len(set(paths)) > 1 else ''}"


def coalesce(ranges: Sequence[ByteRange], gap: int) -> tuple[list[ByteRange], list[tuple[int, int]]]:
    """Merge ranges of one file that overlap or lie within `gap` bytes of each other.

    Returns the merged blocks and, for each range in the given order, its
    block and its offset inside that block.
    """
    blocks: list[ByteRange] = []
    placed: list[tuple[int, int]] = [(0, 0)] * len(ranges)
    for index in sorted(range(len(ranges)), key=lambda i: ranges[i]):
        path, start, stop = ranges[index]
        if blocks and blocks[-1][0] == path and start <= blocks[-1][2] + gap:
            _, block_start, block_stop = blocks[-1]
            blocks[-1] = (path, block_start, max(block_stop, stop))
        else:
            blocks.append((path, start, stop))
        placed[index] = (len(blocks) - 1, start - blocks[-1][1])
    return blocks, placed

