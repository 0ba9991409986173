"""Describing a store from its manifest and a listing of its files: counts, sizes, bytes per token."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dilstore.storage.encodings import get_encoding
from dilstore.storage.format import (
    APPENDS_DIR,
    CODEBOOK_DIR,
    INDEX_DIR,
    MANIFEST_FILE,
    SHARDS_DIR,
    STATES_GROUP,
    ZARR_METADATA_FILE,
)
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import Manifest, read_manifest

PARTS = ("states", "tokens", "passages", "index", "metadata", "other")


def part_of(path: str) -> str:
    """Which part of the store a file belongs to, for the size breakdown.

    states: encoded state chunks and the store's codebook (`codebook/`, what
    2bit/1bit states decode with); tokens: token ids, spans and offsets;
    passages: ids, titles, texts; index: the id index; metadata: zarr.json
    files and the manifest; other: anything else (e.g. passages.parquet, bm25/).
    What an append wrote under `appends/<generation>/` counts like the same
    path at the root.
    """
    parts = _in_store_parts(path)
    if parts[-1] in (ZARR_METADATA_FILE, MANIFEST_FILE):
        return "metadata"
    if parts[0] == INDEX_DIR:
        return "index"
    if parts[0] == CODEBOOK_DIR:
        return STATES_GROUP
    if parts[0] == SHARDS_DIR and len(parts) > 2 and parts[2] in (STATES_GROUP, "tokens", "passages"):
        return parts[2]
    return "other"


def _in_store_parts(path: str) -> list[str]:
    """The parts of a store file's path, an append's `appends/<generation>/` left off (it counts like the root)."""
    parts = path.split("/")
    return parts[2:] if parts[0] == APPENDS_DIR and len(parts) > 2 else parts


def _stored_state_arrays(paths: Iterable[str]) -> set[str]:
    """The names of the arrays under any shard's `states/` group, so optional ones (2bit/1bit `centroid_ids`,
    absent from stores written before centroids) count only where stored."""
    names = set()
    for path in paths:
        parts = _in_store_parts(path)
        if len(parts) > 3 and parts[0] == SHARDS_DIR and parts[2] == STATES_GROUP:
            names.add(parts[3])
    return names


def store_files(location: StoreLocation, manifest: Manifest) -> dict[str, int]:
    """Every file of the store with its size: a listing where the filesystem has one, else the manifest's files.

    HTTP servers give no listing, so over http(s) the files are those the
    manifest recorded at finalize (with their recorded sizes) plus the
    manifest itself; files added later (a BM25 index) are not seen there.
    """
    if location.lists_files:
        return location.files()
    files = {path: entry.bytes for path, entry in manifest.files.items()}
    files[MANIFEST_FILE] = int(location.fs.size(location.path(MANIFEST_FILE)))
    return dict(sorted(files.items()))


def store_info(path_or_url: str | Path, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-ready description of the store at a local path or fsspec URL.

    Keys: store, format_version, kind, encoding, compressor, state_shape,
    passages, tokens, shards, files_listed ("listing", or "manifest" over HTTP,
    which cannot list: see store_files), bytes_on_disk (every file under the store),
    bytes_by_part, bytes_per_token ({kind: state bytes per token on disk}),
    bytes_per_token_by_part, state_bytes (the state bytes split into
    `per_token`: tokens times what each token's encoded arrays hold; in an
    appended store `superseded`: the same for the tokens of rows --replace
    took out of reach, still on disk; and `fixed`: everything else, i.e. the
    zero padding of each shard's last chunk, chunk indexes, per-shard
    parameters and the store's codebook; a compressed store's state bytes
    depend on the data, so they are one `compressed` entry),
    state_bytes_per_token_marginal (bytes one more token adds; None for a
    compressed store), fingerprint, creation.
    """
    location = StoreLocation.parse(path_or_url, storage_options)
    manifest = read_manifest(location)
    sizes = store_files(location, manifest)
    by_part = dict.fromkeys(PARTS, 0)
    for path, size in sizes.items():
        by_part[part_of(path)] += size
    tokens = manifest.tokens

    def per_token(size: int) -> float | None:
        return round(size / tokens, 3) if tokens else None

    marginal = _marginal_state_bytes(manifest, sizes)
    return {
        "store": location.url,
        "format_version": manifest.format_version,
        "kind": manifest.kind,
        "encoding": manifest.encoding,
        "compressor": manifest.compressor,
        "state_shape": None if manifest.state_shape is None else list(manifest.state_shape),
        "passages": manifest.passages,
        "tokens": tokens,
        "shards": len(manifest.shards),
        "files_listed": "listing" if location.lists_files else "manifest",
        "bytes_on_disk": sum(sizes.values()),
        "bytes_by_part": by_part,
        "bytes_per_token": {manifest.kind: per_token(by_part["states"])},
        "bytes_per_token_by_part": {part: per_token(size) for part, size in by_part.items()},
        "state_bytes": _state_bytes(manifest, by_part["states"], marginal),
        "state_bytes_per_token_marginal": marginal,
        # Only for appended stores, so other stores' info keeps its keys.
        **({} if not manifest.appends else {"appends": len(manifest.appends), "superseded": {
            "passages": manifest.superseded_passages, "tokens": manifest.superseded_tokens}}),
        "fingerprint": manifest.fingerprint.to_dict(),
        "creation": manifest.creation,
    }


def _marginal_state_bytes(manifest: Manifest, sizes: Mapping[str, int]) -> int | None:
    """The state bytes one more token adds (what its encoded per-token arrays hold); None for a compressed store,
    whose bytes depend on the data, or one without states."""
    if manifest.state_shape is None or manifest.compressor is not None:
        return None
    stored = _stored_state_arrays(sizes)
    return sum(math.prod(spec.shape(tuple(manifest.state_shape))) * np.dtype(spec.dtype).itemsize
               for spec in get_encoding(manifest.encoding).arrays
               if spec.per_token and (spec.requires is None or spec.name in stored))


def _state_bytes(manifest: Manifest, state_bytes: int, marginal: int | None) -> dict[str, int]:
    """The store's state bytes split into per_token, superseded (an appended store's) and fixed (store_info)."""
    if manifest.compressor is not None:
        return {"compressed": state_bytes}
    per_token = (marginal or 0) * manifest.tokens
    superseded = (marginal or 0) * manifest.superseded_tokens
    return {"per_token": per_token, **({"superseded": superseded} if manifest.appends else {}),
            "fixed": state_bytes - per_token - superseded}
