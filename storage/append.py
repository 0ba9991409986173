"""Appending shards to a finalized store without rewriting any of it (STORE_FORMAT.md §13).

An append writes everything new into its own folder, `appends/<generation>/`:
its shards under `shards/` (written by `storage.writer.write_shard` as into any
store), and whatever files the caller puts beside them. No reader looks there
until `commit_append` has

1. checked the new shards against the store (fingerprint, kind, encoding,
   compressor, state shape, vector size, build, codebook use),
2. built the new id index in `appends/<generation>/index/` (old entries plus
   new ones; duplicate ids refused, or with `replace` the old rows superseded),
3. replaced `manifest.json`: the commit point. A reader opened before it keeps
   the old manifest, the old index (memory-mapped or loaded) and the old
   shards, which are never rewritten; one opened after it sees the new store.

Only then is the index the store used before deleted (`remove_leftovers`).
A crash before step 3 leaves the store as it was plus an unreferenced
`appends/<generation>/` folder, which a re-run of the same append resumes and
any other append removes.

With `replace`, an old row whose id the append brings again is *superseded*: it
stays in its shard (old shards are never rewritten), but the new id index leaves
it out, lists it in its `superseded_*` arrays, and the manifest's passage and
token totals no longer count it, so no lookup, count or check reaches it.
`retire` supersedes more stored ids the same way (a replaced document's
passages that its new version no longer has).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dilstore.storage.atomic_files import remove_dead_writers_temporaries, remove_stale_writes
from dilstore.storage.codebook import store_codebook_problems
from dilstore.storage.durability import remove_path
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import (
    ShardContents,
    check_agreement,
    check_build,
    checksum_all,
    committed_shards,
    library_versions,
    read_shard_contents,
)
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.format import (
    APPENDED_FORMAT_VERSION,
    APPENDS_DIR,
    BUILD_ID,
    INDEX_DIR,
    INDEX_HASHES,
    INDEX_ROWS,
    INDEX_SHARDS,
    MANIFEST_FILE,
    SHARDS_DIR,
    TMP_PREFIX,
    append_dir,
    append_index_dir,
    append_shard_path,
)
from dilstore.storage.id_index import (
    DuplicatePassageIdError,
    IdIndex,
    Superseded,
    build_index,
    read_superseded,
    row_keys,
    write_index,
)
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import Manifest, ShardEntry, read_manifest, write_manifest
from dilstore.storage.messages import listed

_HASH_SHOWN = 12  # hex digits of a hash field shown in a mismatch message


class AppendMismatchError(DilstoreError):
    """The shards to append were made with other settings than the store's; the message names what differs."""


def first_free_shard(manifest: Manifest) -> int:
    """The shard index an append starts at: one above every shard index the store uses (0 for an empty store)."""
    return max((entry.index for entry in manifest.shards), default=-1) + 1


def fingerprint_differences(store: Fingerprint, run: Fingerprint) -> str:
    """`field: store X, this run Y; …` for every differing field, on one line ('' when equal)."""

    def shown(value: object) -> str:
        text = str(value)
        return text[:_HASH_SHOWN] + "…" if len(text) > 2 * _HASH_SHOWN else repr(value)

    return "; ".join(
        f"{name}: store {shown(getattr(store, name))}, this run {shown(getattr(run, name))}"
        for name in store.differences(run)
    )


def check_appendable(manifest: Manifest, fingerprint: Fingerprint, where: str) -> None:
    """Raise AppendMismatchError (one line) unless `fingerprint` is the store's: same model, kind, encoding, split k
    and max length, so new states are exactly what a rebuild would store."""
    differing = fingerprint_differences(manifest.fingerprint, fingerprint)
    if differing:
        raise AppendMismatchError(f"cannot append to {where}: the store was made with other settings ({differing})")


