"""Opening a finalized store read-only and fetching passages by id.

    store = open_store("/stores/squad-dilbert-k4", expected=model_fingerprint)
    passages = store.fetch(["p-17", "p-3", "p-17"])  # any order, repeats, across shards
    passages[0].states  # (n, d): a view into the shard file for fp32/fp16

Local uncompressed stores are memory-mapped and fp32/fp16 states come back as
read-only views of the page cache; remote uncompressed stores (any fsspec URL:
https://, s3://, ...) are read by coalesced byte ranges, one concurrent round
per fetch (storage/ranged.py); compressed stores go through zarr-python. All
give the same values, and none writes anything. A Store is safe to share
between threads; processes open their own, inherit one across fork, or get one pickled (opened again there).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
import zarr

from dilstore.storage.checks import as_list
from dilstore.storage.codebook import load_store_codebook
from dilstore.storage.encodings import get_encoding
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint, check_fingerprint
from dilstore.storage.format import (
    ATTRIBUTES_KEY,
    INDEX_HASHES,
    INDEX_ROWS,
    INDEX_SHARDS,
    MANIFEST_FILE,
    StoreChangedError,
    StoreFormatError,
    StoreReadError,
    check_compressor,
    get_kind,
)
from dilstore.storage.id_index import IdIndex, Superseded, header_matches, id_hashes, read_superseded
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest, read_manifest
from dilstore.storage.mapped import WatchedFile, check_unchanged, map_array, read_array_file, shards_kept_open
from dilstore.storage.messages import listed, other_form_hint
from dilstore.storage.read_failures import LASTING_ERRNOS
from dilstore.storage.records import StoredPassage
from dilstore.storage.shard import ShardReader, read_ranges
from dilstore.storage.zarr_reads import METADATA_ERRORS

ReadPath = Literal["auto", "mmap", "ranged", "zarr"]
_OPEN_THREADS = 8  # remote shards opened at once by one fetch
_OPEN_ATTEMPTS = 3  # tries at reading a manifest and opening its index while appends commit (_open_commit)
BUILD_CHECK_SECONDS = 10.0  # how often, at most, a store at a URL reads its manifest again (`check_unchanged`)


class MissingPassagesError(DilstoreError):
    """Some requested passage ids are not in the store; `missing` lists them all."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with `missing`: unpickled as `cls(*args)`, it raised TypeError, so a process pool whose worker
        met a missing id failed every future ("BrokenProcessPool"), and `multiprocessing.Pool.map` hung (api54 F1)."""
        return type(self), (*self.args, self.missing), vars(self)


_EMPTY = np.zeros(0, dtype=np.uint64)
_CLOSED_INDEX = IdIndex(_EMPTY, _EMPTY.astype(np.uint32), _EMPTY.astype(np.uint32))  # what a closed store holds


class Store:
    """A finalized store opened read-only. Build it with `open_store`; `close()` it (or use `with`) when done."""

    def __init__(
        self,
        location: StoreLocation,
        manifest: Manifest,
        index: IdIndex,
        *,
        read_path: str,
        max_open_shards: int,
        index_files: Sequence[WatchedFile] = (),
        check_files: bool = False,
    ) -> None:
        self.location = location
        self.manifest = manifest
        self._index = index
        self._index_files = list(index_files)
        self.check_files = check_files
        self._read_path = read_path
        self._max_open_shards = max_open_shards
        self._shards: OrderedDict[int, ShardReader] = OrderedDict()
        self._lock = threading.Lock()
        self._codebook: dict[str, np.ndarray] | None = None
        self._closed = False
        self._build_checked = -math.inf  # when `_check_build` last read the manifest at the store's URL
        self._build_checking = False  # whether a `_check_build` is reading it now
        self._build_changed: str | None = None  # another build, as the last manifest read at the URL found
        self._manifest_seen = self._manifest_identity()  # what `_refuse_if_replaced` compares with

    @property
    def url(self) -> str:
        """Where the store is: its local folder or its URL, a password in it shown as `***`."""
        return self.location.url

    @property
    def fingerprint(self) -> Fingerprint:
        """The fingerprint of the model that made the store (architecture, config, weights, tokenizer, split, k,
        encoding), which a reader's model must match."""
        return self.manifest.fingerprint

    @property
    def kind(self) -> str:
        """What the store holds per token: "dilbert", "earl-s1", "earl-s2" or "listformer"."""
        return self.manifest.kind

    @property
    def encoding(self) -> str:
        """How its states are encoded: "fp32", "fp16", "int8", "2bit" or "1bit"."""
        return self.manifest.encoding

    @property
    def state_shape(self) -> tuple[int, ...] | None:
        """Per-token shape of the states (None for a store without passages)."""
        return self.manifest.state_shape

    @property
    def vector_size(self) -> int | None:
        """d of the passages' vectors (StoredPassage.vector), None when the store has none."""
        return self.manifest.vector_size

    @property
    def read_path(self) -> str:
        """"mmap" (zero-copy memory maps), "ranged" (coalesced byte ranges, storage/ranged.py) or "zarr"
        (zarr-python)."""
        return self._read_path

    def __len__(self) -> int:
        """The passages the store serves; a DilstoreError once it is closed."""
        self._live_index()  # a closed store answered, as if still open (left55 F8)
        return self.manifest.passages

    def __contains__(self, passage_id: object) -> bool:
        return isinstance(passage_id, str) and not self.missing([passage_id])

    def missing(self, passage_ids: Iterable[str]) -> list[str]:
        """The ids among `passage_ids` the store lacks, in the order given: one lookup for all (`in` takes one)."""
        passage_ids = as_list(passage_ids, "missing takes a list of passage ids")
        index = self._live_index()
        self._check_watched_files(passage_ids, index)
        return index.locate(passage_ids, self._id_at)[2]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as where it is and how it was opened, and opened again where it is unpickled (`_reopened`): a
        process pool's spawn or forkserver workers (macOS's start method; Linux's default from Python 3.14) given a
        Store failed with "TypeError: cannot pickle '_thread.lock' object", though one inherited across fork reads
        (port58 F2). A store rebuilt or appended to in between is a StoreChangedError there, not another build."""
        options = (self._read_path, self._max_open_shards, self.check_files)
        return _reopened, (self.location.address, self.location.storage_options, *options, self.manifest)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store: drop its shards and id index; a later lookup raises DilstoreError (open it again).

        Memory maps close once no returned array still uses them. A lookup
        running in another thread while the store closes may finish, or raise.
        """
        with self._lock:
            self._closed = True
            self._shards.clear()
            self._index = _CLOSED_INDEX
            self._codebook = None

    def _live_index(self) -> IdIndex:
        """The id index; a DilstoreError once the store is closed."""
        index = self._index
        if self._closed:
            raise DilstoreError(f"store {self.url} is closed; open it again to read from it")
        return index

    def fetch(self, passage_ids: Iterable[str]) -> list[StoredPassage]:
        """The passages with these ids, in the order given (repeats allowed).

        Raises MissingPassagesError naming the first few ids that are not in the store, and DilstoreError when
        `passage_ids` is not an iterable of strings (a bare string would be read as one id per character).
        """
        passage_ids = as_list(passage_ids, "fetch takes a list of passage ids")
        index = self._live_index()
        if self._read_path != "mmap":
            self._refuse_if_replaced()
        self._check_watched_files(passage_ids, index)
        self._open_concurrently(passage_ids, index)
        shards, rows, missing = index.locate(passage_ids, self._id_at)
        if missing:
            raise MissingPassagesError(
                f"{len(missing)} of {len(passage_ids)} requested passage ids are not in store {self.url}: "
                f"{listed(missing)}{other_form_hint(self, missing)}",
                missing,
            )
        touched = [(self.shard(shard), np.flatnonzero(shards == shard)) for shard in np.unique(shards).tolist()]
        requests = [reader.requests(rows[positions]) for reader, positions in touched]
        try:
            parts = iter(read_ranges([request for shard_requests in requests for request in shard_requests]))
        except StoreFormatError:
            self._refuse_if_rebuilt()  # rebuilt between the check above and the reads: not damage
            raise
        passages: list[StoredPassage | None] = [None] * len(passage_ids)
        for (reader, positions), shard_requests in zip(touched, requests, strict=True):
            read = reader.passages(rows[positions], [next(parts) for _ in shard_requests])
            for position, passage in zip(positions.tolist(), read, strict=True):
                passages[position] = passage
        return passages  # type: ignore[return-value]  # every position was filled above

    def check_unchanged(self) -> None:
        """A StoreChangedError when this local store was moved or deleted, or a file it has mapped or opened (its id
        index, every open shard) changed since it was found, or its manifest changed and names another build; or
        when a store at a URL is now another build (its manifest read again: a manifest that cannot be read now says
        nothing). A stat per file, or one request, for
        a server's health check: a store replaced under an idle server was found out only by the next request."""
        self._live_index()  # a closed store (no shard open) passed, as if its files were all unchanged (left55 F8)
        root = self.location.local_root
        if root is None:
            self._check_build()
            return
        with self._lock:
            readers = list(self._shards.values())
        self._check_files(root, readers)
        # Another build in the folder: the files this reader mapped may all be deleted (an append deletes the id
        # index it replaces, a compaction the rest), which `_check_files` takes for unchanged, and a server said
        # /health 200 and "its files are back" while its requests to a shard not opened yet got 503 (conc54 F6).
        self._refuse_if_replaced()

    def _check_watched_files(self, passage_ids: Sequence[str], index: IdIndex) -> None:
        """With `check_files`, on a local store, before a lookup reads them: the id index's mapped files and the
        watched files of the open shards these ids point to must be as they were found (storage/mapped.py: a file
        cut short under a map kills the process; a shard rebuilt under its offsets gives another build's data).
        A stat per file: about twice the time of a warm fetch (BENCHMARKS.md), so it is for long-running readers
        (`serve` turns it on), not one-off commands. For a store at a URL, its manifest is read again instead, at
        most every BUILD_CHECK_SECONDS: an `ask` session went on answering from another build's states at the old
        offsets, and exited 0 (remote52 F7)."""
        root = self.location.local_root
        if not self.check_files:
            return
        if root is None:
            self._check_build()
            return
        with self._lock:
            readers = [self._shards[shard] for shard in _pointed_shards(passage_ids, index) if shard in self._shards]
        self._check_files(root, readers)

    def _check_build(self) -> None:
        """A StoreChangedError when the manifest at the store's URL names another build than the one opened; one
        GET at most every BUILD_CHECK_SECONDS, however often a server's health is asked. Until a read finds the
        opened build again, the last one's finding stands: a check that read nothing (or could not) passed, and a
        server took that for the files back as opened and served the new build's bytes at the old offsets
        (remote52 F1)."""
        with self._lock:
            if self._build_checking or time.monotonic() - self._build_checked < BUILD_CHECK_SECONDS:
                self._refuse_if_found_rebuilt()  # one read at a time: a silent server held a thread per /health
                return
            self._build_checked, self._build_checking = time.monotonic(), True
        try:
            self._refuse_if_rebuilt()
        finally:
            self._build_checking = False
        self._refuse_if_found_rebuilt()  # the manifest cannot be read now: the last finding stands

    def _refuse_if_found_rebuilt(self) -> None:
        """The StoreChangedError of the last manifest read that found another build (`_refuse_if_rebuilt`: the
        store checks' or a fetch's), if any, until one finds the opened build again."""
        if self._build_changed is not None:
            raise StoreChangedError(self._build_changed)

    def _manifest_identity(self) -> tuple[int, ...] | None:
        """The local manifest file's device, inode and modification time (None for a store at a URL, () when the
        file is gone): what changes when the store is rebuilt or appended to."""
        root = self.location.local_root
        if root is None:
            return None
        try:
            status = os.stat(root / MANIFEST_FILE)
        except OSError:
            return ()
        return status.st_dev, status.st_ino, status.st_mtime_ns

    def _refuse_if_replaced(self) -> None:
        """On a local store read by path (compressed: zarr-python opens a chunk's file when it reads it), a
        StoreChangedError once the store was rebuilt in place (`precompute --overwrite`, `compact`): the old names
        would hold another build's bytes, read as damage (a checksum) or, worse, as other passages. One stat of
        the manifest a lookup; an append replaces the manifest too, and is let through (the same build)."""
        now = self._manifest_identity()
        if now != self._manifest_seen and self._refuse_if_rebuilt():
            self._manifest_seen = now  # only once read: an unreadable manifest is looked at again next time

    def _refuse_if_rebuilt(self) -> bool:
        """A StoreChangedError when the store's manifest now names another build than the one opened; True when it
        names this one, False when it cannot be read (unreachable or unreadable for now: one answer proves
        nothing). What a read found is kept for `_check_build` between its reads."""
        try:
            raw = self.location.read_bytes(MANIFEST_FILE, at_most=MAX_MANIFEST_BYTES)  # a longer one does not parse
            now = parse_manifest(raw, self.location.path(MANIFEST_FILE)).generation
        except Exception:  # noqa: BLE001 - see the docstring
            return False
        if now != self.manifest.generation:
            self._build_changed = (f"the store at {self.url} was rebuilt (build {now!r}, opened as build "
                                   f"{self.manifest.generation!r}): open it again")  # fmt: skip
            raise StoreChangedError(self._build_changed)
        self._build_changed = None
        return True

    def _check_files(self, root: Path, readers: Sequence[ShardReader]) -> None:
        """The local store still at `root`, where it was opened, and the id index's files and the watched files of
        `readers` as they were found; else a StoreChangedError.

        A store moved or deleted reads on from the files it has mapped, but a shard it has not opened yet cannot be
        opened: a server answered some requests and failed others, and its /health stayed 200. A manifest that
        cannot be looked at for a while (an I/O error) is a StoreReadError: a server's request got a 500 and its
        /health a plain-text one (full49 F2); one that no look will reach (no permission: LASTING_ERRNOS) is a
        change, as a shard file no longer readable is (review49 F3).
        """
        manifest = root / MANIFEST_FILE
        try:
            gone = not manifest.exists()
        except OSError as error:
            if error.errno in LASTING_ERRNOS:
                raise StoreChangedError(f"{manifest} can no longer be read ({error.strerror or error}): the store "
                                        "was changed under this reader; open it again where it can be read") from None
            raise StoreReadError(f"checking {manifest} failed: {type(error).__name__}: {error.strerror or error}; "
                                 "try again") from None  # fmt: skip
        if gone:
            raise StoreChangedError(f"{manifest} is gone: the store was moved or deleted under this reader; open it "
                                    "where it is now")  # fmt: skip
        check_unchanged(self._index_files)
        for reader in readers:
            check_unchanged(reader.watched_files)

    def _open_concurrently(self, passage_ids: Sequence[str], index: IdIndex) -> None:
        """Open the shards these ids point to, several at once, when they are not open yet and not local.

        Opening a remote shard takes a few round trips (metadata, small
        arrays); one by one, as the id lookup would open them, they add up
        for a fetch that touches many shards. Local shards open fast enough.
        """
        if self._read_path == "mmap":
            return
        with self._lock:
            closed = sorted(_pointed_shards(passage_ids, index) - set(self._shards))
        if 1 < len(closed) <= self._max_open_shards:
            with ThreadPoolExecutor(max_workers=min(_OPEN_THREADS, len(closed))) as pool:
                list(pool.map(self.shard, closed))

    def shard(self, index: int) -> ShardReader:
        """The reader of shard `index`, opened on first use; the least recently used are dropped beyond the limit."""
        with self._lock:
            reader = self._shards.get(index)
            if reader is not None:
                self._shards.move_to_end(index)
                return reader
        self._live_index()
        entry = self.manifest.shard_by_index.get(index) if isinstance(index, int) else None
        if entry is None:  # a caller's bad index, or an id index that names a shard the manifest lacks
            raise StoreFormatError(f"store {self.url} has no shard {index!r:.40}: its manifest lists shards "
                                   f"{listed(sorted(self.manifest.shard_by_index), quoted=False)}")  # fmt: skip
        try:
            reader = ShardReader(self.location, entry.directory, read_path=self._read_path,
                                 store_codebook=self._loaded_codebook)
        except StoreFormatError:
            self._refuse_if_rebuilt()  # a shard of the opened build gone with it (an overwrite, a compaction)
            raise
        found = reader.attributes
        expected = entry.generation if entry.generation is not None else self.manifest.generation
        if found.generation != expected:
            raise StoreChangedError(
                f"store {self.url} was rebuilt after it was opened: {reader.where} belongs to build "
                f"{found.generation!r}, the store was opened at build {expected!r}; "
                "reopen the store (no passage of the new build was mixed with the old)"
            )
        if (found.passages, found.tokens, found.kind, found.encoding) != (
            entry.passages,
            entry.tokens,
            self.manifest.kind,
            self.manifest.encoding,
        ):
            raise StoreFormatError(f"{reader.where} does not match the manifest's entry for it; run `dilstore verify`")
        with self._lock:
            if self._closed:
                raise DilstoreError(f"store {self.url} is closed; open it again to read from it")
            reader = self._shards.setdefault(index, reader)
            while len(self._shards) > self._max_open_shards:
                self._shards.popitem(last=False)
        return reader

    def codebook(self) -> dict[str, np.ndarray]:
        """The store's `codebook/` arrays (2bit/1bit) with their decode tables, built on first use and then kept.

        Shards hold no copy of the codebook, so every shard decodes with these
        arrays, and the tables the encoding derives from them are built once per
        store rather than once per opened shard. A DilstoreError once the store is closed.
        """
        self._live_index()  # a closed store loaded its codebook again (left55 F8)
        if not get_encoding(self.manifest.encoding).codebook:  # it read as a damaged store's missing codebook
            raise DilstoreError(f"store {self.url} is {self.manifest.encoding}, an encoding without a codebook")
        return self._loaded_codebook()

    def _loaded_codebook(self) -> dict[str, np.ndarray]:
        """`codebook()` for a shard that decodes with it: a store whose encoding has none is then damaged or rebuilt
        under this reader, which the shard's checks report (StoreFormatError), not a wrong call."""
        with self._lock:
            if self._codebook is None:
                arrays = load_store_codebook(self.location, self.manifest.encoding)
                prepare = get_encoding(self.manifest.encoding).prepare
                self._codebook = arrays if prepare is None else prepare(arrays)
            return self._codebook

    def superseded(self) -> Superseded:
        """The rows an append with replace took out of the id index (none for a store never appended to).

        They stay in their shards, but no lookup reaches them; whatever lists a
        shard's rows by position (the BM25 collection) must leave them out.
        """
        self._live_index()  # a closed store refuses work, as its docstring says
        index = self.manifest.index
        return read_superseded(self.location.open_group(index), self.location.path(index))

    def _id_at(self, shard: int, row: int) -> str:
        return self.shard(shard).id_at(row)


