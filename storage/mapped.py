"""Memory-mapping uncompressed Zarr arrays: the zero-copy read path.

An array written by storage/arrays.py without compression is one Zarr shard
file whose inner chunks are raw little-endian C-order bytes, laid out one after
another, followed by the shard index (offset, length per chunk, then a CRC32C).
When the metadata says exactly that and the index confirms that chunk i sits at
byte i * chunk_bytes, the first `shape[0]` rows of the file are the array, and
numpy can view them straight from the page cache. Anything else (compression,
another layout) is not mapped, and the caller reads through zarr-python.

A map shows the file as it is now, not as it was mapped: a file cut short
under it makes the next read of a lost page a SIGBUS, which kills the
process (a server with every store it serves), and bytes written in place
read as data. Store files never change once written, so a reader records
each mapped file's inode, size and mtime (`WatchedFile`) and checks them
before it reads (`check_unchanged`): a file truncated or written in place
since, or another file now at its path (a store rebuilt there), is a
StoreChangedError (a StoreFormatError) instead. A file deleted since is not:
its map keeps it whole, as the store was when opened, which is how a reader
opened before an append goes on reading the index the append removed.

The other local read paths (compressed stores, or "zarr" and "ranged" asked
for) read a shard's chunks when a lookup needs them, with the offsets read
when the shard opened: after a rebuild in place they would slice the new
build's files with the old build's offsets. So they watch each open shard's
metadata (its zarr.json, which every build writes anew) the same way.
"""

from __future__ import annotations

import math
import mmap
import os
import resource
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import numpy as np
import zarr
from fsspec.implementations.local import LocalFileSystem
from numcodecs.checksum32 import CRC32C
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.bytes import Endian

from dilstore.storage.format import StoreChangedError, StoreFormatError
from dilstore.storage.read_failures import read_failure

if TYPE_CHECKING:
    from dilstore.storage.manifest import Manifest

CHUNK_PREFIX = "c"  # zarr v3's default chunk key encoding: an array's chunk files are under its c/

_INDEX_ENTRY_BYTES = 16  # uint64 offset + uint64 length per inner chunk
_INDEX_CHECKSUM_BYTES = 4  # CRC32C after the index


def mappable_reason(array: zarr.Array) -> str | None:
    """Why `array` cannot be memory-mapped, or None when it can."""
    metadata = array.metadata
    if metadata.zarr_format != 3:
        return "not a Zarr v3 array"
    codecs = metadata.codecs
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return "not stored with the sharding codec alone"
    sharding = codecs[0]
    inner = sharding.codecs
    if len(inner) != 1 or not isinstance(inner[0], BytesCodec) or inner[0].endian not in (None, Endian.little):
        return "inner chunks are compressed or not little-endian bytes"
    if [codec.to_dict() for codec in sharding.index_codecs] != [
        BytesCodec(endian="little").to_dict(),
        Crc32cCodec().to_dict(),
    ]:
        return "shard index is not little-endian bytes plus CRC32C"
    if sharding.index_location.value != "end":
        return "shard index is not at the end of the shard"
    shard_shape = metadata.chunk_grid.chunk_shape
    if any(size < extent for size, extent in zip(shard_shape, array.shape, strict=True)):
        return "array spans more than one shard file"
    if tuple(sharding.chunk_shape[1:]) != tuple(shard_shape[1:]):
        return "inner chunks split an axis other than the first"
    return None


