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
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from dilstore.storage.format import StoreFormatError
from dilstore.storage.mapped import ContiguousLayout
from dilstore.storage.read_failures import read_failure, refuse_special_file, retry_delay, worth_retrying

# Byte ranges of one file closer than this are read as one block. A round trip to object storage costs
# tens of milliseconds, in which 256 KiB transfer many times over; the cap bounds what a fetch reads
# in vain to 256 KiB per requested range.
COALESCE_GAP = 256 << 10

ByteRange = tuple[str, int, int]  # (file path, first byte, byte after the last)


class RangedColumn:
    """An uncompressed array file on an fsspec filesystem, read as row ranges without zarr-python."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, layout: ContiguousLayout) -> None:
        self.fs = fs
        self.path = path
        self.layout = layout

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
    raw = read_blocks(fs, [*(column.index_range() for column in stored), *ranges])
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
    fs: fsspec.AbstractFileSystem, ranges: Sequence[ByteRange], gap: int = COALESCE_GAP
) -> list[memoryview]:
    """The bytes of each range of files on `fs`, read as coalesced blocks in one `cat_ranges` call.

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
        data = _cat_ranges(fs, paths, [blocks[i][1] for i in wanted], [blocks[i][2] for i in wanted])
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


def _cat_ranges(fs: fsspec.AbstractFileSystem, paths: list[str], starts: list[int], stops: list[int]) -> list[bytes]:
    """`fs.cat_ranges` of the blocks, tried again (READ_ATTEMPTS in all) where a remote read failed in transit; a
    missing file is a StoreFormatError, a failure that stays a StoreReadError (or, local, a StoreFormatError)."""
    local = isinstance(fs, LocalFileSystem)
    for path in dict.fromkeys(paths) if local else ():
        refuse_special_file(path, path)
    attempt = 0
    while True:  # ends in a return or a raise: worth_retrying bounds the attempts
        try:
            return fs.cat_ranges(paths, starts, stops, on_error="raise")
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

