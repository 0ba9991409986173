"""Memory-mapping uncompressed Zarr arrays: the zero-copy read path.

An array written by storage/arrays.py without compression is one Zarr shard
file whose inner chunks are raw little-endian C-order bytes, laid out one after
another, followed by the shard index (offset, length per chunk, then a CRC32C).
When the metadata says exactly that and the index confirms that chunk i sits at
byte i * chunk_bytes, the first `shape[0]` rows of the file are the array, and
numpy can view them straight from the page cache. Anything else (compression,
another layout) is not mapped, and the caller reads through zarr-python.
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.bytes import Endian

from dilstore.storage.format import StoreFormatError

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


def map_array(array: zarr.Array, array_dir: Path) -> np.ndarray:
    """A read-only numpy view of `array`'s values, memory-mapped from its shard file under `array_dir`.

    Raises StoreFormatError when the array is not mappable or its file does not
    match its metadata (truncated, foreign index).
    """
    reason = mappable_reason(array)
    if reason is not None:
        raise StoreFormatError(f"cannot memory-map {array_dir}: {reason}")
    dtype = np.dtype(array.metadata.data_type.to_native_dtype()).newbyteorder("<")
    if array.shape[0] == 0:
        empty = np.empty(array.shape, dtype=dtype)
        empty.flags.writeable = False
        return empty
    metadata = array.metadata
    sharding = metadata.codecs[0]
    path = array_dir / metadata.encode_chunk_key((0,) * array.ndim)
    chunk_rows = sharding.chunk_shape[0]
    chunk_count = metadata.chunk_grid.chunk_shape[0] // chunk_rows
    chunk_bytes = chunk_rows * math.prod(array.shape[1:]) * dtype.itemsize
    index_bytes = chunk_count * _INDEX_ENTRY_BYTES + _INDEX_CHECKSUM_BYTES
    expected_size = chunk_count * chunk_bytes + index_bytes
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            if size != expected_size:
                raise StoreFormatError(f"{path} has {size} bytes, its metadata implies {expected_size}")
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise StoreFormatError(f"missing array file {path}") from None
    index = np.frombuffer(mapping, dtype="<u8", count=2 * chunk_count, offset=chunk_count * chunk_bytes)
    expected_index = np.empty((chunk_count, 2), dtype="<u8")  # (chunks, offset/length)
    expected_index[:, 0] = np.arange(chunk_count, dtype=np.uint64) * np.uint64(chunk_bytes)
    expected_index[:, 1] = chunk_bytes
    if not np.array_equal(index, expected_index.reshape(-1)):
        raise StoreFormatError(f"{path}: shard index does not describe contiguous chunks, cannot memory-map")
    return np.frombuffer(mapping, dtype=dtype, count=math.prod(array.shape)).reshape(array.shape)
