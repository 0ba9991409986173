"""The global id index: from any passage id to its (shard, row) in O(log n).

Ids are arbitrary UTF-8 strings, so the index keys on a 64-bit hash of the
id's UTF-8 bytes (BLAKE2b, 8-byte digest, read little-endian) and keeps three
parallel arrays sorted by (hash, shard, row): `hashes` uint64, `shards` uint32,
`rows` uint32. A lookup is a binary search for the hash, then a comparison with
the id stored in the shard for each entry of equal hash, so a hash collision
can never return the wrong passage. Finalize builds it and rejects duplicate
ids across shards.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from dilstore.storage.arrays import local_group, write_array
from dilstore.storage.durability import replace_dir
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import (
    ATTRIBUTES_KEY,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_DIR,
    INDEX_HASHES,
    INDEX_ROWS,
    INDEX_SHARDS,
    OFFSETS_PER_CHUNK,
    SUPERSEDED_ROWS,
    SUPERSEDED_SHARDS,
    TMP_PREFIX,
    StoreFormatError,
)
from dilstore.storage.messages import listed

HASH_NAME = "blake2b-64-le"


class DuplicatePassageIdError(DilstoreError):
    """The same passage id was written to more than one shard (or row)."""


def id_hash(passage_id: str) -> int:
    """The 64-bit index hash of a passage id.

    An id holding a lone surrogate (JSON "\\ud800") is not Unicode text, and no
    store holds one; hashed from its surrogate-passing bytes, which no stored
    (UTF-8) id has, it is looked up and not found, as any other missing id,
    where it raised UnicodeEncodeError (a 500 from serve). Valid ids hash as
    their UTF-8 bytes.
    """
    digest = hashlib.blake2b(passage_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def id_hashes(passage_ids: Sequence[str]) -> np.ndarray:
    """Index hashes of many ids, `(n,)` uint64; an id that is not a string raises DilstoreError naming it."""
    try:
        return np.fromiter((id_hash(passage_id) for passage_id in passage_ids), dtype=np.uint64, count=len(passage_ids))
    except AttributeError:  # only a non-string lacks .encode; found here, the check costs nothing when ids are fine
        wrong = next(passage_id for passage_id in passage_ids if not isinstance(passage_id, str))
        raise DilstoreError(f"passage ids are strings, got {type(wrong).__name__} {wrong!r:.60}") from None


@dataclass(frozen=True)
class IdIndex:
    """The three sorted index arrays (in memory or memory-mapped)."""

    hashes: np.ndarray  # (N,) uint64, sorted
    shards: np.ndarray  # (N,) uint32
    rows: np.ndarray  # (N,) uint32

    def __len__(self) -> int:
        return len(self.hashes)

    def locate(
        self, passage_ids: Sequence[str], id_at: Callable[[int, int], str]
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Shards `(n,)` and rows `(n,)` of each id, and the ids not found (their entries are -1).

        id_at(shard, row) returns the id stored there; it settles hash collisions.
        """
        shards = np.full(len(passage_ids), -1, dtype=np.int64)
        rows = np.full(len(passage_ids), -1, dtype=np.int64)
        missing = []
        hashes = id_hashes(passage_ids)
        positions = np.searchsorted(self.hashes, hashes)
        for i, (passage_id, wanted, position) in enumerate(zip(passage_ids, hashes, positions, strict=True)):
            while position < len(self.hashes) and self.hashes[position] == wanted:
                shard, row = int(self.shards[position]), int(self.rows[position])
                if id_at(shard, row) == passage_id:
                    shards[i], rows[i] = shard, row
                    break
                position += 1
            else:
                missing.append(passage_id)
        return shards, rows, missing


def build_index(shard_ids: dict[int, Sequence[str]], shard_names: dict[int, str]) -> IdIndex:
    """The sorted index over every shard's ids; duplicate ids raise DuplicatePassageIdError naming them."""
    total = sum(len(ids) for ids in shard_ids.values())
    hashes = np.empty(total, dtype=np.uint64)
    shards = np.empty(total, dtype=np.uint32)
    rows = np.empty(total, dtype=np.uint32)
    start = 0
    for shard, ids in sorted(shard_ids.items()):
        stop = start + len(ids)
        hashes[start:stop] = id_hashes(ids)
        shards[start:stop] = shard
        rows[start:stop] = np.arange(len(ids), dtype=np.uint32)
        start = stop
    order = np.lexsort((rows, shards, hashes))
    index = IdIndex(hashes[order], shards[order], rows[order])
    _reject_duplicates(index, shard_ids, shard_names)
    return index


