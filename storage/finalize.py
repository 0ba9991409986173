"""Finalize: check the shards agree, build the global id index, checksum everything, commit the manifest.

Finalize runs once, after every shard writer has finished. It first removes any
earlier manifest (the store is uncommitted while it works), then writes the id
index and last the manifest, atomically: a store with a manifest is complete.
Shard files keep the checksums their writers recorded (storage/checksums.py);
every other file present (the index, files other layers put there) is hashed.
Leftover temporary shard directories of crashed or duplicate workers are
removed, and so are the temporaries of part files a killed run was writing
(passages/, rejected/); any other entry under `shards/` is an error.
"""

from __future__ import annotations

import datetime
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from dilstore.storage.arrays import decode_string
from dilstore.storage.atomic_files import remove_stale_writes
from dilstore.storage.checksums import read_checksums
from dilstore.storage.codebook import CODEBOOK_DIR, store_codebook_problems
from dilstore.storage.durability import aside_prefix
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint, fingerprint_sha256
from dilstore.storage.format import (
    ID_BYTES,
    ID_OFFSETS,
    INDEX_DIR,
    MANIFEST_FILE,
    SHARDS_DIR,
    TMP_PREFIX,
    TOKEN_OFFSETS,
    StoreFormatError,
    parse_shard_name,
    shard_path,
)
from dilstore.storage.id_index import build_index, write_index
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import FileEntry, Manifest, ShardEntry, write_manifest
from dilstore.storage.shard import ShardAttributes
from dilstore.storage.versions import installed_version
from dilstore.storage.zarr_reads import METADATA_ERRORS


@dataclass(frozen=True)
class ShardContents:
    """What finalize needs from one shard."""

    name: str
    attributes: ShardAttributes
    ids: list[str]
    lengths: np.ndarray  # (n,) int64: tokens of each row

    @property
    def longest(self) -> int:
        """Tokens in the longest passage (0 for none)."""
        return int(self.lengths.max(initial=0))


def finalize(
    store_root: str | Path,
    fingerprint: Fingerprint,
    creation_info: dict[str, Any] | None = None,
    *,
    expected_shards: int | None = None,
    generation: str | None = None,
) -> Manifest:
    """Commit the store at `store_root`: id index, checksums, then the manifest; return the manifest.

    fingerprint: what produced the states (its kind and encoding must match
    the shards'). creation_info: free-form JSON-ready facts to record (command,
    corpus, run ids); finalize adds the time and library versions.
    expected_shards: when given, shards 0..expected_shards-1 must all exist.
    generation: the build the shards must all belong to (their writer's
    `generation`); the manifest records it, so readers can tell a store
    rebuilt under them. Shards that record the fingerprint's hash must match it.
    A `codebook/` group (2bit/1bit) must belong to the same build and model,
    shards that decode with it need it, and a codebook a shard keeps of its own
    must equal it (storage.codebook.store_codebook_problems).
    Duplicate passage ids across shards raise DuplicatePassageIdError.
    """
    root = Path(store_root)
    if not root.is_dir():
        raise DilstoreError(f"no store directory at {root}")
    (root / MANIFEST_FILE).unlink(missing_ok=True)
    _remove_stale_temporaries(root)
    remove_stale_writes(root, skip=(SHARDS_DIR, INDEX_DIR))
    location = StoreLocation.parse(root)
    indices = _listed_shards(root, expected_shards)
    contents = {index: read_shard_contents(location, index) for index in indices}
    state_shape, vector_size = check_agreement(root, contents, fingerprint)
    check_build(root, contents, fingerprint, generation)
    codebook = store_codebook_problems(location, [shard_path(i) for i in indices], fingerprint.encoding, generation,
                                       fingerprint)
    if codebook:
        raise DilstoreError(f"{root}: {'; '.join(codebook)}")
    index = build_index(
        {shard: content.ids for shard, content in contents.items()},
        {shard: content.name for shard, content in contents.items()},
    )
    write_index(root, index)
    files = checksum_all(root, location, [content.name for content in contents.values()])
    manifest = Manifest(
        kind=fingerprint.kind,
        encoding=fingerprint.encoding,
        compressor=next(iter(contents.values())).attributes.compressor if contents else None,
        state_shape=state_shape,
        passages=sum(content.attributes.passages for content in contents.values()),
        tokens=sum(content.attributes.tokens for content in contents.values()),
        shards=tuple(
            ShardEntry(index=shard, name=content.name, passages=content.attributes.passages,
                       tokens=content.attributes.tokens)
            for shard, content in contents.items()
        ),
        fingerprint=fingerprint,
        creation={**library_versions(), **(creation_info or {})},
        files=files,
        vector_size=vector_size,
        generation=generation,
    )
    write_manifest(root, manifest)
    return manifest