def commit_append(
    store_root: str | Path,
    generation: str,
    fingerprint: Fingerprint,
    creation_info: dict[str, Any] | None = None,
    *,
    replace: bool = False,
    retire: Collection[str] = (),
) -> Manifest:
    """Commit the shards under `store_root/appends/<generation>/shards/` into the store; return the new manifest.

    See the module docstring for the steps. creation_info: JSON-ready facts
    recorded in the append's entry of the manifest's `appends`. Duplicate ids
    within the append always raise DuplicatePassageIdError; ids already in the
    store raise it too, unless `replace`. retire: with `replace`, more stored ids
    to supersede although the append does not bring them again (the other
    passages of a replaced document); ids the store lacks are ignored. Any
    refusal leaves the store as it was.
    """
    root = Path(store_root)
    location = StoreLocation.parse(root)
    base = read_manifest(location)
    check_appendable(base, fingerprint, str(root))
    if any(record.get("generation") == generation for record in base.appends):
        raise DilstoreError(f"{root}: append {generation} is committed already")
    folder = append_dir(generation)
    remove_stale_writes(root / folder, skip=(SHARDS_DIR, INDEX_DIR))
    contents = _new_shards(root / folder, base, fingerprint, generation)
    entries = tuple(
        ShardEntry(index=index, name=content.name, passages=content.attributes.passages,
                   tokens=content.attributes.tokens, generation=generation, path=append_shard_path(generation, index))
        for index, content in contents.items()
    )  # fmt: skip
    problems = store_codebook_problems(location, [entry.directory for entry in (*base.shards, *entries)],
                                       base.encoding, base.generation, base.fingerprint)
    if problems:
        raise DilstoreError(f"{root}: {'; '.join(problems)}")
    index, superseded, dropped_tokens = merged_index(location, base, contents, replace, retire)
    index_dir = append_index_dir(generation)
    write_index(root, index, directory=index_dir, superseded=superseded)
    record = {"generation": generation, "first_shard": first_free_shard(base), **(creation_info or {})}
    manifest = _appended_manifest(base, entries, contents, index_dir, superseded, dropped_tokens,
                                  _append_files(root, base, folder, contents), record)
    write_manifest(root, manifest)
    remove_leftovers(root, manifest)
    # A commit killed while it wrote the manifest left its temporary at the root, where finalize removes one but no
    # later commit looked, and verify listed it as untracked for good (state56 F2).
    remove_dead_writers_temporaries(root / MANIFEST_FILE)
    return manifest


def _new_shards(folder: Path, base: Manifest, fingerprint: Fingerprint, generation: str) -> dict[int, ShardContents]:
    """The append's committed shards, checked against each other, the fingerprint, the build and the store."""
    if not folder.is_dir():
        raise DilstoreError(f"no append folder at {folder}")
    indices = committed_shards(folder)
    first = first_free_shard(base)
    if indices and indices[0] < first:
        raise DilstoreError(
            f"{folder}: shard {indices[0]} would collide with the store's; appended shards start at {first}"
        )
    contents = {index: read_shard_contents(StoreLocation.parse(folder), index) for index in indices}
    state_shape, vector_size = check_agreement(folder, contents, fingerprint)
    check_build(folder, contents, fingerprint, generation)
    if contents and base.shards:
        compressor = next(iter(contents.values())).attributes.compressor
        found = (compressor, state_shape, vector_size)
        expected = (base.compressor, base.state_shape, base.vector_size)
        if found != expected:
            raise AppendMismatchError(
                f"cannot append to {folder.parent.parent}: the new shards have compressor, state shape, vector size "
                f"{found}, the store {expected}"
            )
    return contents


class _OldRows:
    """Ids and token counts of the store's shards, read on first use (only shards an id lookup reaches)."""

    def __init__(self, location: StoreLocation, manifest: Manifest) -> None:
        self.location = location
        self.manifest = manifest
        self.cache: dict[int, ShardContents] = {}

    def contents(self, shard: int) -> ShardContents:
        if shard not in self.cache:
            entry = self.manifest.shard_by_index[shard]
            self.cache[shard] = read_shard_contents(self.location, shard, entry.directory)
        return self.cache[shard]

    def id_at(self, shard: int, row: int) -> str:
        return self.contents(shard).ids[row]

    def tokens(self, superseded: Superseded) -> int:
        return sum(int(self.contents(int(s)).lengths[int(r)]) for s, r in zip(superseded.shards, superseded.rows))