def _pointed_shards(passage_ids: Sequence[str], index: IdIndex) -> set[int]:
    """The shards whose rows have the hash of one of these ids (before the lookup confirms the ids)."""
    if not len(index):
        return set()
    hashes = id_hashes(passage_ids)
    positions = np.minimum(np.searchsorted(index.hashes, hashes), len(index) - 1)
    return set(index.shards[positions[index.hashes[positions] == hashes]].tolist())


def open_store(
    path_or_url: str | Path,
    expected: Fingerprint | None = None,
    *,
    read_path: ReadPath = "auto",
    storage_options: dict[str, Any] | None = None,
    max_open_shards: int | None = None,
    check_files: bool = False,
) -> Store:
    """Open the finalized store at a local path or fsspec URL, read-only.

    expected: the caller's model fingerprint; a store made otherwise raises
    FingerprintMismatchError showing both. read_path: "auto" memory-maps local
    uncompressed stores, reads remote uncompressed ones by coalesced byte ranges
    ("ranged": a fetch of many passages costs a few requests per array, not
    several per passage) and compressed ones through zarr-python; "mmap"
    insists on memory maps; "ranged" reads uncompressed arrays by byte ranges
    wherever the store is; "zarr" always uses zarr-python. max_open_shards
    bounds the shards kept open (each holds about nine file descriptors of a
    dilbert store on the mmap path); None keeps all of them open when their
    files fit the process's open-file limit (`mapped.shards_kept_open`).
    check_files: before each lookup on a local store, check that
    the mapped files it reads (or, on the other read paths, the metadata of
    the shards it reads) are as they were found, so a store rebuilt, cut or
    overwritten under a long-running reader is a StoreChangedError, not a
    SIGBUS that kills the process or another build's data (`Store.check_files`
    may also be set later). Nothing is ever written, beside the store or
    elsewhere.
    """
    wrong = not isinstance(max_open_shards, int) or isinstance(max_open_shards, bool) or max_open_shards < 1
    if max_open_shards is not None and wrong:
        raise DilstoreError(f"max_open_shards must be a positive integer or None, got {max_open_shards!r:.40}")
    if expected is not None and not isinstance(expected, Fingerprint):
        raise DilstoreError(f"expected must be a Fingerprint or None, got {type(expected).__name__}")
    location = StoreLocation.parse(path_or_url, storage_options)
    manifest, chosen, (index, index_files) = _open_commit(location, read_path)
    _refuse_unknown_names(manifest, location)
    if expected is not None:
        check_fingerprint(manifest.fingerprint, expected, f"store {location.url}")
    return Store(
        location, manifest, index, read_path=chosen, index_files=index_files,
        max_open_shards=shards_kept_open(manifest) if max_open_shards is None else max_open_shards,
        check_files=check_files,
    )


