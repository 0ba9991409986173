"""storage/arrays.py writes an uncompressed array's file itself: the bytes must be zarr-python's, to the byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from numcodecs.checksum32 import CRC32C
from zarr.codecs import BytesCodec

from dilstore.storage.arrays import compressor_codecs, offsets_are_valid, write_array
from dilstore.storage.format import StoreFormatError
from dilstore.storage.mapped import contiguous_layout, map_array

RNG = np.random.default_rng(11)
CASES = {  # name: (data, rows per chunk)
    "token ids, partial last chunk": (RNG.integers(-5, 30000, 1000).astype(np.int32), 256),
    "char spans": (RNG.integers(-1, 500, (1000, 2)).astype(np.int32), 256),
    "1bit codes": (RNG.integers(0, 256, (513, 48)).astype(np.uint8), 256),
    "float16 scales, whole chunks": (RNG.random(512).astype(np.float16), 256),
    "codebook, one chunk": (RNG.standard_normal((3, 7)).astype(np.float32), 3),
    "offsets": (np.cumsum(RNG.integers(0, 100, 2049)).astype(np.int64), 1024),
    "one row of states": (RNG.standard_normal((1, 2, 2, 5)).astype(np.float32), 256),
    "no rows": (np.zeros((0, 4), dtype=np.float32), 256),
}


def _files(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("compressor", [None, "zstd"])
def test_write_array_writes_what_zarr_python_writes(tmp_path: Path, compressor: str | None) -> None:
    ours = zarr.open_group(str(tmp_path / "ours"), mode="w-", zarr_format=3)
    theirs = zarr.open_group(str(tmp_path / "theirs"), mode="w-", zarr_format=3)
    for index, (data, rows) in enumerate(CASES.values()):
        names = [f"axis_{axis}" for axis in range(data.ndim)]
        written = write_array(ours, f"a{index}", data, rows_per_chunk=rows, compressor=compressor,
                              dimension_names=names)
        theirs.create_array(f"a{index}", data=data, chunks=(rows, *data.shape[1:]),
                            shards=(max(1, -(-len(data) // rows)) * rows, *data.shape[1:]),
                            compressors=compressor_codecs(compressor), fill_value=0, dimension_names=names,
                            config={"write_empty_chunks": True})
        np.testing.assert_array_equal(written[...], data)
        if compressor is None and len(data):
            np.testing.assert_array_equal(map_array(written, tmp_path / "ours" / f"a{index}").values, data)
    ours_files, theirs_files = _files(tmp_path / "ours"), _files(tmp_path / "theirs")
    assert sorted(ours_files) == sorted(theirs_files) and len(ours_files) > len(CASES)
    assert [name for name in ours_files if ours_files[name] != theirs_files[name]] == []


@pytest.mark.parametrize(("offsets", "valid"), [
    ([0, 3, 3, 10], True),
    ([0], True),  # no passages (data length 0)
    ([1, 3, 3, 10], False),  # not from 0: the first passage would lose its first row
    ([0, 4, 3, 10], False),  # falls by one
    ([0, 3, 3, 9], False),  # ends short of the data
    ([0, 3, 3, 11], False),  # ends past it
    ([], False),
])  # fmt: skip
def test_offsets_are_valid_only_from_0_never_falling_to_the_data_length(offsets: list[int], valid: bool) -> None:
    """Readers and verify refuse ragged offsets by this one rule (mut57b: offsets from 1, falling by one, or ending
    short of the data passed every test, whose damage was two entries swapped or an end stretched by 7)."""
    data_length = 10 if len(offsets) > 1 else 0
    assert bool(offsets_are_valid(np.array(offsets, dtype=np.int64), data_length)) is valid


@pytest.mark.parametrize(("layout", "reason"), [
    ({"chunks": (4, 3), "shards": (8, 3)}, "array spans more than one shard file"),  # 16 rows: two shard files
    ({"chunks": (4, 1), "shards": (16, 3)}, "inner chunks split an axis other than the first"),
    ({"chunks": (4, 3), "shards": {"shape": (16, 3), "index_location": "start"}},
     "shard index is not at the end of the shard"),
    ({"chunks": (4, 3), "shards": (16, 3), "serializer": BytesCodec(endian="big")},
     "inner chunks are compressed or not little-endian bytes"),  # mapped, its values read byte-swapped
])  # fmt: skip
def test_an_array_of_another_layout_is_not_memory_mapped(tmp_path: Path, layout: dict, reason: str) -> None:
    """Arrays zarr-python wrote in layouts the mapped path cannot read row by row are refused by name (mut58: with
    any of these checks gone, nothing failed; mapped, they read rows of the wrong place or file)."""
    data = np.arange(48, dtype=np.float32).reshape(16, 3)
    group = zarr.open_group(str(tmp_path / "g"), mode="w-", zarr_format=3)
    array = group.create_array("a", data=data, compressors=None, fill_value=0, **layout)
    np.testing.assert_array_equal(array[...], data)
    with pytest.raises(StoreFormatError, match=reason):
        map_array(array, tmp_path / "g" / "a")


@pytest.mark.parametrize("damage", ["grown", "chunks swapped in the index"])
def test_a_file_grown_or_whose_index_lists_its_chunks_out_of_place_is_not_memory_mapped(
    tmp_path: Path, damage: str
) -> None:
    """A file longer than its metadata implies, or whose shard index (CRC32C recomputed) puts chunk 0 after chunk 1,
    is refused: zarr-python reads the second right, a map would give the rows of one chunk for the other's (mut58:
    neither check was tested on the mapped path)."""
    data = np.arange(512, dtype=np.int32)
    group = zarr.open_group(str(tmp_path / "g"), mode="w-", zarr_format=3)
    array = write_array(group, "a", data, rows_per_chunk=256, compressor=None, dimension_names=["row"])
    layout = contiguous_layout(array, "a")
    path = tmp_path / "g" / "a" / layout.chunk_key
    raw = bytearray(path.read_bytes())
    if damage == "grown":
        raw += b"\0"
        message = f"has {layout.file_size + 1} bytes, its metadata implies {layout.file_size}"
    else:
        index = np.frombuffer(bytes(raw[layout.index_offset : layout.index_stop]), dtype="<u8").reshape(2, 2)
        raw[layout.index_offset :] = bytes(CRC32C(location="end").encode(index[::-1].copy()))
        message = "shard index does not describe contiguous chunks"
    path.write_bytes(bytes(raw))
    if damage != "grown":
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "g" / "a"), mode="r")[:256], data[256:])
    with pytest.raises(StoreFormatError, match=message):
        map_array(array, tmp_path / "g" / "a")