def read_index(location: StoreLocation, manifest: Manifest) -> tuple[IdIndex, Superseded]:
    """The store's id index and superseded rows, loaded into memory."""
    group = location.open_group(manifest.index)
    arrays = (np.asarray(group[name][...]) for name in (INDEX_HASHES, INDEX_SHARDS, INDEX_ROWS))
    return IdIndex(*arrays), read_superseded(group, location.path(manifest.index))


def merged_index(
    location: StoreLocation,
    base: Manifest,
    contents: dict[int, ShardContents],
    replace: bool,
    retire: Collection[str] = (),
) -> tuple[IdIndex, Superseded, int]:
    """The index over the store's live rows and the new shards' rows, every superseded row, and the tokens of the
    rows this append supersedes.

    An id both in the store and in the new shards raises DuplicatePassageIdError
    naming a few, unless `replace`: then the store's row is superseded, and so
    is the row of every id in `retire` that the store holds.
    """
    old, old_superseded = read_index(location, base)
    added = build_index({index: content.ids for index, content in contents.items()},
                        {index: content.name for index, content in contents.items()})
    new_ids = [passage_id for content in contents.values() for passage_id in content.ids]
    rows = _OldRows(location, base)
    found_shards, found_rows, _ = old.locate(new_ids, rows.id_at)
    hit = found_shards >= 0
    if hit.any() and not replace:
        repeated = [passage_id for passage_id, found in zip(new_ids, hit, strict=True) if found]
        raise DuplicatePassageIdError(
            f"{len(repeated)} passage ids of the append are already in store {location.url}: {listed(repeated)}; "
            "append with --replace to let the new rows win"
        )
    dropped = _retired(old, rows, found_shards[hit], found_rows[hit], retire if replace else ())
    keep = ~np.isin(row_keys(old.shards, old.rows), dropped.keys())  # (N,) bool
    hashes = np.concatenate([old.hashes[keep], added.hashes])
    shards = np.concatenate([old.shards[keep], added.shards]).astype(np.uint32)
    index_rows = np.concatenate([old.rows[keep], added.rows]).astype(np.uint32)
    order = np.lexsort((index_rows, shards, hashes))
    merged = IdIndex(hashes[order], shards[order], index_rows[order])
    superseded = _sorted_rows(np.concatenate([old_superseded.shards, dropped.shards]),
                              np.concatenate([old_superseded.rows, dropped.rows]))
    return merged, superseded, rows.tokens(dropped)


def _retired(
    old: IdIndex, rows: _OldRows, shards: np.ndarray, found_rows: np.ndarray, retire: Collection[str]
) -> Superseded:
    """The stored rows this append supersedes: those of its own ids (`shards`, `found_rows`) and of `retire`."""
    retired_shards, retired_rows, _ = old.locate(list(retire), rows.id_at)
    held = retired_shards >= 0
    all_shards = np.concatenate([shards, retired_shards[held]])
    all_rows = np.concatenate([found_rows, retired_rows[held]])
    _, first = np.unique(row_keys(all_shards, all_rows), return_index=True)
    return _sorted_rows(all_shards[first], all_rows[first])


def _sorted_rows(shards: np.ndarray, rows: np.ndarray) -> Superseded:
    """(shard, row) pairs as a Superseded sorted by (shard, row)."""
    order = np.lexsort((rows, shards))
    return Superseded(shards[order].astype(np.uint32), rows[order].astype(np.uint32))


def _append_files(root: Path, base: Manifest, folder: str, contents: dict[int, ShardContents]) -> dict[str, Any]:
    """The store's file entries after the append: the old ones but the old index's, and every file of the append."""
    files = {path: entry for path, entry in base.files.items() if not path.startswith(f"{base.index}/")}
    added = checksum_all(
        root / folder, StoreLocation.parse(root / folder), [content.name for content in contents.values()]
    )
    files.update({f"{folder}/{path}": entry for path, entry in added.items()})
    return dict(sorted(files.items()))


