"""Writing one whole shard: validate, encode, write under a temporary name, fsync, rename.

One writer writes one whole shard; shards never share a file. The shard is
invisible until complete: it is written to `shards/.tmp-shard-NNNNN-<uuid>/`
and renamed to `shards/shard-NNNNN/`. The bytes depend only on the records and
the settings (fixed chunking, no timestamps), so a retried worker writes a
byte-identical shard; when the shard already exists with the same bytes the
retry keeps it, and when it differs (a non-deterministic upstream) the newer
one replaces it. Nothing is written into a finalized store. The writer also
records every file's size and SHA-256 in the shard group's attributes
(storage/checksums.py), which finalize copies into the manifest.
"""

from __future__ import annotations

import filecmp
import math
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from dilstore.storage.arrays import encode_strings, write_array
from dilstore.storage.checksums import record_checksums
from dilstore.storage.durability import fsync_dir, fsync_tree
from dilstore.storage.encodings import Encoding, check_codebook, get_encoding
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint, fingerprint_sha256
from dilstore.storage.format import (
    StoreFormatError,
    ATTRIBUTES_KEY,
    BYTES_PER_CHUNK,
    CENTROIDS_SHARD_VERSION,
    CHAR_SPANS,
    FORMAT_NAME,
    FORMAT_VERSION,
    ID_BYTES,
    ID_OFFSETS,
    MANIFEST_FILE,
    OFFSETS_PER_CHUNK,
    ROTATED_SHARD_VERSION,
    SHARDS_DIR,
    STORE_CODEBOOK,
    TEXT_BYTES,
    TEXT_OFFSETS,
    TITLE_BYTES,
    TITLE_OFFSETS,
    TMP_PREFIX,
    TOKENS_PER_CHUNK,
    TOKEN_IDS,
    TOKEN_OFFSETS,
    VECTORS,
    VECTORS_PER_CHUNK,
    ZARR_METADATA_FILE,
    Kind,
    check_compressor,
    get_kind,
    shard_name,
    states_array,
)
from dilstore.storage.records import PassageRecord
from dilstore.storage.shard import ShardAttributes

_INT32 = np.iinfo(np.int32)
_CHECK_ROWS = 8192  # token rows checked for NaN and infinity at a time


@dataclass(frozen=True)
class ShardSummary:
    """What one write_shard call left on disk.

    status: "written" (new shard), "kept" (an identical shard was already
    there) or "replaced" (a different shard of that index was replaced).
    """

    index: int
    name: str
    path: Path
    passages: int
    tokens: int
    files: int
    bytes: int
    status: str


@dataclass(frozen=True)
class _Columns:
    """A shard's records, validated and concatenated."""

    ids: list[str]
    titles: list[str]
    texts: list[str]
    token_offsets: np.ndarray  # (n+1,) int64
    token_ids: np.ndarray  # (T,) int32
    char_spans: np.ndarray  # (T, 2) int32
    states: np.ndarray  # (T, *S) float32
    state_shape: tuple[int, ...]
    vectors: np.ndarray | None  # (n, d) float32, or None when the records have none


def shard_written(store_root: str | Path, shard_index: int) -> bool:
    """Whether shard `shard_index` is in place: write_shard renames a finished shard folder in, group metadata
    and all, so its zarr.json is there only once every file is."""
    return (Path(store_root) / SHARDS_DIR / shard_name(shard_index) / ZARR_METADATA_FILE).is_file()


def shard_generation(store_root: str | Path, shard_index: int) -> str | None:
    """The build recorded in shard `shard_index`'s attributes; None when it has none or is absent or unreadable."""
    path = Path(store_root) / SHARDS_DIR / shard_name(shard_index)
    try:
        return ShardAttributes.of(zarr.open_group(str(path), mode="r"), str(path)).generation
    except (FileNotFoundError, StoreFormatError, zarr.errors.NodeTypeValidationError, ValueError, KeyError):
        return None