def _refuse_unknown_names(manifest: Manifest, location: StoreLocation) -> None:
    """A StoreFormatError naming the store and the known names when its kind, encoding or compressor is a name this
    dilstore does not know (one a later version brought, STORE_FORMAT.md §12): the store was opened and answered
    `len()` and its encoding, and only its first fetch, a server's first request, was refused (spec61 F8)."""
    try:
        get_kind(manifest.kind)
        get_encoding(manifest.encoding)
        check_compressor(manifest.compressor)
    except StoreFormatError as error:
        raise StoreFormatError(f"store {location.url}: {error}") from None


def _reopened(
    address: str, storage_options: dict[str, Any], read_path: ReadPath, max_open_shards: int, check_files: bool,
    manifest: Manifest,
) -> Store:
    """A pickled Store opened again (`Store.__reduce__`); a StoreChangedError when its manifest is not the one the
    pickled store was opened with."""
    store = open_store(address, read_path=read_path, storage_options=storage_options,
                       max_open_shards=max_open_shards, check_files=check_files)  # fmt: skip
    if store.manifest != manifest:
        store.close()
        raise StoreChangedError(f"the store at {store.url} was rebuilt or appended to since this copy of it was "
                                "pickled: open it again")  # fmt: skip
    return store


def _open_commit(
    location: StoreLocation, read_path: ReadPath
) -> tuple[Manifest, str, tuple[IdIndex, list[WatchedFile]]]:
    """The manifest, read path and id index (with its mapped files) of one commit of the store.

    An append committed between reading the manifest and opening the index it
    names deletes that index; then the new manifest is read and opened instead.
    """
    for _ in range(_OPEN_ATTEMPTS - 1):
        manifest = read_manifest(location)
        chosen = _choose_read_path(location, manifest, read_path)
        try:
            return manifest, chosen, _open_index(location, manifest, use_mmap=chosen == "mmap")
        except StoreFormatError:
            if read_manifest(location).index == manifest.index:
                raise
    manifest = read_manifest(location)
    chosen = _choose_read_path(location, manifest, read_path)
    return manifest, chosen, _open_index(location, manifest, use_mmap=chosen == "mmap")


