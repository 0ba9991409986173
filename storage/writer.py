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
`write_encoded_shard` writes rows whose states are already encoded (a
compaction's copies) the same way, their codes unchanged.
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

from dilstore.storage.arrays import encode_strings, local_group, write_array
from dilstore.storage.checksums import record_checksums
from dilstore.storage.durability import fsync_dir, fsync_tree
from dilstore.storage.encodings import EncodedArray, Encoding, beyond_range, check_codebook, get_encoding
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint, fingerprint_sha256
from dilstore.storage.format import (
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
    TOKEN_IDS,
    TOKEN_OFFSETS,
    TOKENS_PER_CHUNK,
    VECTORS,
    VECTORS_PER_CHUNK,
    ZARR_METADATA_FILE,
    Kind,
    StoreFormatError,
    check_compressor,
    get_kind,
    shard_name,
    states_array,
)
from dilstore.storage.records import EncodedPassage, PassageRecord
from dilstore.storage.residual_codes import ScaleBeyondRange
from dilstore.storage.shard import ShardAttributes
from dilstore.storage.zarr_reads import METADATA_ERRORS

_INT32 = np.iinfo(np.int32)
_CHECK_ROWS = 8192  # token rows checked for NaN and infinity at a time
NON_FINITE = "has NaN or infinite states"  # what the refusal of such a token says, after `passage 'ID': token N`


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
    """A shard's passages, validated and concatenated: everything but their states."""

    ids: list[str]
    titles: list[str]
    texts: list[str]
    token_offsets: np.ndarray  # (n+1,) int64
    token_ids: np.ndarray  # (T,) int32
    char_spans: np.ndarray  # (T, 2) int32
    state_shape: tuple[int, ...]
    vectors: np.ndarray | None  # (n, d) float32, or None when the passages have none


def shard_written(store_root: str | Path, shard_index: int) -> bool:
    """Whether shard `shard_index` is in place: write_shard renames a finished shard folder in, group metadata
    and all, so its zarr.json is there only once every file is."""
    return (Path(store_root) / SHARDS_DIR / shard_name(shard_index) / ZARR_METADATA_FILE).is_file()


def shard_generation(store_root: str | Path, shard_index: int) -> str | None:
    """The build recorded in shard `shard_index`'s attributes; None when it has none or is absent or unreadable."""
    path = Path(store_root) / SHARDS_DIR / shard_name(shard_index)
    try:
        return ShardAttributes.of(local_group(path, mode="r"), str(path)).generation
    except (StoreFormatError, *METADATA_ERRORS):
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
    _refuse_finalized(root, shard_index)
    kind_spec = get_kind(kind)
    encoding_spec = get_encoding(encoding)
    check_compressor(compressor)
    columns, states = _collect(records, kind_spec, shard_name(shard_index))
    if codebook is not None:
        check_codebook(encoding_spec, codebook, columns.state_shape)
    try:
        encoded = encoding_spec.encode(states, codebook)
    except StoreFormatError as error:  # the encoder checks its range in one pass; the token is looked for on refusal
        if encoding_spec.max_abs is not None:
            _refuse_beyond_range(columns, states, encoding_spec)
        if isinstance(error, ScaleBeyondRange):  # 2bit/1bit: the encoder knows the token, the shard its passage
            _fail(columns, error.row, error.problem)
        raise
    _refuse_shard_problems(columns, encoding_spec, encoded, shard_name(shard_index))
    return _publish(root, shard_index, columns, encoded, _ShardSettings(
        kind_spec, encoding_spec, compressor, codebook, build_attributes(generation, fingerprint), durable))


def write_encoded_shard(
    store_root: str | Path,
    shard_index: int,
    passages: Sequence[EncodedPassage],
    *,
    kind: str,
    encoding: str,
    state_shape: tuple[int, ...],
    compressor: str | None = None,
    durable: bool = True,
    codebook: Mapping[str, np.ndarray] | None = None,
    generation: str | None = None,
    fingerprint: Fingerprint | None = None,
) -> ShardSummary:
    """Write passages whose states are already encoded as shard `shard_index`, their state arrays unchanged.

    For rows copied out of other shards of this kind and encoding (storage.compact), which then decode to
    exactly the states they did: an encoding's per-token codes mean the same in any shard only when nothing
    else they decode with belongs to one shard. So the encoding must keep no shard-wide arrays (fp32, fp16),
    or `codebook`, the store-wide codebook the caller writes to the new store, must hold them all (2bit/1bit
    stores with a `codebook/`); int8's per-shard channel scales, or a shard's own codebook, are refused.
    The other arguments and the checks of ids, tokens and spans are write_shard's.
    """
    root = Path(store_root)
    _refuse_finalized(root, shard_index)
    kind_spec = get_kind(kind)
    encoding_spec = get_encoding(encoding)
    check_compressor(compressor)
    state_shape = kind_spec.check_state_shape(tuple(state_shape))
    held = codebook or {}
    layout = encoding_spec.layout(held)
    shard_wide = [spec.name for spec in layout if not spec.per_token and spec.name not in held]
    if shard_wide:
        raise DilstoreError(
            f"{encoding} codes decode with arrays of their own shard ({', '.join(shard_wide)}), so they cannot be "
            f"copied into shard {shard_name(shard_index)} unchanged"
        )
    if codebook is not None:
        check_codebook(encoding_spec, codebook, state_shape)
    columns, encoded = _collect_encoded(passages, state_shape, [spec for spec in layout if spec.per_token],
                                        shard_name(shard_index))  # fmt: skip
    return _publish(root, shard_index, columns, encoded, _ShardSettings(
        kind_spec, encoding_spec, compressor, codebook, build_attributes(generation, fingerprint), durable))


@dataclass(frozen=True)
class _ShardSettings:
    """How `_publish` writes a shard: its kind and encoding, compression, the store's codebook (None: the shard
    keeps its own, or needs none), its build attributes and whether to fsync."""

    kind: Kind
    encoding: Encoding
    compressor: str | None
    codebook: Mapping[str, np.ndarray] | None
    build: dict[str, str]
    durable: bool


def _refuse_finalized(root: Path, shard_index: int) -> None:
    """A DilstoreError when the store at `root` is finalized: nothing is written into one."""
    if (root / MANIFEST_FILE).exists():
        raise DilstoreError(f"{root} is finalized; write shard {shard_name(shard_index)} into a new store, or delete "
                            "manifest.json first")  # fmt: skip


def _publish(
    root: Path, shard_index: int, columns: _Columns, encoded: Mapping[str, np.ndarray], settings: _ShardSettings
) -> ShardSummary:
    """Write the shard's group under a temporary name, record its checksums, fsync, and rename it into place."""
    name = shard_name(shard_index)
    shards_dir = root / SHARDS_DIR
    shards_dir.mkdir(parents=True, exist_ok=True)
    temporary = shards_dir / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex}"
    build = settings.build
    if settings.codebook is not None and settings.encoding.codebook:
        build = {**build, "codebook": STORE_CODEBOOK}
    try:
        _write_group(temporary, columns, encoded, shard_index, replace(settings, build=build))
        record_checksums(temporary)
        if settings.durable:
            fsync_tree(temporary)
        status = _commit(temporary, shards_dir / name, settings.durable)
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