def _appended_manifest(
    base: Manifest,
    entries: tuple[ShardEntry, ...],
    contents: dict[int, ShardContents],
    index_dir: str,
    superseded: Superseded,
    dropped_tokens: int,
    files: dict[str, Any],
    record: dict[str, Any],
) -> Manifest:
    """The manifest of the store with the append committed; `record` starts the append's entry in `appends`."""
    first = next(iter(contents.values()), None)
    dropped = len(superseded) - base.superseded_passages
    passages = sum(entry.passages for entry in entries)
    tokens = sum(entry.tokens for entry in entries)
    record = {
        **record,
        "shards": len(entries),
        "passages": passages,
        "tokens": tokens,
        "superseded": {"passages": dropped, "tokens": dropped_tokens},
        **library_versions(),
    }
    return dataclasses.replace(
        base,
        compressor=base.compressor if base.shards or first is None else first.attributes.compressor,
        state_shape=base.state_shape if base.shards or first is None else first.attributes.state_shape,
        vector_size=base.vector_size if base.shards or first is None else first.attributes.vector_size,
        passages=base.passages + passages - dropped,
        tokens=base.tokens + tokens - dropped_tokens,
        shards=(*base.shards, *entries),
        files=files,
        index=index_dir,
        superseded_passages=len(superseded),
        superseded_tokens=base.superseded_tokens + dropped_tokens,
        appends=(*base.appends, record),
        format_version=APPENDED_FORMAT_VERSION,
    )


def remove_leftovers(root: str | Path, manifest: Manifest, keep: Sequence[str] = ()) -> list[str]:
    """Delete what no committed manifest refers to any more; the paths removed, relative to the root.

    That is an id index other than the manifest's (the one an append replaced,
    `index/` or an earlier append's), and every `appends/<generation>/` folder
    the manifest does not list, except the generations in `keep` (an append
    being resumed). Only a folder named as appends are (a build id) goes: an
    operator's notes or backup copy under `appends/` were deleted without a
    word. Call it only while holding the store's write lock: it would delete
    the folder of an append running beside it.
    """
    root = Path(root)
    committed = {str(record.get("generation")) for record in manifest.appends}
    doomed = [] if manifest.index == INDEX_DIR else [INDEX_DIR]
    doomed += [append_index_dir(generation) for generation in committed]
    doomed += _appends_leftovers(root / APPENDS_DIR, committed, keep)
    removed = []
    for relative in doomed:
        path = root / relative
        if relative != manifest.index and os.path.lexists(path):
            remove_path(path)
            removed.append(relative)
    return removed


def _appends_leftovers(appends: Path, committed: Collection[str], keep: Sequence[str]) -> list[str]:
    """What no commit refers to under the store's `appends/` folder (store-relative paths, in the order they go):
    the folders of appends not committed (named as appends are, and not in `keep`), then the temporaries a killed
    write left inside an append's folder. Nothing when there is no such folder."""
    if not appends.is_dir():
        return []
    uncommitted = [entry.name for entry in appends.iterdir() if entry.name not in committed]
    leftovers = [append_dir(name) for name in uncommitted if BUILD_ID.fullmatch(name) and name not in keep]
    # An id index a killed write left half made (.tmp-index-*), or one replace_dir set aside (.tmp-old-index-*):
    # inside a committed append's folder, verify took it for damage for good. Only in folders named and made as
    # appends are: a link under appends/ led the glob to delete what the folder it names held (hostile46 F2).
    folders = [entry for entry in appends.iterdir()
               if BUILD_ID.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink()]  # fmt: skip
    return leftovers + [f"{APPENDS_DIR}/{folder.name}/{entry.name}" for folder in folders
                        for entry in folder.glob(f"{TMP_PREFIX}*")]  # fmt: skip