@dataclass(frozen=True)
class ContiguousLayout:
    """Where an uncompressed single-shard array keeps its rows: row r at bytes [r · row_bytes, (r + 1) · row_bytes).

    The file is `chunk_count` inner chunks of `chunk_bytes`, one after another,
    then the shard index at `index_offset`. Both the memory-mapped path and the
    ranged path of remote stores (storage/ranged.py) read rows by this layout,
    and storage/arrays.py writes uncompressed arrays by it.
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    chunk_key: str  # the file under the array's directory: "c/0", "c/0/0", ...
    chunk_count: int
    chunk_bytes: int

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize

    @property
    def index_offset(self) -> int:
        """Where the shard index begins: after the chunks, stored back to back from byte 0."""
        return self.chunk_count * self.chunk_bytes

    @property
    def index_stop(self) -> int:
        """The byte after the index entries (the CRC32C follows)."""
        return self.index_offset + self.chunk_count * _INDEX_ENTRY_BYTES

    @property
    def file_size(self) -> int:
        """The size a shard file of this layout has: chunks, index entries and the index's CRC32C."""
        return self.index_stop + _INDEX_CHECKSUM_BYTES

    def contiguous_index(self) -> np.ndarray:
        """The shard index of chunks back to back from byte 0: `(chunk_count * 2,)` little-endian uint64, an offset
        and a length per chunk."""
        index = np.empty((self.chunk_count, 2), dtype="<u8")  # (chunks, offset/length)
        index[:, 0] = np.arange(self.chunk_count, dtype=np.uint64) * np.uint64(self.chunk_bytes)
        index[:, 1] = self.chunk_bytes
        return index.reshape(-1)

    def index_is_contiguous(self, index: np.ndarray) -> bool:
        """Whether the shard index (uint64 offset, length per chunk) lists the chunks back to back from byte 0."""
        return np.array_equal(index, self.contiguous_index())

    def file_bytes(self, values: np.ndarray) -> np.ndarray:
        """The whole file of an array holding `values` `(shape)`, as `(file_size,)` uint8.

        The rows, zeros (the fill value) to the end of the last inner chunk, the
        contiguous index and its CRC32C: what zarr-python writes for such an
        array, without encoding the inner chunks one by one (storage/arrays.py).
        """
        file = np.zeros(self.file_size, dtype=np.uint8)  # (file_size,)
        rows = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1).view(np.uint8)  # (rows * row_bytes,)
        file[: rows.size] = rows
        file[self.index_offset :] = np.frombuffer(
            CRC32C(location="end").encode(self.contiguous_index()), dtype=np.uint8
        )
        return file

    def rows_of(self, raw: bytes | memoryview | mmap.mmap, rows: int) -> np.ndarray:
        """A read-only (rows, *row_shape) view of the first `rows` rows of `raw` (a whole file, or a read of rows)."""
        count = rows * math.prod(self.row_shape)
        return np.frombuffer(raw, dtype=self.dtype, count=count).reshape(rows, *self.row_shape)


def contiguous_layout(array: zarr.Array, where: str | Path) -> ContiguousLayout:
    """The layout of `array`'s file, or a StoreFormatError naming `where` when its metadata says it has none."""
    reason = mappable_reason(array)
    if reason is not None:
        raise StoreFormatError(f"{where} has no contiguous layout: {reason}")
    metadata = array.metadata
    chunk_rows = metadata.codecs[0].chunk_shape[0]
    dtype = np.dtype(metadata.data_type.to_native_dtype()).newbyteorder("<")
    return ContiguousLayout(
        dtype=dtype,
        shape=tuple(array.shape),
        chunk_key=metadata.encode_chunk_key((0,) * array.ndim),
        chunk_count=metadata.chunk_grid.chunk_shape[0] // chunk_rows,
        chunk_bytes=chunk_rows * math.prod(array.shape[1:]) * dtype.itemsize,
    )


@dataclass(frozen=True)
class WatchedFile:
    """A store file as a reader found it: when it was memory-mapped, or, on the other local read paths, a shard's
    metadata when the shard was opened (see the module docstring)."""

    path: Path
    inode: int
    size: int
    modified_ns: int

    @classmethod
    def of(cls, path: Path, status: os.stat_result) -> WatchedFile:
        """The file at `path` as `status` (os.stat) found it: inode, size and modification time."""
        return cls(path, status.st_ino, status.st_size, status.st_mtime_ns)

    def change(self) -> str | None:
        """How the file at `path` differs from the one found, or None when it is the same, unchanged, or gone."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return None  # deleted: the map holds the file whole (module docstring)
        except OSError as error:
            return f"no longer readable ({error.strerror or error})"
        if now.st_ino != self.inode:
            return "replaced by another file"
        if now.st_size != self.size:
            return f"cut or grown from {self.size} to {now.st_size} bytes"
        if now.st_mtime_ns != self.modified_ns:
            return "written to in place"
        return None


def watch(path: Path) -> WatchedFile | None:
    """`path` as it is now, for `check_unchanged` later; None when it cannot be found (the read that follows says
    so)."""
    try:
        return WatchedFile.of(path, os.stat(path))
    except OSError:
        return None


def check_unchanged(files: Iterable[WatchedFile]) -> None:
    """A StoreChangedError naming the first watched file that changed since it was found; reading a mapped one could
    kill the process (SIGBUS), and reading on from any of them could give another build's data."""
    for file in files:
        change = file.change()
        if change is not None:
            raise StoreChangedError(
                f"{file.path} was {change} after the store was opened: the store was rebuilt, damaged or replaced "
                "under this reader; open it again (`dilstore verify` checks it)"
            )


@dataclass(frozen=True)
class MappedArray:
    """An array's values mapped from its file, and that file as it was mapped (None for an empty array: no file)."""

    values: np.ndarray
    file: WatchedFile | None


# Descriptors a process needs besides a store's mapped files: client sockets, the BM25 index, the JVM, libraries.
OTHER_OPEN_FILES = 512
# Shards a reader keeps open whatever the open-file limit says (each holds about 9 mapped files of a dilbert store).
MIN_OPEN_SHARDS = 16