def _reject_duplicates(index: IdIndex, shard_ids: dict[int, Sequence[str]], shard_names: dict[int, str]) -> None:
    """Compare the ids behind every run of equal hashes; raise naming the first few real duplicates."""
    repeated = np.flatnonzero(index.hashes[1:] == index.hashes[:-1])
    places_by_id: dict[str, list[str]] = {}
    for position in np.unique(np.concatenate([repeated, repeated + 1])):
        shard, row = int(index.shards[position]), int(index.rows[position])
        places_by_id.setdefault(shard_ids[shard][row], []).append(f"{shard_names[shard]} row {row}")
    duplicates = [(passage_id, places) for passage_id, places in places_by_id.items() if len(places) > 1]
    if duplicates:
        places = [f"{passage_id!r} in {', '.join(where)}" for passage_id, where in duplicates]
        raise DuplicatePassageIdError(
            f"{len(duplicates)} passage ids occur more than once: {listed(places, quoted=False, separator='; ')}"
        )


@dataclass(frozen=True)
class Superseded:
    """Rows an append with replace took out of the index: `(K,)` uint32 shards and rows, sorted by (shard, row)."""

    shards: np.ndarray  # (K,) uint32
    rows: np.ndarray  # (K,) uint32

    def __len__(self) -> int:
        return len(self.shards)

    @classmethod
    def empty(cls) -> Superseded:
        """No superseded rows: the index of a store never appended to with --replace."""
        return cls(np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.uint32))

    def keys(self) -> np.ndarray:
        """One uint64 `(K,)` per row: shard in the high 32 bits, row in the low."""
        return row_keys(self.shards, self.rows)


def row_keys(shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`(n,)` uint64 keys of (shard, row) pairs: shard in the high 32 bits, row in the low, so they sort together."""
    return shards.astype(np.uint64) << np.uint64(32) | rows.astype(np.uint64)


def header_matches(attributes: object, passages: int) -> bool:
    """Whether an index group's dilstore attributes are write_index's for a store of `passages` passages; attributes
    that are no JSON object (a list, a number) are not: opening such a store raised AttributeError (types58 F4)."""
    return (isinstance(attributes, dict) and attributes.get("hash") == HASH_NAME
            and attributes.get("passages") == passages)  # fmt: skip


def write_index(
    root: Path, index: IdIndex, *, directory: str = INDEX_DIR, superseded: Superseded | None = None
) -> None:
    """Write `root/directory` as a Zarr v3 group, replacing any earlier one only once the new one is complete.

    superseded: the rows an appended store's index leaves out (STORE_FORMAT.md
    §13), written as two more arrays; None for a store never appended to, whose
    index group keeps its layout.
    """
    target = root / directory
    temporary = target.parent / f"{TMP_PREFIX}{target.name}-{uuid.uuid4().hex}"
    attributes = {
        ATTRIBUTES_KEY: {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "node": "index",
            "hash": HASH_NAME,
            "passages": len(index),
            **({} if superseded is None else {"superseded": len(superseded)}),
        }
    }
    arrays = [(INDEX_HASHES, index.hashes), (INDEX_SHARDS, index.shards), (INDEX_ROWS, index.rows)]
    if superseded is not None:
        arrays += [(SUPERSEDED_SHARDS, superseded.shards), (SUPERSEDED_ROWS, superseded.rows)]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        group = local_group(temporary, mode="w-", zarr_format=3, attributes=attributes)
        for name, data in arrays:
            write_array(group, name, data, rows_per_chunk=OFFSETS_PER_CHUNK, compressor=None,
                        dimension_names=["entry"])
        replace_dir(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def read_superseded(group: zarr.Group, where: str) -> Superseded:
    """The superseded rows the index group at `where` (its full path) lists; none for the index of a store never
    appended to.

    The two arrays must both be there, as arrays of one length: one missing (or a group in its place) raised
    KeyError (or TypeError) from `dilstore compact` and `index`, a traceback; rows of another length were a
    ValueError from zip (types58 F5). A StoreFormatError names the index instead, at its path: it named no store,
    where a program reading several could not tell which to verify (url59 F3).
    """
    if SUPERSEDED_SHARDS not in group:
        return Superseded.empty()
    shards, rows = (group.get(name) for name in (SUPERSEDED_SHARDS, SUPERSEDED_ROWS))
    if not (isinstance(shards, zarr.Array) and isinstance(rows, zarr.Array) and shards.shape == rows.shape
            and shards.ndim == 1):  # fmt: skip
        raise StoreFormatError(f"the id index {where}: its {SUPERSEDED_SHARDS} and {SUPERSEDED_ROWS} are not two "
                               "arrays of one length; run `dilstore verify`")  # fmt: skip
    return Superseded(np.asarray(shards[...], dtype=np.uint32), np.asarray(rows[...], dtype=np.uint32))