def build_attributes(generation: str | None, fingerprint: Fingerprint | None) -> dict[str, str]:
    """The attributes that tie a shard or a store's codebook to its build: `generation` and `fingerprint_sha256`.

    Each is left out when None, so stores made without them keep their bytes.
    """
    return {
        **({} if generation is None else {"generation": generation}),
        **({} if fingerprint is None else {"fingerprint_sha256": fingerprint_sha256(fingerprint)}),
    }


def write_shard(
    store_root: str | Path,
    shard_index: int,
    records: Sequence[PassageRecord],
    *,
    kind: str,
    encoding: str,
    compressor: str | None = None,
    durable: bool = True,
    codebook: Mapping[str, np.ndarray] | None = None,
    generation: str | None = None,
    fingerprint: Fingerprint | None = None,
) -> ShardSummary:
    """Write `records` as shard `shard_index` of the store at `store_root` and return what was written.

    kind: representation kind ("dilbert", "earl-s1", "earl-s2", "listformer"); encoding:
    "fp32", "fp16", "int8", "2bit" or "1bit"; codebook: the store-wide codebook
    of a 2bit/1bit store (`train_codebook`), which the caller writes once to
    `STORE/codebook/` (storage.codebook.write_codebook): the shard is encoded
    with it, holds no copy, and records `codebook: "store"` (finalize refuses
    the store if the group is missing or differs); without it the shard trains
    its own on a seeded sample of its states and keeps it under `states/`. compressor:
    None (memory-mappable) or "zstd" / "blosc" for cold storage. durable:
    fsync every file and directory before the rename publishes the shard
    (False skips it, for scratch stores and tests, where a crash may leave a
    visible but incomplete shard). Invalid records raise DilstoreError naming
    the passage id and the problem.
    generation: the build this shard belongs to (finalize and readers check
    that every shard of a store has the manifest's); fingerprint: the model
    that made the states, recorded as its SHA-256 so `verify` can tell an
    edited manifest fingerprint. Both are left out when None.
    """
    root = Path(store_root)
    name = shard_name(shard_index)
    if (root / MANIFEST_FILE).exists():
        raise DilstoreError(f"{root} is finalized; write shard {name} into a new store, or delete manifest.json first")
    kind_spec = get_kind(kind)
    encoding_spec = get_encoding(encoding)
    check_compressor(compressor)
    columns = _collect(records, kind_spec, name)
    if codebook is not None:
        check_codebook(encoding_spec, codebook, columns.state_shape)
    shards_dir = root / SHARDS_DIR
    shards_dir.mkdir(parents=True, exist_ok=True)
    temporary = shards_dir / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex}"
    try:
        build = build_attributes(generation, fingerprint)
        if codebook is not None and encoding_spec.codebook:
            build = {**build, "codebook": STORE_CODEBOOK}
        _write_group(temporary, columns, shard_index, kind_spec, encoding_spec, compressor, codebook, build)
        record_checksums(temporary)
        if durable:
            fsync_tree(temporary)
        status = _commit(temporary, shards_dir / name, durable)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    target = shards_dir / name
    sizes = [path.stat().st_size for path in target.rglob("*") if path.is_file()]
    return ShardSummary(
        index=shard_index,
        name=name,
        path=target,
        passages=len(columns.ids),
        tokens=len(columns.token_ids),
        files=len(sizes),
        bytes=sum(sizes),
        status=status,
    )


