"""Reading one shard: its attributes, its per-passage columns and its per-token rows.

Each array of a shard is read through one of three sources: a memory-mapped
numpy view (uncompressed arrays on a local disk; slices are zero-copy views),
byte ranges of its file (uncompressed arrays of a remote store, storage/ranged.py)
or a zarr-python array (compressed arrays, or when asked for). Per-passage
columns that are small (offsets, ids, titles, vectors) are held whole; texts
and per-token arrays are sliced per request, and `read_ranges` reads the
slices of many columns, of one shard or several, in one round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import zarr
from zarr.core.sync import sync

from dilstore.storage.arrays import offsets_are_valid
from dilstore.storage.checks import is_integer, is_size_list
from dilstore.storage.encodings import Encoding, get_encoding
from dilstore.storage.format import (
    ATTRIBUTES_KEY,
    CHAR_SPANS,
    FORMAT_NAME,
    ID_BYTES,
    ID_OFFSETS,
    SHARD_FORMAT_VERSION,
    STORE_CODEBOOK,
    TEXT_BYTES,
    TEXT_OFFSETS,
    TITLE_BYTES,
    TITLE_OFFSETS,
    TOKEN_IDS,
    TOKEN_OFFSETS,
    VECTORS,
    ZARR_METADATA_FILE,
    StoreFormatError,
    check_compressor,
    fixed_arrays,
    get_kind,
    states_array,
)
from dilstore.storage.location import StoreLocation
from dilstore.storage.mapped import MappedArray, contiguous_layout, map_array, mappable_reason, watch
from dilstore.storage.ranged import RangedColumn, read_row_ranges
from dilstore.storage.records import EncodedPassage, StoredPassage
from dilstore.storage.zarr_reads import METADATA_ERRORS

T = TypeVar("T")


def _not_shard_attributes(data: Any) -> str | None:
    """What a group's `dilstore` attributes hold instead of a shard's: their absence, or the format or node value
    found; None when they are a shard's. Attributes that were there but named another format or node were reported
    as absent (tail61b F3)."""
    if data is None:
        return f"no '{ATTRIBUTES_KEY}' shard attributes"
    if not isinstance(data, dict):
        return f"its '{ATTRIBUTES_KEY}' attributes are a {type(data).__name__}, not an object"
    if data.get("format") != FORMAT_NAME:
        return f"its '{ATTRIBUTES_KEY}' attributes name format {data.get('format')!r:.40}, not {FORMAT_NAME!r}"
    if data.get("node") != "shard":
        return f"its '{ATTRIBUTES_KEY}' attributes name node {data.get('node')!r:.40}, not 'shard'"
    return None


@dataclass(frozen=True)
class ShardAttributes:
    """dilstore's attributes of one shard group."""

    shard: int
    kind: str
    encoding: str
    compressor: str | None
    state_shape: tuple[int, ...]
    passages: int
    tokens: int
    vector_size: int | None = None  # d of passages/vectors; None: the shard has no vectors
    generation: str | None = None  # the build this shard belongs to; None in stores made before generations
    fingerprint_sha256: str | None = None  # storage.fingerprint.fingerprint_sha256 of the model that made it
    # "store": the shard holds no codebook arrays and decodes with the store's `codebook/` group (2bit/1bit);
    # None: it holds whatever per-shard arrays its encoding declares (STORE_FORMAT.md §4).
    codebook: str | None = None

    @classmethod
    def of(cls, group: zarr.Group, where: str) -> ShardAttributes:
        """Parse and check a shard group's attributes; anything off is a StoreFormatError naming `where`."""
        data = group.attrs.asdict().get(ATTRIBUTES_KEY)
        if (problem := _not_shard_attributes(data)) is not None:
            raise StoreFormatError(f"{where} is not a dilstore shard ({problem})")
        version = data.get("format_version")
        if not is_integer(version):  # "2" or null raised a TypeError from the comparison; 2.5 and true were read
            raise StoreFormatError(f"{where} has format version {version!r:.40}, not an integer; run `dilstore verify`")
        if version > SHARD_FORMAT_VERSION:
            raise StoreFormatError(
                f"{where} has format version {version}, newer than this dilstore reads ({SHARD_FORMAT_VERSION}); "
                "upgrade dilstore"
            )
        try:
            attributes = cls(
                shard=int(data["shard"]),
                kind=get_kind(data["kind"]).name,
                encoding=get_encoding(data["encoding"]).name,
                compressor=check_compressor(data["compressor"]),
                state_shape=_state_shape(data["state_shape"]),
                passages=int(data["passages"]),
                tokens=int(data["tokens"]),
                vector_size=None if data.get("vector_size") is None else int(data["vector_size"]),
                generation=_optional_text(data, "generation"),
                fingerprint_sha256=_optional_text(data, "fingerprint_sha256"),
                codebook=_optional_text(data, "codebook"),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as error:  # Overflow: a count of 1e999, complex61 F8
            raise StoreFormatError(f"{where} has malformed attributes: {type(error).__name__}: {error}") from None
        get_kind(attributes.kind).check_state_shape(attributes.state_shape)
        if attributes.codebook not in (None, STORE_CODEBOOK):
            raise StoreFormatError(
                f"{where} has codebook {attributes.codebook!r}; this dilstore knows only {STORE_CODEBOOK!r}"
            )
        if attributes.codebook is not None and not get_encoding(attributes.encoding).codebook:
            raise StoreFormatError(
                f"{where} refers to a store codebook, but its encoding {attributes.encoding} has none"
            )
        return attributes

    @property
    def codebook_in_store(self) -> bool:
        """Whether the shard decodes with the store's `codebook/` group instead of arrays of its own."""
        return self.codebook == STORE_CODEBOOK


def _state_shape(shape: Any) -> tuple[int, ...]:
    """A shard's recorded per-token state shape: a list of positive sizes (tail61 F1: read with int() per item, the
    string "32" was the shape (3, 2) and "8" a dilbert shard of width 8, where the manifest and codebook readers
    refuse both)."""
    if not is_size_list(shape):
        raise ValueError(f"state_shape is {shape!r:.40}, not a list of positive sizes")
    return tuple(shape)


def _optional_text(data: dict[str, Any], key: str) -> str | None:
    """An optional string attribute; anything but a string or absence is malformed."""
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{key} must be a string, not {type(value).__name__}")
    return value


ReadPath = Literal["mmap", "ranged", "zarr"]


class MappedColumn:
    """A memory-mapped array; ranges are zero-copy read-only views."""

    def __init__(self, mapped: MappedArray) -> None:
        self.values = mapped.values
        self.file = mapped.file

    @property
    def rows(self) -> int:
        return len(self.values)

    def views(self, starts: np.ndarray, stops: np.ndarray) -> list[np.ndarray]:
        return [self.values[start:stop] for start, stop in zip(starts.tolist(), stops.tolist(), strict=True)]


class ZarrColumn:
    """An array read through zarr-python; the ranges of a request are read concurrently."""

    def __init__(self, array: zarr.Array, where: str) -> None:
        self.array = array
        self.where = where

    @property
    def rows(self) -> int:
        return self.array.shape[0]

    async def ranges(self, starts: np.ndarray, stops: np.ndarray) -> list[np.ndarray]:
        """The row ranges; bytes that do not decode (a checksum that differs or compressed bytes the codec refuses:
        a damaged file, or a server that sent the whole file for a byte range) are a StoreFormatError naming the
        array, not zarr-python's ValueError or the decompressor's RuntimeError. Every read ends before the first
        failure is raised, so none is left pending."""
        source = self.array.async_array
        try:
            spans = zip(starts.tolist(), stops.tolist(), strict=True)
            parts = await _gather_all(source.getitem(slice(start, stop)) for start, stop in spans)
        except (ValueError, RuntimeError) as error:
            raise StoreFormatError(
                f"{self.where} cannot be decoded ({error}): the file is damaged, or its server does not answer byte "
                "ranges (`Range: bytes=a-b` with 206); run `dilstore verify`"
            ) from None
        values = [np.asarray(part) for part in parts]
        for part in values:
            part.flags.writeable = False
        return values


async def _gather_all(reads: Iterable[Awaitable[T]]) -> list[T]:
    """The results of concurrent reads, or the first failure once every read has ended: raised while its siblings
    ran on, they were left pending ("Task was destroyed but it is pending!" at exit)."""
    results = await asyncio.gather(*reads, return_exceptions=True)
    failure = next((result for result in results if isinstance(result, BaseException)), None)
    if failure is not None:
        raise failure
    return results  # type: ignore[return-value]  # no failure among them


Column = MappedColumn | RangedColumn | ZarrColumn
RangeRequest = tuple[Column, np.ndarray, np.ndarray]  # a column and the row ranges starts[i]:stops[i] wanted of it


def read_ranges(requests: Sequence[RangeRequest], check: Sequence[RangedColumn] = ()) -> list[list[np.ndarray]]:
    """Row ranges of several columns: views of mapped ones, one coalesced round for ranged ones (which also checks
    the layout of the `check` columns, storage/ranged.py), and one concurrent zarr-python round for the rest."""
    results: list[list[np.ndarray]] = [[] for _ in requests]
    ranged = [i for i, (column, _, _) in enumerate(requests) if isinstance(column, RangedColumn)]
    through_zarr = [i for i, (column, _, _) in enumerate(requests) if isinstance(column, ZarrColumn)]
    for i, (column, starts, stops) in enumerate(requests):
        if isinstance(column, MappedColumn):
            results[i] = column.views(starts, stops)
    if ranged or check:
        fs = (check or [requests[i][0] for i in ranged])[0].fs  # type: ignore[union-attr]  # one store, one filesystem
        parts = read_row_ranges(fs, [requests[i] for i in ranged], check)  # type: ignore[misc]
        for i, rows in zip(ranged, parts, strict=True):
            results[i] = rows
    if through_zarr:

        async def gather() -> list[list[np.ndarray]]:
            reads = (requests[i][0].ranges(*requests[i][1:]) for i in through_zarr)  # type: ignore[union-attr]
            return await _gather_all(reads)

        for i, rows in zip(through_zarr, sync(gather()), strict=True):
            results[i] = rows
    return results


def read_whole(columns: Sequence[Column], check: Sequence[RangedColumn] = ()) -> list[np.ndarray]:
    """Every row of each column, in one round of requests for remote ones (checking `check`'s layouts in it)."""
    zero = np.zeros(1, dtype=np.int64)
    return [parts[0] for parts in read_ranges([(column, zero, np.array([column.rows])) for column in columns], check)]


def _column(
    array: zarr.Array | None, name: str, location: StoreLocation, relative: str, read_path: ReadPath
) -> Column:
    """Array `name` of shard `relative` as a column read by `read_path`: mapped, by byte ranges (uncompressed
    arrays), or through zarr-python; a StoreFormatError when the shard has no such array."""
    where = f"{location.path(relative)}/{name}"
    if array is None:
        raise StoreFormatError(f"{where} is missing or not an array")
    if read_path == "mmap":
        assert location.local_root is not None  # ShardReader refuses a remote store's "mmap" first
        return MappedColumn(map_array(array, location.local_root / relative / name))
    if read_path == "ranged" and mappable_reason(array) is None:
        layout = contiguous_layout(array, where)
        return RangedColumn(location.fs, location.path(f"{relative}/{name}/{layout.chunk_key}"), layout)
    return ZarrColumn(array, where)


def _open_arrays(group: zarr.Group, names: Sequence[str], where: str) -> dict[str, zarr.Array | None]:
    """The arrays `names` (paths under `group`, at `where`), their metadata read concurrently; None where there is
    no array.

    Opening by name needs no directory listing, which plain HTTP servers and
    CDNs do not give, and one concurrent round instead of a request per array.
    Metadata that cannot be read (a truncated zarr.json) raises StoreFormatError naming the array.
    """

    async def one(name: str) -> zarr.Array | None:
        try:
            node = await group._async_group.getitem(name)  # zarr.Group has no public async handle (zarr < 3.2 pinned)
        except KeyError:
            return None
        except METADATA_ERRORS as error:
            raise StoreFormatError(
                f"cannot open {where}/{name}: {type(error).__name__}: {error}; run `dilstore verify`"
            ) from None
        return zarr.Array(node) if isinstance(node, zarr.AsyncArray) else None

    async def every() -> list[zarr.Array | None]:
        return list(await asyncio.gather(*(one(name) for name in names)))

    return dict(zip(names, sync(every()), strict=True))


class ShardReader:
    """Read access to one committed shard through memory maps, byte ranges or zarr-python."""

    def __init__(
        self,
        location: StoreLocation,
        relative: str,
        *,
        read_path: ReadPath,
        store_codebook: Callable[[], Mapping[str, np.ndarray]] | None = None,
    ) -> None:
        """Open shard `relative` of `location`, reading every array by `read_path`.

        "mmap" maps every array; "ranged" reads uncompressed arrays by coalesced
        byte ranges (remote stores) and compressed ones through zarr-python;
        "zarr" uses zarr-python for everything. store_codebook: gives the
        store's codebook, loaded and prepared (Encoding.prepare) once per
        store, for a shard whose attributes say it decodes with it
        (`codebook: "store"`).
        """
        where = location.path(relative)
        local_root = location.local_root
        # Found before the group is read: a rebuild after this is seen by the generation check or by check_unchanged.
        watched = None if local_root is None or read_path == "mmap" else local_root / relative / ZARR_METADATA_FILE
        metadata = None if watched is None else watch(watched)
        try:
            group = location.open_group(relative)
        except METADATA_ERRORS as error:
            raise StoreFormatError(f"cannot open shard {where}: {type(error).__name__}: {error}") from None
        self.where = where
        self.attributes = ShardAttributes.of(group, where)
        self.encoding: Encoding = get_encoding(self.attributes.encoding)
        if read_path == "mmap" and local_root is None:
            raise StoreFormatError(f"cannot memory-map {location.url}: not on the local filesystem")
        from_store = set(self.encoding.codebook) if self.attributes.codebook_in_store else set()
        if from_store and store_codebook is None:
            raise StoreFormatError(f"{where} decodes with its store's codebook/, and none was given")
        held = self._codebook_held(group, store_codebook if from_store else None)
        per_shard, per_token, orphans = self._state_arrays(held, from_store)
        columns, whole = self._open_columns(group, location, relative, read_path, per_shard, per_token, orphans)
        self.id_bytes, self.id_offsets = whole[ID_BYTES], whole[ID_OFFSETS]
        self.title_bytes, self.title_offsets = whole[TITLE_BYTES], whole[TITLE_OFFSETS]
        self.text_offsets, self.token_offsets = whole[TEXT_OFFSETS], whole[TOKEN_OFFSETS]
        self.texts = columns[TEXT_BYTES]
        self.token_ids = columns[TOKEN_IDS]
        self.char_spans = columns[CHAR_SPANS]
        self.per_token = {name: columns[states_array(name)] for name in per_token}
        self.per_shard = {name: whole[states_array(name)] for name in per_shard}
        self._refuse_bad_shard_values()
        if from_store:
            assert store_codebook is not None
            self.per_shard.update(store_codebook())  # already prepared, once per store
        elif self.encoding.prepare is not None:  # a shard's own codebook: its lookup tables, once per open shard
            self.per_shard = self.encoding.prepare(self.per_shard)
        self.vectors = whole.get(VECTORS)  # (n, d) float32, None when the shard has none
        # What Store.check_files checks before a lookup reads this shard: its mapped files, or its metadata.
        self.watched_files = [column.file for column in columns.values()
                              if isinstance(column, MappedColumn) and column.file is not None]  # fmt: skip
        if metadata is not None:
            self.watched_files.append(metadata)
        self._check_offsets({name: column.rows for name, column in columns.items()})

    def _open_columns(
        self, group: zarr.Group, location: StoreLocation, relative: str, read_path: ReadPath,
        per_shard: Sequence[str], per_token: Sequence[str], orphans: Sequence[str],
    ) -> tuple[dict[str, Column], dict[str, np.ndarray]]:
        """Every array of the shard opened as a column once its dtype and shape are checked, and the small ones
        (ids, titles' and texts' offsets, per-shard states, vectors) read whole, by coalesced ranges on a remote
        store. `orphans` are codes whose decoding table is missing: refused here with the reason."""
        whole_names = [ID_BYTES, ID_OFFSETS, TITLE_BYTES, TITLE_OFFSETS, TEXT_OFFSETS, TOKEN_OFFSETS,
                       *(states_array(name) for name in per_shard),
                       *([VECTORS] if self.attributes.vector_size is not None else [])]  # fmt: skip
        streamed = [TEXT_BYTES, TOKEN_IDS, CHAR_SPANS, *(states_array(name) for name in [*per_token, *orphans])]
        arrays = _open_arrays(group, [*whole_names, *streamed], self.where)
        self._refuse_codes_the_codebook_cannot_decode({name: arrays.pop(states_array(name)) for name in orphans})
        self._refuse_other_arrays(arrays, per_shard, per_token)
        columns = {name: _column(array, name, location, relative, read_path) for name, array in arrays.items()}
        ranged = [column for column in columns.values() if isinstance(column, RangedColumn)]
        whole = dict(zip(whole_names, read_whole([columns[name] for name in whole_names], ranged), strict=True))
        return columns, whole

    def _refuse_other_arrays(self, arrays: Mapping[str, zarr.Array | None], per_shard: Sequence[str],
                             per_token: Sequence[str]) -> None:  # fmt: skip
        """A StoreFormatError naming the first array whose declared dtype or shape is not the one the shard's
        attributes and encoding give (metadata only: nothing is read).

        fp16 states declared int16, or int8 codes declared uint8, have the same size, so the size checks let
        them through and they were read as other values: silently wrong answers (hostile47 F4); an int8 shard's
        channel scales of another length failed inside the decode with numpy's error (F5).
        """
        tokens, state_shape = self.attributes.tokens, self.attributes.state_shape
        expected = fixed_arrays(self.attributes.passages, tokens, self.attributes.vector_size)
        specs = {spec.name: spec for spec in self.encoding.arrays}
        for name in per_token:
            expected[states_array(name)] = (specs[name].dtype, (tokens, *specs[name].shape(state_shape)))
        for name in per_shard:
            expected[states_array(name)] = (specs[name].dtype, specs[name].shape(state_shape))
        for name, (dtype, shape) in expected.items():
            array = arrays.get(name)
            if array is None:
                continue  # named when its column is made
            if array.dtype != np.dtype(dtype) or (array.shape != shape if shape is not None else array.ndim != 1):
                wanted = f"{dtype} {shape}" if shape is not None else f"1-D {dtype}"
                raise StoreFormatError(f"{self.where}/{name} is {array.dtype} {array.shape}, expected {wanted}; run "
                                       "`dilstore verify`")  # fmt: skip

    def _refuse_bad_shard_values(self) -> None:
        """A StoreFormatError when a per-shard array read whole holds values its encoding refuses (int8 channel
        scales of zero decoded every state to zeros: finite, silently wrong answers; hostile47 F5). These arrays
        are a few hundred values, read anyway."""
        specs = {spec.name: spec for spec in self.encoding.arrays}
        for name, values in self.per_shard.items():
            problem = specs[name].check(np.asarray(values))
            if problem:
                raise StoreFormatError(f"{self.where}/{states_array(name)} {problem}; run `dilstore verify`")

    def _state_arrays(self, held: set[str], from_store: set[str]) -> tuple[list[str], list[str], list[str]]:
        """The encoding's arrays this shard holds, by name: those per shard (read whole; not the ones its store's
        codebook gives), those per token, and the orphans, arrays whose codebook array is gone, looked for in the
        same round so that they can be refused (`_refuse_codes_the_codebook_cannot_decode`)."""
        layout = self.encoding.layout(held)
        per_shard = [spec.name for spec in layout if not spec.per_token and spec.name not in from_store]
        per_token = [spec.name for spec in layout if spec.per_token]
        orphans = [spec.name for spec in self.encoding.arrays
                   if spec.requires is not None and spec.requires not in held]  # fmt: skip
        return per_shard, per_token, orphans

    def _codebook_held(self, group: zarr.Group, store_codebook: Callable[[], Mapping[str, np.ndarray]] | None
                       ) -> set[str]:
        """The optional codebook arrays (Encoding.layout) the shard decodes with: the store's, or its own.

        A 2bit/1bit codebook without `centroids` (written before them) means a
        shard without `centroid_ids`, decoded as before.
        """
        optional = self.encoding.optional_codebook()
        if store_codebook is not None:
            return set(optional) & set(store_codebook())
        found = _open_arrays(group, [states_array(name) for name in optional], self.where)
        return {name for name in optional if found[states_array(name)] is not None}

    def _refuse_codes_the_codebook_cannot_decode(self, orphans: Mapping[str, zarr.Array | None]) -> None:
        """A StoreFormatError when the shard holds an array whose codebook array is gone (`centroid_ids` without
        `centroids`): reading on would decode every state against the wrong reference, without an error.

        `orphans`: such arrays by name, None where the shard (rightly) lacks them.
        """
        for name, array in orphans.items():
            if array is not None:
                spec = self.encoding.array(name)
                raise StoreFormatError(f"{self.where} holds {states_array(name)}, but its codebook has no "
                                       f"{spec.requires!r} to decode it with; run `dilstore verify`")  # fmt: skip

    def _check_offsets(self, rows: dict[str, int]) -> None:
        """Every ragged column's offsets fit its passages and data, so no read can mix up passages.

        A StoreFormatError (one line naming the shard, pointing at `verify`)
        rather than wrong passages later: damaged offsets would silently give
        one passage its neighbours' tokens.
        """
        columns = (
            (ID_OFFSETS, self.id_offsets, ID_BYTES),
            (TITLE_OFFSETS, self.title_offsets, TITLE_BYTES),
            (TEXT_OFFSETS, self.text_offsets, TEXT_BYTES),
            (TOKEN_OFFSETS, self.token_offsets, TOKEN_IDS),
        )
        for name, offsets, data in columns:
            if len(offsets) != self.attributes.passages + 1 or not offsets_are_valid(offsets, rows[data]):
                raise StoreFormatError(
                    f"{self.where}/{name}: offsets do not fit its {self.attributes.passages} passages and "
                    f"{data}; the store is damaged, run `dilstore verify`"
                )
        if self.vectors is not None and len(self.vectors) != self.attributes.passages:
            raise StoreFormatError(
                f"{self.where}/{VECTORS}: {len(self.vectors)} vectors for {self.attributes.passages} passages; "
                "the store is damaged, run `dilstore verify`"
            )

    def __len__(self) -> int:
        return self.attributes.passages

    def id_at(self, row: int) -> str:
        """The passage id stored at `row`; a StoreFormatError when the row is out of range or not UTF-8."""
        if not 0 <= row < self.attributes.passages:
            raise StoreFormatError(
                f"{self.where}: asked for row {row} of {self.attributes.passages} passages (the id index is "
                "damaged); run `dilstore verify`"
            )
        return self._string(self.id_bytes, self.id_offsets, row, "id")

    def ids(self) -> list[str]:
        """Every passage id of the shard, in row order (compaction's routing and the check that a store is compact)."""
        return [self.id_at(row) for row in range(len(self))]

    def _string(self, data: np.ndarray, offsets: np.ndarray, row: int, what: str) -> str:
        """String `row` of a ragged UTF-8 column (`what` names it in errors)."""
        return self._decoded(data[int(offsets[row]) : int(offsets[row + 1])], row, what)

    def _decoded(self, raw: np.ndarray, row: int, what: str) -> str:
        """UTF-8 bytes as text, with damage reported as one StoreFormatError line that points at `verify`."""
        try:
            return raw.tobytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise StoreFormatError(
                f"{self.where}: the {what} of row {row} is not UTF-8 ({error.reason} at byte {error.start}); "
                "the store is damaged, run `dilstore verify`"
            ) from None

    def read(self, rows: Sequence[int]) -> list[StoredPassage]:
        """The passages at `rows` (any order, repeats allowed), states decoded."""
        return self.passages(rows, read_ranges(self.requests(rows)))

    def requests(self, rows: Sequence[int]) -> list[RangeRequest]:
        """What `passages` needs read for `rows`: texts, token ids, char spans and per-token states.

        Store.fetch reads the requests of every shard a fetch touches in one round.
        """
        rows = np.asarray(rows, dtype=np.int64)
        token_starts, token_stops = self.token_offsets[rows], self.token_offsets[rows + 1]
        return [
            (self.texts, self.text_offsets[rows], self.text_offsets[rows + 1]),
            (self.token_ids, token_starts, token_stops),
            (self.char_spans, token_starts, token_stops),
            *((self.per_token[name], token_starts, token_stops) for name in self.per_token),
        ]

    def encoded(self, rows: Sequence[int]) -> list[EncodedPassage]:
        """The passages at `rows` with their per-token state arrays as stored, not decoded: what
        writer.write_encoded_shard copies into another shard (storage.compact)."""
        rows = np.asarray(rows, dtype=np.int64)
        texts, token_ids, char_spans, *states = read_ranges(self.requests(rows))
        return [
            EncodedPassage(
                id=self.id_at(row),
                title=self._string(self.title_bytes, self.title_offsets, row, "title"),
                text=self._decoded(texts[i], row, "text"),
                token_ids=token_ids[i],
                char_spans=char_spans[i],
                arrays={name: values[i] for name, values in zip(self.per_token, states, strict=True)},
                vector=None if self.vectors is None else self.vectors[row],
            )
            for i, row in enumerate(rows.tolist())
        ]

    def passages(self, rows: Sequence[int], parts: list[list[np.ndarray]]) -> list[StoredPassage]:
        """The passages at `rows` from what `requests(rows)` read (`parts`, in its order), states decoded."""
        rows = np.asarray(rows, dtype=np.int64)
        token_lengths = self.token_offsets[rows + 1] - self.token_offsets[rows]
        texts, token_ids, char_spans, *states = parts
        per_token = dict(zip(self.per_token, states, strict=True))
        decoded = None
        if not self.encoding.zero_copy and len(rows):  # one decode call for all rows, then a view per passage
            joined = {name: np.concatenate(values) for name, values in per_token.items()}
            whole = self.encoding.decode({**joined, **self.per_shard})  # (Σn, *S)
            decoded = np.split(whole, np.cumsum(token_lengths[:-1]))
        passages = []
        for i, row in enumerate(rows.tolist()):
            arrays: dict[str, Any] = {name: values[i] for name, values in per_token.items()}
            arrays.update(self.per_shard)
            passages.append(
                StoredPassage(
                    id=self.id_at(row),
                    title=self._string(self.title_bytes, self.title_offsets, row, "title"),
                    text=self._decoded(texts[i], row, "text"),
                    token_ids=token_ids[i],
                    char_spans=char_spans[i],
                    states=self.encoding.decode(arrays) if decoded is None else decoded[i],
                    vector=None if self.vectors is None else self.vectors[row],
                )
            )
        return passages

