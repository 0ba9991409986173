"""Compacting a store: its live passages rewritten into a few new shards, superseded rows left out.

Every append adds shards of its own (at least one, ~100 KB and ~30 files however few passages it holds), and
`--replace` leaves the rows it supersedes in their shards, so a store appended to daily grows in files, bytes,
manifest and the cost of opening and fetching with every append. `compact_store` writes the rows the id index
reaches into new shards of a new store folder, each in the shard `route` gives its id, with their passage
tables (Parquet and the JSONL `dilstore index` reads) beside, then finalizes that store.

States are copied as stored (`ShardReader.encoded`, `writer.write_encoded_shard`), never decoded and encoded
again, so the new store gives exactly the states the old one did. That needs codes whose meaning does not
depend on their shard: fp32 and fp16 stores, and 2bit/1bit stores with a store-wide `codebook/` (copied to
the new store). An int8 store (per-shard channel scales) and a 2bit/1bit store whose shards keep their own
codebooks are refused before anything is written.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dilstore.storage.atomic_files import atomic_write_bytes
from dilstore.storage.codebook import CODEBOOK_DIR, codebook_sample_tokens, read_codebook, write_codebook
from dilstore.storage.collection import collection_jsonl
from dilstore.storage.encodings import get_encoding
from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import copy_tree, naming
from dilstore.storage.finalize import finalize
from dilstore.storage.format import MANIFEST_FILE, SHARDS_DIR, StoreFormatError, append_dir
from dilstore.storage.manifest import Manifest, ShardEntry
from dilstore.storage.passage_files import PASSAGES_DIR, REJECTED_DIR, jsonl_path, parquet_path
from dilstore.storage.passage_tables import checked_document_ids, passage_table_bytes, shard_table
from dilstore.storage.reader import Store
from dilstore.storage.records import EncodedPassage
from dilstore.storage.writer import write_encoded_shard


@dataclass(frozen=True)
class _Row:
    """Where one live passage is in the old store, and the document it came from (its own id without passage
    tables): made for one new shard at a time."""

    id: str
    shard: int
    row: int
    doc_id: str


@dataclass(frozen=True)
class _LiveRows:
    """The live rows of one old shard, grouped by the new shard each goes to, as arrays: one object per row of a
    whole store took ~0.4 KB a passage, 4 GB at 10M passages (scale45 M1); these take the ids' bytes and ~24 B."""

    shard: int
    targets: np.ndarray  # (live,) int64 new shard of each row, ascending
    rows: np.ndarray  # (live,) int64 row in the old shard
    ids: pa.Array
    doc_ids: pa.Array

    def going_to(self, target: int) -> list[_Row]:
        """The rows that go to new shard `target`."""
        start, end = np.searchsorted(self.targets, [target, target + 1]).tolist()
        ids, doc_ids = self.ids[start:end].to_pylist(), self.doc_ids[start:end].to_pylist()
        return [_Row(passage_id, self.shard, row, doc_id)
                for passage_id, row, doc_id in zip(ids, self.rows[start:end].tolist(), doc_ids, strict=True)]


@dataclass(frozen=True)
class _TableRow:
    """One row of a new shard's passage tables (storage.passage_files.PassageRow)."""

    id: str
    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Compaction:
    """What `compact_store` wrote: the new store's manifest, and what it left out of the old one."""

    manifest: Manifest
    source_shards: int
    source_appends: int
    dropped_rows: int  # superseded rows of the old store, which no lookup reached


def copyable_problem(store: Store) -> str | None:
    """Why the store cannot be compacted: not a local folder, or states that cannot be copied into other shards
    unchanged (see the module docstring); None when it can."""
    root = store.location.local_root
    if root is None:
        return "only a store on the local filesystem can be compacted"
    encoding = get_encoding(store.encoding)
    if encoding.name == "int8":
        return ("its int8 codes are scaled per shard (channel scales), so moving a row to another shard would "
                "change its states")
    if encoding.codebook and not all(store.shard(entry.index).attributes.codebook_in_store
                                     for entry in store.manifest.shards):  # fmt: skip
        return (f"its {encoding.name} shards keep codebooks of their own, not the store's {CODEBOOK_DIR}/, so "
                "moving a row to another shard would change its states")
    return None