def _collect(records: Sequence[PassageRecord], kind: Kind, name: str) -> tuple[_Columns, np.ndarray]:
    """Validate every record and concatenate them, states `(T, *S)` float32 apart; the first problem raises with
    the passage id."""
    if not records:
        raise DilstoreError(f"shard {name} has no passages; write only non-empty shards")
    state_shape = kind.check_state_shape(np.shape(records[0].states)[1:])
    for record in records:
        _check_passage_fields(record)
        states = np.asarray(record.states)
        if states.shape != (len(record.token_ids), *state_shape) or not np.issubdtype(states.dtype, np.floating):
            raise DilstoreError(
                f"passage {record.id!r}: states must be float ({len(record.token_ids)}, "
                f"{', '.join(map(str, state_shape))}) for kind {kind.name!r} like the shard's first passage, got "
                f"{states.dtype} {states.shape}"
            )
    columns = _concatenated(records, state_shape, name)
    states = np.concatenate([np.asarray(record.states) for record in records]).astype(np.float32, copy=False)
    bad_token = _first_non_finite_row(states.reshape(len(states), math.prod(state_shape)))  # (T, prod(S))
    if bad_token is not None:
        _fail(columns, bad_token, NON_FINITE)
    return columns, states


def _refuse_beyond_range(columns: _Columns, states: np.ndarray, encoding: Encoding) -> None:
    """Name the first token whose states exceed what `encoding` stores (`max_abs`: fp16's 65504), as the NaN check
    does: the encoder's own refusal, which write_shard's caller would get otherwise, names no passage (codes51 F7)."""
    assert encoding.max_abs is not None
    flat = states.reshape(len(states), math.prod(columns.state_shape))  # (T, prod(S))
    for start in range(0, len(flat), _CHECK_ROWS):
        peaks = np.abs(flat[start : start + _CHECK_ROWS]).max(axis=1)  # (rows,)
        beyond = np.flatnonzero(peaks > encoding.max_abs)
        if beyond.size:
            _fail(columns, start + int(beyond[0]), f"has states that {beyond_range(encoding, float(peaks[beyond[0]]))}")