def _collect(records: Sequence[PassageRecord], kind: Kind, name: str) -> _Columns:
    """Validate every record and concatenate them; the first problem raises with the passage id."""
    if not records:
        raise DilstoreError(f"shard {name} has no passages; write only non-empty shards")
    state_shape = kind.check_state_shape(np.shape(records[0].states)[1:])
    seen: set[str] = set()
    token_ids, char_spans, states = [], [], []
    for record in records:
        _check_record_shapes(record, state_shape, kind.name)
        if record.id in seen:
            raise DilstoreError(f"passage id {record.id!r} occurs twice in shard {name}")
        seen.add(record.id)
        token_ids.append(np.asarray(record.token_ids))
        char_spans.append(np.asarray(record.char_spans))
        states.append(np.asarray(record.states))
    lengths = np.array([len(ids) for ids in token_ids], dtype=np.int64)
    token_offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=token_offsets[1:])
    columns = _Columns(
        ids=[record.id for record in records],
        titles=[record.title for record in records],
        texts=[record.text for record in records],
        token_offsets=token_offsets,
        token_ids=np.concatenate(token_ids),
        char_spans=np.concatenate(char_spans).reshape(-1, 2),
        states=np.concatenate(states).astype(np.float32, copy=False),
        state_shape=state_shape,
        vectors=_vectors(records, name),
    )
    _check_values(columns)
    return replace(
        columns,
        token_ids=columns.token_ids.astype(np.int32, copy=False),
        char_spans=columns.char_spans.astype(np.int32, copy=False),
    )


def _vectors(records: Sequence[PassageRecord], name: str) -> np.ndarray | None:
    """The records' vectors as float32 (n, d): all of one length and finite, or None when no record has one."""
    given = [record.vector is not None for record in records]
    if not any(given):
        return None
    if not all(given):
        missing = records[given.index(False)].id
        raise DilstoreError(f"passage {missing!r} has no vector, but others in shard {name} do: give all or none")
    vectors = [np.asarray(record.vector) for record in records]
    width = vectors[0].shape
    for record, vector in zip(records, vectors, strict=True):
        if vector.ndim != 1 or vector.shape != width or not vector.size or not np.issubdtype(vector.dtype, np.floating):
            raise DilstoreError(
                f"passage {record.id!r}: vector must be a float (d,) like the shard's first, got {vector.dtype} "
                f"{vector.shape}"
            )
        if not np.isfinite(vector).all():
            raise DilstoreError(f"passage {record.id!r}: vector has NaN or infinite values")
    return np.stack(vectors).astype(np.float32)  # (n, d)