def compact_store(
    store: Store,
    target: Path,
    route: Callable[[str], int],
    *,
    generation: str,
    creation_info: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Compaction:
    """Write the live passages of the open local `store` into a new store at `target` and finalize it.

    route: the new shard of a passage id (shards that receive none are not written). generation: the new
    store's build id, which its shards, codebook and manifest record. creation_info: facts to record in its
    manifest beside where it came from. progress: called with the number of passages each written shard holds.
    The old store's dead letters (its `rejected/`, and each append's under `rejected/<generation>/`) are copied
    over, so that nothing a run set aside is lost. `target` must hold no store (no manifest, no shards).
    """
    problem = copyable_problem(store)
    if problem is not None:
        raise DilstoreError(f"cannot compact {store.url}: {problem}")
    root = store.location.local_root
    assert root is not None  # copyable_problem refuses other stores
    target.mkdir(parents=True, exist_ok=True)
    if (target / MANIFEST_FILE).exists() or (target / SHARDS_DIR).exists():
        raise DilstoreError(f"cannot compact into {target}: it holds a store already")
    manifest = store.manifest
    sources, dropped, tables = _live_rows(store, root, route)
    codebook = _store_codebook(root, manifest) if manifest.state_shape is not None else None  # None: no passages
    with naming(target):  # zarr's writes name no file: a full disk is the target's (full49 F4)
        if codebook is not None:
            write_codebook(target / CODEBOOK_DIR, manifest.encoding, codebook, manifest.state_shape or (),
                           generation=generation, fingerprint=manifest.fingerprint,
                           sample_tokens=codebook_sample_tokens(root / CODEBOOK_DIR))  # fmt: skip
        for shard in sorted(set().union(*(np.unique(source.targets).tolist() for source in sources))):
            placed = sorted((row for source in sources for row in source.going_to(shard)),
                            key=lambda row: row.id)  # as precompute orders a shard  # fmt: skip
            passages = _read_encoded(store, placed)
            if tables:
                _write_tables(target, shard, placed, passages)
            write_encoded_shard(target, shard, passages, kind=manifest.kind, encoding=manifest.encoding,
                                state_shape=manifest.state_shape or (), compressor=manifest.compressor,
                                codebook=codebook, generation=generation, fingerprint=manifest.fingerprint)  # fmt: skip
            if progress is not None:
                progress(len(passages))
        (target / REJECTED_DIR).mkdir(exist_ok=True)  # in every finished store, if empty
        _copy_rejected(root, manifest, target)
        compacted = {"compacted_from": {"generation": manifest.generation, "creation": manifest.creation,
                                        "appends": list(manifest.appends), "dropped_rows": dropped}}  # fmt: skip
        new = finalize(target, manifest.fingerprint, {**compacted, **(creation_info or {})}, generation=generation)
    return Compaction(new, len(manifest.shards), len(manifest.appends), dropped)


def _live_rows(store: Store, root: Path, route: Callable[[str], int]) -> tuple[list[_LiveRows], int, bool]:
    """Every passage the id index reaches, by old shard and routed; the number of superseded rows left out; and
    whether the store has passage tables (a store written through the storage API alone has none, and its copy
    gets none)."""
    manifest = store.manifest
    superseded: dict[int, list[int]] = defaultdict(list)
    found = store.superseded()
    for shard, row in zip(found.shards.tolist(), found.rows.tolist(), strict=True):
        superseded[shard].append(row)
    tables = (root / PASSAGES_DIR).is_dir()
    sources = []
    for entry in manifest.shards:
        ids = store.shard(entry.index).ids()
        doc_ids = _document_ids(root, entry, ids) if tables else ids
        live = np.setdiff1d(np.arange(len(ids)), superseded.get(entry.index, []))  # (live,) ascending
        targets = np.array([route(ids[row]) for row in live.tolist()], dtype=np.int64)
        order = np.argsort(targets, kind="stable")
        rows = live[order]
        sources.append(_LiveRows(entry.index, targets[order], rows, pa.array(ids).take(rows),
                                 pa.array(doc_ids).take(rows)))  # fmt: skip
    if (count := sum(len(source.rows) for source in sources)) != manifest.passages:
        raise DilstoreError(f"{store.url}: {count} live rows found for the manifest's {manifest.passages} "
                            "passages; run `dilstore verify`")  # fmt: skip
    return sources, len(found), tables


def _document_ids(root: Path, entry: ShardEntry, ids: list[str]) -> list[str]:
    """The document id of each row of shard `entry`, from its passage table once checked against the shard
    (passage_tables.checked_document_ids): the new tables carry them on, so a false one would reach the compacted
    store, and an unreadable table gave pyarrow's traceback (hostile47 F8)."""
    table = shard_table(root, entry)
    if not table.is_file():
        raise DilstoreError(f"{table} is missing: the passage table of {entry.name}; run `dilstore verify`")
    try:
        return checked_document_ids(table, ids)
    except StoreFormatError as error:
        raise StoreFormatError(f"{error} (the passage table of {entry.name}); run `dilstore verify`") from error


def _store_codebook(root: Path, manifest: Manifest) -> dict[str, np.ndarray] | None:
    """The store-wide codebook its 2bit/1bit shards decode with, as stored (None for other encodings)."""
    if not get_encoding(manifest.encoding).codebook:
        return None
    return read_codebook(root / CODEBOOK_DIR, manifest.encoding)[0]


def _read_encoded(store: Store, placed: list[_Row]) -> list[EncodedPassage]:
    """The encoded passages of `placed`, in its order: each old shard read once, its rows in one round."""
    by_shard: dict[int, list[int]] = defaultdict(list)
    for position, row in enumerate(placed):
        by_shard[row.shard].append(position)
    passages: list[EncodedPassage | None] = [None] * len(placed)
    for shard, positions in by_shard.items():
        read = store.shard(shard).encoded([placed[position].row for position in positions])
        for position, passage in zip(positions, read, strict=True):
            passages[position] = passage
    return passages  # type: ignore[return-value]  # every position was filled above


def _write_tables(target: Path, shard: int, placed: list[_Row], passages: list[EncodedPassage]) -> None:
    """Shard `shard`'s passage tables, as precompute writes them: Parquet (id, doc_id, title, text) and JSONL."""
    rows = [_TableRow(row.id, row.doc_id, passage.title, passage.text)
            for row, passage in zip(placed, passages, strict=True)]  # fmt: skip
    atomic_write_bytes(parquet_path(target, shard), passage_table_bytes(rows))
    atomic_write_bytes(jsonl_path(target, shard), collection_jsonl(rows).encode("utf-8"))


def _copy_rejected(root: Path, manifest: Manifest, target: Path) -> None:
    """The old store's dead letters into the new one: its own `rejected/`, each append's under its generation."""
    sources = [(root / REJECTED_DIR, target / REJECTED_DIR)]
    sources += [(root / append_dir(str(record.get("generation"))) / REJECTED_DIR,
                 target / REJECTED_DIR / str(record.get("generation"))) for record in manifest.appends]  # fmt: skip
    for source, destination in sources:
        if source.is_dir() and any(source.iterdir()):
            copy_tree(source, destination, dirs_exist_ok=True)