def _refuse_shard_problems(columns: _Columns, encoding: Encoding, encoded: Mapping[str, np.ndarray], name: str) -> None:
    """Refuse what verify would report of the encoded arrays together (Encoding.shard_problems; int8: a scale that
    decodes to inf, or every scale zero): write_shard wrote such a shard and only verify told (codes51 F6). Where
    the problem is a per-token array's largest value, the passage of the token that holds it is named."""
    if encoding.shard_problems is None:
        return
    problems = encoding.shard_problems(lambda array: [encoded[array]])
    if not problems:
        return
    array, problem = problems[0]
    values = encoded[array]
    if encoding.array(array).per_token and values.size and float(values.max()) > 0:
        token = int(np.argmax(values.reshape(len(values), values[0].size).max(axis=1)))
        _fail(columns, token, f"has states that {encoding.name} cannot store: {states_array(array)} {problem}; "
                              "use fp32")  # fmt: skip
    raise DilstoreError(f"shard {name}: {encoding.name} {states_array(array)} {problem}")


def _collect_encoded(
    passages: Sequence[EncodedPassage], state_shape: tuple[int, ...], per_token: Sequence[EncodedArray], name: str
) -> tuple[_Columns, dict[str, np.ndarray]]:
    """Validate every encoded passage and concatenate them, each per-token state array `(T, ...)` apart; the first
    problem raises with the passage id (an array missing, of another shape or dtype, or of values its encoding
    never writes)."""
    if not passages:
        raise DilstoreError(f"shard {name} has no passages; write only non-empty shards")
    wanted = sorted(spec.name for spec in per_token)
    for passage in passages:
        _check_passage_fields(passage)
        if sorted(passage.arrays) != wanted:
            raise DilstoreError(f"passage {passage.id!r}: encoded arrays {sorted(passage.arrays)}, this encoding "
                                f"stores {wanted}")  # fmt: skip
        for spec in per_token:
            values = np.asarray(passage.arrays[spec.name])
            shape = (len(passage.token_ids), *spec.shape(state_shape))
            if values.shape != shape or values.dtype != np.dtype(spec.dtype):
                raise DilstoreError(f"passage {passage.id!r}: {spec.name} must be {spec.dtype} {shape}, got "
                                    f"{values.dtype} {values.shape}")  # fmt: skip
    columns = _concatenated(passages, state_shape, name)
    encoded = {spec.name: np.concatenate([np.asarray(passage.arrays[spec.name]) for passage in passages])
               for spec in per_token}  # fmt: skip
    for spec in per_token:
        problem = spec.check(encoded[spec.name])
        if problem is not None:
            raise DilstoreError(f"shard {name}: {spec.name} {problem}")
    return columns, encoded


def _concatenated(passages: Sequence[PassageRecord | EncodedPassage], state_shape: tuple[int, ...], name: str
                  ) -> _Columns:
    """The passages' ids, texts, tokens, spans and vectors as one shard's columns, once ids, token ids and spans
    are checked (`_check_values`)."""
    seen: set[str] = set()
    for passage in passages:
        if passage.id in seen:
            raise DilstoreError(f"passage id {passage.id!r} occurs twice in shard {name}")
        seen.add(passage.id)
    lengths = np.array([len(passage.token_ids) for passage in passages], dtype=np.int64)
    token_offsets = np.zeros(len(passages) + 1, dtype=np.int64)
    np.cumsum(lengths, out=token_offsets[1:])
    columns = _Columns(
        ids=[passage.id for passage in passages],
        titles=[passage.title for passage in passages],
        texts=[passage.text for passage in passages],
        token_offsets=token_offsets,
        token_ids=np.concatenate([np.asarray(passage.token_ids) for passage in passages]),
        char_spans=np.concatenate([np.asarray(passage.char_spans) for passage in passages]).reshape(-1, 2),
        state_shape=state_shape,
        vectors=_vectors(passages, name),
    )
    _check_values(columns)
    return replace(
        columns,
        token_ids=columns.token_ids.astype(np.int32, copy=False),
        char_spans=columns.char_spans.astype(np.int32, copy=False),
    )