def _choose_read_path(location: StoreLocation, manifest: Manifest, read_path: ReadPath) -> str:
    """The read path "auto" stands for here, or the one asked for after checking that it can work."""
    if read_path not in ("auto", "mmap", "ranged", "zarr"):
        raise DilstoreError(f"read_path must be 'auto', 'mmap', 'ranged' or 'zarr', got {read_path!r}")
    blocker = None
    if location.local_root is None:
        blocker = "it is not on the local filesystem"
    elif manifest.compressor is not None:
        blocker = f"it is compressed with {manifest.compressor}"
    if read_path == "mmap" and blocker:
        raise DilstoreError(f"cannot memory-map store {location.url}: {blocker}; use read_path='zarr' or 'auto'")
    if read_path != "auto":
        return read_path
    if blocker is None:
        return "mmap"
    return "zarr" if manifest.compressor is not None else "ranged"


def _open_index(location: StoreLocation, manifest: Manifest, *, use_mmap: bool) -> tuple[IdIndex, list[WatchedFile]]:
    """The id index arrays, memory-mapped or loaded, after checking they fit the manifest, and the files mapped."""
    where = location.path(manifest.index)
    try:
        group = location.open_group(manifest.index)
    except METADATA_ERRORS as error:
        raise StoreFormatError(f"cannot open the id index {where}: {type(error).__name__}: {error}") from None
    attributes = group.attrs.asdict().get(ATTRIBUTES_KEY, {})
    if not header_matches(attributes, manifest.passages):
        raise StoreFormatError(f"{where} does not match the manifest (hash or passage count); run `dilstore verify`")
    arrays, files = [], []
    for name in (INDEX_HASHES, INDEX_SHARDS, INDEX_ROWS):
        try:
            array = group[name]
        except METADATA_ERRORS as error:
            raise StoreFormatError(
                f"cannot open {where}/{name}: {type(error).__name__}: {error}; run `dilstore verify`"
            ) from None
        if not isinstance(array, zarr.Array) or array.shape != (manifest.passages,):
            raise StoreFormatError(f"{where}/{name} is not an array of {manifest.passages} entries")
        if use_mmap:
            assert location.local_root is not None
            mapped = map_array(array, location.local_root / manifest.index / name)
            arrays.append(mapped.values)
            files += [] if mapped.file is None else [mapped.file]
        else:
            arrays.append(read_array_file(array, location.fs, location.path(f"{manifest.index}/{name}")))
    return IdIndex(*arrays), files