def _listed_shards(root: Path, expected_shards: int | None) -> list[int]:
    """The committed shards' indices; a DilstoreError naming the missing and unexpected ones unless they are
    0..expected_shards-1 (when given)."""
    indices = committed_shards(root)
    if expected_shards is not None and indices != list(range(expected_shards)):
        absent = sorted(set(range(expected_shards)) - set(indices))
        extra = sorted(set(indices) - set(range(expected_shards)))
        raise DilstoreError(f"{root}: expected shards 0..{expected_shards - 1}; missing {absent}, unexpected {extra}")
    return indices


# Temporaries left at the root by a killed finalize (the index and manifest being written), or by a run killed
# while it wrote the codebook, which happens before any shard.
_ROOT_TEMPORARIES = (
    f"{TMP_PREFIX}{INDEX_DIR}-",
    aside_prefix(INDEX_DIR),
    f"{TMP_PREFIX}{MANIFEST_FILE}-",
    f"{TMP_PREFIX}{CODEBOOK_DIR}-",
    aside_prefix(CODEBOOK_DIR),
)


def _remove_stale_temporaries(root: Path) -> None:
    """Remove what a killed finalize or codebook write left at the root (see _ROOT_TEMPORARIES), and nothing else."""
    for entry in root.iterdir():
        if entry.name.startswith(_ROOT_TEMPORARIES):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def committed_shards(root: Path) -> list[int]:
    """Indices of the committed shards, sorted; stale temporaries are removed, strangers are an error."""
    shards_dir = root / SHARDS_DIR
    if not shards_dir.exists():
        return []
    indices = []
    for entry in sorted(shards_dir.iterdir()):
        if entry.name.startswith(TMP_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        index = parse_shard_name(entry.name)
        if index is None or not entry.is_dir():
            raise DilstoreError(f"unexpected entry {entry} in {shards_dir}: only shard-NNNNN directories belong there")
        indices.append(index)
    return sorted(indices)


def read_shard_contents(location: StoreLocation, index: int, relative: str | None = None) -> ShardContents:
    """Shard `index`'s attributes, ids and token counts, read with zarr-python from `relative` (default shards/NAME)."""
    relative = shard_path(index) if relative is None else relative
    where = location.path(relative)
    try:
        group = location.open_group(relative)
        attributes = ShardAttributes.of(group, where)
        id_bytes = np.asarray(group[ID_BYTES][...])
        id_offsets = np.asarray(group[ID_OFFSETS][...])
        token_offsets = np.asarray(group[TOKEN_OFFSETS][...])
    except METADATA_ERRORS as error:
        raise StoreFormatError(f"cannot read shard {where}: {type(error).__name__}: {error}") from None
    if attributes.shard != index:
        raise StoreFormatError(f"{where} says it is shard {attributes.shard}; was it renamed by hand?")
    if len(id_offsets) != attributes.passages + 1 or len(token_offsets) != attributes.passages + 1:
        raise StoreFormatError(f"{where}: offsets do not match its {attributes.passages} passages")
    return ShardContents(
        name=relative.rsplit("/", 1)[1],
        attributes=attributes,
        ids=[decode_string(id_bytes, id_offsets, row) for row in range(attributes.passages)],
        lengths=np.diff(token_offsets),
    )


def check_agreement(
    root: Path, contents: dict[int, ShardContents], fingerprint: Fingerprint
) -> tuple[tuple[int, ...] | None, int | None]:
    """Every shard has the fingerprint's kind and encoding, one compressor, state shape and vector size, fitting
    lengths; returns the state shape and vector size (None, None for no shards)."""
    settings = {
        (content.attributes.kind, content.attributes.encoding, content.attributes.compressor,
         content.attributes.state_shape, content.attributes.vector_size)
        for content in contents.values()
    }
    if len(settings) > 1:
        listed = "; ".join(
            f"{content.name}: kind={content.attributes.kind} encoding={content.attributes.encoding} "
            f"compressor={content.attributes.compressor} state_shape={content.attributes.state_shape} "
            f"vector_size={content.attributes.vector_size}"
            for content in contents.values()
        )
        raise DilstoreError(f"shards of {root} were written with different settings: {listed}")
    for content in contents.values():
        attributes = content.attributes
        if (attributes.kind, attributes.encoding) != (fingerprint.kind, fingerprint.encoding):
            raise DilstoreError(
                f"{content.name} holds kind {attributes.kind!r} encoding {attributes.encoding!r}, but the fingerprint "
                f"says kind {fingerprint.kind!r} encoding {fingerprint.encoding!r}"
            )
        if content.longest > fingerprint.max_length:
            raise DilstoreError(
                f"{content.name} has a passage of {content.longest} tokens, longer than the fingerprint's "
                f"max_length {fingerprint.max_length}"
            )
    return next(iter(settings))[3:] if settings else (None, None)


def check_build(
    root: Path, contents: dict[int, ShardContents], fingerprint: Fingerprint, generation: str | None
) -> None:
    """Every shard belongs to `generation` and, where it records one, to the fingerprint's model.

    A shard left by another build (a writer with other settings, an earlier
    run) is an error naming it, never part of the manifest.
    """
    digest = fingerprint_sha256(fingerprint)
    for content in contents.values():
        found = content.attributes
        if found.generation != generation:
            raise DilstoreError(
                f"{root}: {content.name} belongs to build {found.generation!r}, not this run's {generation!r}; "
                "it was written by another run"
            )
        if found.fingerprint_sha256 is not None and found.fingerprint_sha256 != digest:
            raise DilstoreError(f"{root}: {content.name} was made by another model than the fingerprint's")


def checksum_all(root: Path, location: StoreLocation, shard_names: list[str]) -> dict[str, FileEntry]:
    """Size and SHA-256 of every file under the store except the manifest and temporaries.

    Shard files take the hashes their writer recorded (after checking the files
    and sizes still match); every other file is hashed here.
    """
    files: dict[str, FileEntry] = {}
    for name in shard_names:
        for relative, entry in read_checksums(root / SHARDS_DIR / name).items():
            files[f"{SHARDS_DIR}/{name}/{relative}"] = entry
    sizes = {
        path: size
        for path, size in location.files().items()
        if path != MANIFEST_FILE
        and path not in files
        and not path.startswith(TMP_PREFIX)
        and f"/{TMP_PREFIX}" not in path
    }
    for path, digest in location.sha256_many(list(sizes)).items():
        if isinstance(digest, Exception):
            raise DilstoreError(f"cannot read {location.path(path)} to checksum it: {digest}")
        files[path] = FileEntry(bytes=sizes[path], sha256=digest)
    return dict(sorted(files.items()))


def library_versions() -> dict[str, Any]:
    """When and with which library versions the store was finalized."""
    return {
        "finalized_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dilstore_version": installed_version("dilstore"),
        "zarr_version": zarr.__version__,
        "numpy_version": np.__version__,
    }