def _vectors(records: Sequence[PassageRecord | EncodedPassage], name: str) -> np.ndarray | None:
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


def _check_passage_fields(record: PassageRecord | EncodedPassage) -> None:
    """Raise DilstoreError naming `record.id` unless its strings, token ids and char spans are of the right types
    and shapes."""
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
    n = len(token_ids)
    if token_ids.ndim != 1 or not np.issubdtype(token_ids.dtype, np.integer):
        raise DilstoreError(f"{where}: token_ids must be a 1-D integer array, got {token_ids.dtype} {token_ids.shape}")
    if char_spans.shape != (n, 2) or not np.issubdtype(char_spans.dtype, np.integer):
        raise DilstoreError(f"{where}: char_spans must be integer ({n}, 2), got {char_spans.dtype} {char_spans.shape}")


def _fail(columns: _Columns, token: int, problem: str) -> None:
    """Raise DilstoreError naming the passage that token `token` of the shard belongs to, and its place in it."""
    row = int(np.searchsorted(columns.token_offsets, token, side="right")) - 1
    local = token - int(columns.token_offsets[row])
    raise _token_error(columns.ids[row], local, problem)


def _token_error(passage_id: str, token: int, problem: str) -> DilstoreError:
    return DilstoreError(f"passage {passage_id!r}: token {token} {problem}")


def refuse_non_finite(passage_id: str, states: np.ndarray) -> None:
    """Raise the writer's refusal of a passage whose states `(n, *S)` hold a NaN or infinity (`passage 'ID': token
    N has NaN or infinite states`), for the 2bit/1bit sampling pass, which sees states before any shard writer."""
    values = np.asarray(states)
    bad_token = _first_non_finite_row(values.reshape(len(values), -1))  # (n, prod(S))
    if bad_token is not None:
        raise _token_error(passage_id, bad_token, NON_FINITE)


def _check_values(columns: _Columns) -> None:
    """Check all tokens at once (int32 ids, spans inside their text); name the first bad passage."""
    ids = columns.token_ids
    bad = np.flatnonzero((ids < _INT32.min) | (ids > _INT32.max))
    if bad.size:
        _fail(columns, int(bad[0]), f"has id {int(ids[bad[0]])}, which does not fit int32")
    text_lengths = np.repeat(
        np.fromiter(map(len, columns.texts), dtype=np.int64, count=len(columns.texts)), np.diff(columns.token_offsets)
    )  # (T,)
    spans = columns.char_spans
    special = (spans == -1).all(axis=1)
    inside = (spans[:, 0] >= 0) & (spans[:, 0] <= spans[:, 1]) & (spans[:, 1] <= text_lengths)
    bad = np.flatnonzero(~(special | inside))
    if bad.size:
        token = int(bad[0])
        _fail(columns, token, f"has char span {tuple(spans[token].tolist())}, outside its text of "
                              f"{int(text_lengths[token])} characters (special tokens use (-1, -1))")


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
    path: Path, columns: _Columns, encoded: Mapping[str, np.ndarray], shard_index: int, settings: _ShardSettings
) -> None:
    """Write one shard's Zarr v3 group at `path`; `settings.build` holds its generation, fingerprint hash and
    codebook, if any.

    A shard with centroid ids gets format version CENTROIDS_SHARD_VERSION, one coded against a rotated codebook
    ROTATED_SHARD_VERSION, so that older readers refuse them.
    """
    arrays = {**(settings.codebook or {}), **encoded}  # what the shard decodes with, for its format version
    attributes = _shard_attributes(columns, shard_index, settings.kind, settings.encoding, settings.compressor,
                                   settings.build, arrays)  # fmt: skip
    group = local_group(path, mode="w-", zarr_format=3, attributes={ATTRIBUTES_KEY: attributes})
    _write_passage_columns(group, columns, settings.compressor)
    _write_state_arrays(group, encoded, settings.encoding, settings.codebook, settings.compressor,
                        len(columns.state_shape))  # fmt: skip


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