def shards_kept_open(manifest: Manifest) -> int:
    """How many shards a reader of the store keeps open: all of them when their mapped files fit the process's
    open-file limit beside OTHER_OPEN_FILES others (the commands raise the limit to its hard value), else as many
    as fit, at least MIN_OPEN_SHARDS.

    A fixed 128 made every fetch of a store of more shards (any corpus over 128 MiB at the default sharding)
    open and map the shards it had just closed: 29 passages cost 88 ms instead of 1.3 ms.
    """
    shards = max(1, len(manifest.shards))
    per_shard = math.ceil(mapped_files(manifest) / shards)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if per_shard == 0 or soft == resource.RLIM_INFINITY:
        return shards
    return max(MIN_OPEN_SHARDS, min(shards, (soft - OTHER_OPEN_FILES) // per_shard))


def mapped_files(manifest: Manifest) -> int:
    """How many files a reader of the whole store keeps memory-mapped, each holding an open file descriptor for as
    long as the store is open (the map keeps its own copy of the descriptor): every chunk file of an uncompressed
    store, none of a compressed one, which is read through zarr."""
    if manifest.compressor is not None:
        return 0
    return sum(1 for path in manifest.files if f"/{CHUNK_PREFIX}/" in f"/{path}")


def map_array(array: zarr.Array, array_dir: Path) -> MappedArray:
    """A read-only numpy view of `array`'s values, memory-mapped from its shard file under `array_dir`.

    Raises StoreFormatError when the array is not mappable or its file does not
    match its metadata (truncated, foreign index).
    """
    layout = _layout_or_refuse(array, f"cannot memory-map {array_dir}")
    if array.shape[0] == 0:
        return MappedArray(_empty(array, layout), None)
    path = array_dir / layout.chunk_key
    try:
        # Opened without blocking, and refused unless a regular file: opening a pipe put in a chunk file's place
        # for reading waited for a writer forever (hostile46 F3).
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise StoreFormatError(f"{path} is not a regular file (a pipe, socket or device stands for it)")
            _check_size(status.st_size, layout, path)
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise StoreFormatError(f"missing array file {path}") from None
    except OSError as error:  # lasting (no permission, a directory in its place) or passing (too many open files)
        raise read_failure(str(path), error, local=True) from None
    return MappedArray(_checked_rows(mapping, array, layout, path), WatchedFile.of(path, status))


def read_array_file(array: zarr.Array, fs: fsspec.AbstractFileSystem, array_dir: str) -> np.ndarray:
    """`array`'s values read whole from its shard file under `array_dir` on `fs`, read-only.

    The read path for arrays that are read whole from a remote store (the id
    index). zarr-python reads a missing shard file as the fill value, zeros,
    which made every id of a remote store look absent; read here, a missing or
    cut file is a StoreFormatError, checked as `map_array` checks a mapped one.
    """
    layout = _layout_or_refuse(array, f"cannot read {array_dir} whole")
    if array.shape[0] == 0:
        return _empty(array, layout)
    path = f"{array_dir}/{layout.chunk_key}"
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        raise StoreFormatError(f"missing array file {path}") from None
    except Exception as error:  # noqa: BLE001 - each fsspec backend raises its own kind (aiohttp, botocore, ...)
        raise read_failure(path, error, local=isinstance(fs, LocalFileSystem)) from None
    _check_size(len(raw), layout, path)
    return _checked_rows(raw, array, layout, path)


def _layout_or_refuse(array: zarr.Array, refusal: str) -> ContiguousLayout:
    reason = mappable_reason(array)
    if reason is not None:
        raise StoreFormatError(f"{refusal}: {reason}")
    return contiguous_layout(array, refusal)


def _empty(array: zarr.Array, layout: ContiguousLayout) -> np.ndarray:
    empty = np.empty(array.shape, dtype=layout.dtype)
    empty.flags.writeable = False
    return empty


def _check_size(size: int, layout: ContiguousLayout, path: str | Path) -> None:
    if size != layout.file_size:
        raise StoreFormatError(f"{path} has {size} bytes, its metadata implies {layout.file_size}")


def _checked_rows(
    raw: bytes | mmap.mmap, array: zarr.Array, layout: ContiguousLayout, path: str | Path
) -> np.ndarray:
    """The array's rows of a whole shard file `raw`, after checking its index lists the chunks back to back."""
    index = np.frombuffer(raw, dtype="<u8", count=2 * layout.chunk_count, offset=layout.index_offset)
    if not layout.index_is_contiguous(index):
        raise StoreFormatError(f"{path}: shard index does not describe contiguous chunks; run `dilstore verify`")
    return layout.rows_of(raw, array.shape[0])