def _check_record_shapes(record: PassageRecord, state_shape: tuple[int, ...], kind: str) -> None:
    """Raise DilstoreError naming `record.id` unless its strings, shapes and dtypes are right."""
    where = f"passage {record.id!r}"
    if not isinstance(record.id, str) or not record.id:
        raise DilstoreError(f"passage ids must be non-empty strings, got {record.id!r}")
    for label, value in (("id", record.id), ("title", record.title), ("text", record.text)):
        if not isinstance(value, str):
            raise DilstoreError(f"{where}: {label} must be a string, got {type(value).__name__}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise DilstoreError(f"{where}: {label} is not valid Unicode ({error.reason})") from None
    token_ids = np.asarray(record.token_ids)
    char_spans = np.asarray(record.char_spans)
    states = np.asarray(record.states)
    n = len(token_ids)
    if token_ids.ndim != 1 or not np.issubdtype(token_ids.dtype, np.integer):
        raise DilstoreError(f"{where}: token_ids must be a 1-D integer array, got {token_ids.dtype} {token_ids.shape}")
    if char_spans.shape != (n, 2) or not np.issubdtype(char_spans.dtype, np.integer):
        raise DilstoreError(f"{where}: char_spans must be integer ({n}, 2), got {char_spans.dtype} {char_spans.shape}")
    if states.shape != (n, *state_shape) or not np.issubdtype(states.dtype, np.floating):
        raise DilstoreError(
            f"{where}: states must be float ({n}, {', '.join(map(str, state_shape))}) for kind {kind!r} "
            f"like the shard's first passage, got {states.dtype} {states.shape}"
        )


def _check_values(columns: _Columns) -> None:
    """Check all tokens at once (int32 ids, finite states, spans inside their text); name the first bad passage."""

    def fail(token: int, problem: str) -> None:
        row = int(np.searchsorted(columns.token_offsets, token, side="right")) - 1
        local = token - int(columns.token_offsets[row])
        raise DilstoreError(f"passage {columns.ids[row]!r}: token {local} {problem}")

    ids = columns.token_ids
    bad = np.flatnonzero((ids < _INT32.min) | (ids > _INT32.max))
    if bad.size:
        fail(int(bad[0]), f"has id {int(ids[bad[0]])}, which does not fit int32")
    flat_states = columns.states.reshape(len(columns.states), math.prod(columns.state_shape))  # (T, prod(S))
    bad_token = _first_non_finite_row(flat_states)
    if bad_token is not None:
        fail(bad_token, "has NaN or infinite states")
    text_lengths = np.repeat(
        np.fromiter(map(len, columns.texts), dtype=np.int64, count=len(columns.texts)), np.diff(columns.token_offsets)
    )  # (T,)
    spans = columns.char_spans
    special = (spans == -1).all(axis=1)
    inside = (spans[:, 0] >= 0) & (spans[:, 0] <= spans[:, 1]) & (spans[:, 1] <= text_lengths)
    bad = np.flatnonzero(~(special | inside))
    if bad.size:
        token = int(bad[0])
        fail(token, f"has char span {tuple(spans[token].tolist())}, outside its text of {int(text_lengths[token])} "
                    "characters (special tokens use (-1, -1))")


def _first_non_finite_row(values: np.ndarray) -> int | None:
    """The first row of `values` `(T, F)` that holds a NaN or infinity, or None.

    Checked a block of rows at a time, so the temporary mask stays small (a whole shard's would be T x F bytes).
    """
    for start in range(0, len(values), _CHECK_ROWS):
        finite = np.isfinite(values[start : start + _CHECK_ROWS]).all(axis=1)  # (rows,)
        if not finite.all():
            return start + int(np.flatnonzero(~finite)[0])
    return None


def _write_group(
    path: Path,
    columns: _Columns,
    shard_index: int,
    kind: Kind,
    encoding: Encoding,
    compressor: str | None,
    codebook: Mapping[str, np.ndarray] | None,
    build: dict[str, str],
) -> None:
    """Write one shard's Zarr v3 group at `path`; `build` holds its generation, fingerprint hash and codebook, if any.

    A shard with centroid ids gets format version CENTROIDS_SHARD_VERSION, one coded against a rotated codebook
    ROTATED_SHARD_VERSION, so that older readers refuse them.
    """
    encoded = encoding.encode(columns.states, codebook)
    attributes = _shard_attributes(columns, shard_index, kind, encoding, compressor, build, encoded)
    group = zarr.open_group(str(path), mode="w-", zarr_format=3, attributes={ATTRIBUTES_KEY: attributes})
    _write_passage_columns(group, columns, compressor)
    _write_state_arrays(group, encoded, encoding, codebook, compressor, len(columns.state_shape))


def _shard_attributes(
    columns: _Columns,
    shard_index: int,
    kind: Kind,
    encoding: Encoding,
    compressor: str | None,
    build: dict[str, str],
    encoded: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """The shard's dilstore attributes (STORE_FORMAT §2)."""
    version = ROTATED_SHARD_VERSION if "rotation" in encoded else (
        CENTROIDS_SHARD_VERSION if "centroid_ids" in encoded else FORMAT_VERSION)
    return {
        "format": FORMAT_NAME,
        "format_version": version,
        "node": "shard",
        "shard": shard_index,
        "kind": kind.name,
        "encoding": encoding.name,
        "compressor": compressor,
        "state_shape": list(columns.state_shape),
        "passages": len(columns.ids),
        "tokens": len(columns.token_ids),
        # Only in shards with vectors, so shards without them keep their bytes.
        **({} if columns.vectors is None else {"vector_size": int(columns.vectors.shape[1])}),
        **build,
    }


def _write_passage_columns(group: zarr.Group, columns: _Columns, compressor: str | None) -> None:
    """Everything of the shard but its states: the ids, titles and texts, the vectors, the tokens and their spans."""
    for strings, data_path, offsets_path in (
        (columns.ids, ID_BYTES, ID_OFFSETS),
        (columns.titles, TITLE_BYTES, TITLE_OFFSETS),
        (columns.texts, TEXT_BYTES, TEXT_OFFSETS),
    ):
        data, offsets = encode_strings(strings)
        write_array(group, data_path, data, rows_per_chunk=BYTES_PER_CHUNK, compressor=compressor,
                    dimension_names=["byte"])
        write_array(group, offsets_path, offsets, rows_per_chunk=OFFSETS_PER_CHUNK, compressor=compressor,
                    dimension_names=["passage_boundary"])
    if columns.vectors is not None:
        write_array(group, VECTORS, columns.vectors, rows_per_chunk=VECTORS_PER_CHUNK, compressor=compressor,
                    dimension_names=["passage", "vector"])
    write_array(group, TOKEN_OFFSETS, columns.token_offsets, rows_per_chunk=OFFSETS_PER_CHUNK,
                compressor=compressor, dimension_names=["passage_boundary"])
    write_array(group, TOKEN_IDS, columns.token_ids, rows_per_chunk=TOKENS_PER_CHUNK, compressor=compressor,
                dimension_names=["token"])
    write_array(group, CHAR_SPANS, columns.char_spans, rows_per_chunk=TOKENS_PER_CHUNK, compressor=compressor,
                dimension_names=["token", "start_end"])


def _write_state_arrays(
    group: zarr.Group,
    encoded: Mapping[str, np.ndarray],
    encoding: Encoding,
    codebook: Mapping[str, np.ndarray] | None,
    compressor: str | None,
    state_rank: int,
) -> None:
    """The encoded states under `states/`, but for the codebook arrays the store's codebook/ group holds."""
    state_axes = [f"state_{axis}" for axis in range(state_rank)]
    for array_name, data in encoded.items():
        if codebook is not None and array_name in encoding.codebook:
            continue  # the store's codebook/ group holds it, once for all shards
        spec = encoding.array(array_name)
        if spec.per_token:
            axes = ["token", *state_axes[: data.ndim - 1]]
            rows = TOKENS_PER_CHUNK
        else:  # parameters shaped like a state, or a codebook with leading bucket axes
            leading = [f"entry_{axis}" for axis in range(data.ndim - len(state_axes))]
            axes, rows = [*leading, *state_axes][: data.ndim], data.shape[0]
        write_array(group, states_array(array_name), data, rows_per_chunk=rows, compressor=compressor,
                    dimension_names=axes)


def _same_tree(left: Path, right: Path) -> bool:
    """Whether two directories hold the same relative file names with the same bytes."""
    left_files = sorted(path.relative_to(left) for path in left.rglob("*") if path.is_file())
    right_files = sorted(path.relative_to(right) for path in right.rglob("*") if path.is_file())
    return left_files == right_files and all(
        filecmp.cmp(left / name, right / name, shallow=False) for name in left_files
    )


def _commit(temporary: Path, target: Path, durable: bool) -> str:
    """Rename the finished shard into place; see the module docstring for an existing target."""
    try:
        os.rename(temporary, target)
        status = "written"
    except OSError:
        if not target.is_dir():
            raise
        if _same_tree(temporary, target):
            return "kept"
        replaced = target.with_name(f"{TMP_PREFIX}replaced-{target.name}-{uuid.uuid4().hex}")
        os.rename(target, replaced)
        os.rename(temporary, target)
        shutil.rmtree(replaced, ignore_errors=True)
        status = "replaced"
    if durable:
        fsync_dir(target.parent)
    return status
