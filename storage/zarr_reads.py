"""The zarr-python store dilstore reads through: a missing array file is an error, a failed read says so.

zarr-python reads a chunk file that is not there as the array's fill value.
Every array of a dilstore store is one file whose presence the manifest
promises, so for a dilstore reader a missing file is damage: read as zeros,
it gave states of 0.0, empty texts and token ids of 0, and `rerank` exited 0
with other scores. And a remote read that fails in transit (HTTP 500, a body
cut short, a timeout) raised the HTTP library's own exception, a traceback at
the command line. This wrapper raises StoreFormatError for the first and
StoreReadError for the second, both naming the file (a local file that cannot
be read, one without permission or a directory, is no failure in transit: a
StoreFormatError too); metadata files
(`zarr.json`) may still be absent, which is how zarr-python tells an array
from a group and a missing node from a present one.

Over HTTP(S) it also reads array files itself, with the GETs zarr-python's
FsspecStore sends, to check each answer's ETag (else Last-Modified) and size
against the first answer's for the same file (storage/ranged.py
`refuse_replaced`, the byte-range path's check): a compressed store rebuilt
and copied over at its URL was read by a Store opened before at the old
build's chunk offsets, until the manifest check up to 10 s later, since
FsspecStore keeps only an answer's body (left55b F3).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from pathlib import Path

import zarr
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import FsspecStore, WrapperStore
from zarr.storage._common import _dereference_path  # how FsspecStore names a key's file (zarr < 3.2 pinned)

from dilstore.storage.format import ZARR_METADATA_FILE, StoreFormatError, StoreReadError
from dilstore.storage.location import in_this_process
from dilstore.storage.ranged import FileVersion, http_read, is_http, refuse_replaced
from dilstore.storage.read_failures import READ_ATTEMPTS, read_failure, refuse_special_file, retry_delay, worth_retrying

# What opening a zarr group or array of a store raises for metadata that is not what the store needs: missing, of
# another node type, malformed (a field of another type), or JSON nested too deep for Python's parser (hostile46
# F4: a traceback). A zarr.json holding a JSON value that is no object (`5`) is zarr's AttributeError ("'int' object
# has no attribute 'pop'"): a shard's or the id index's ended `ask`, `rerank` and `serve` with a traceback (fuzz60 F7).
METADATA_ERRORS = (FileNotFoundError, zarr.errors.NodeTypeValidationError, RecursionError, ValueError, TypeError,
                   KeyError, AttributeError)  # fmt: skip


class RequiredChunksStore(WrapperStore):
    """A read-only zarr store whose chunk (array data) files must exist and whose failed reads name the file."""

    def __init__(self, store: Store, url: str, *, local: bool = False) -> None:
        super().__init__(store)
        self.url = url
        self.local = local
        self._opened: dict[str, FileVersion] = {}  # over HTTP(S): what the first answer for each array file said
        self._opened_lock = threading.Lock()

    def _with_store(self, store: Store) -> RequiredChunksStore:
        copy = type(self)(store, self.url, local=self.local)
        copy._opened, copy._opened_lock = self._opened, self._opened_lock  # one record of the files' first answers
        return copy

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """zarr's Store.get, a failure in transit tried again (up to READ_ATTEMPTS reads); a missing array file
        (any but a zarr.json, whose absence zarr itself reads) is a StoreFormatError, and over HTTP(S) one replaced
        since its first answer a StoreChangedError (`_read`)."""
        root = getattr(self._store, "root", None)  # a LocalStore's folder
        if self.local and root is not None:
            refuse_special_file(Path(root) / key, self._path(key))
        self._refresh_after_fork()
        for attempt in range(READ_ATTEMPTS):
            try:
                value = await self._read(key, prototype, byte_range)
                break
            except (StoreFormatError, StoreReadError):
                raise
            except Exception as error:  # noqa: BLE001 - each fsspec backend raises its own kind (aiohttp, ...)
                failure = read_failure(self._path(key), error, local=self.local)
                if not worth_retrying(failure, error, local=self.local, attempt=attempt):
                    raise failure from None
                await asyncio.sleep(retry_delay(error, attempt))
        if value is None and not key.endswith(ZARR_METADATA_FILE):
            raise StoreFormatError(f"missing array file {self._path(key)}; run `dilstore verify`")
        return value

    async def _read(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer | None:
        """The inner store's `get`; over HTTP(S), for an array file, the same GET sent here (`http_read`), whose
        answer's version of the file is checked against the first answer's (`refuse_replaced`) before its bytes
        are used. zarr.json files are read by the inner store: a shard opened anew checks its build by its
        attributes (storage/shard.py), and the files it reads are checked here."""
        inner = self._store
        if key.endswith(ZARR_METADATA_FILE) or not isinstance(inner, FsspecStore) or not is_http(inner.fs):
            return await inner.get(key, prototype, byte_range)
        if isinstance(byte_range, RangeByteRequest) and byte_range.start == byte_range.end:
            return prototype.buffer.from_bytes(b"")  # as FsspecStore: no request for no bytes
        try:
            body, seen = await http_read(inner.fs, _dereference_path(inner.path, key), _range_header(byte_range))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):  # FsspecStore's allowed_exceptions
            return None
        with self._opened_lock:
            opened = self._opened.setdefault(key, seen)
        refuse_replaced(self._path(key), opened, seen)
        return prototype.buffer.from_bytes(body)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    def _refresh_after_fork(self) -> None:
        """In a child process forked after this store's async filesystem was made, the store on that filesystem made
        anew (`in_this_process`): the old one's session belongs to the parent's event loop, and every read failed
        ("Timeout context manager should be used inside a task; try again") (api54 F5). Called at every chunk read: a
        pid check."""
        inner = self._store
        if isinstance(inner, FsspecStore) and (fs := in_this_process(inner.fs)) is not inner.fs:
            self._store = FsspecStore(fs, read_only=True, path=inner.path)

    def _path(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"


def _range_header(byte_range: ByteRequest | None) -> str | None:
    """The Range header FsspecStore's `get` sends for `byte_range` (through fsspec's `_process_limits`); None for the
    whole file."""
    if byte_range is None:
        return None
    if isinstance(byte_range, RangeByteRequest):
        return f"bytes={byte_range.start}-{byte_range.end - 1}"
    if isinstance(byte_range, OffsetByteRequest):
        return f"bytes={byte_range.offset}-"
    if isinstance(byte_range, SuffixByteRequest):
        return f"bytes=-{byte_range.suffix}"
    raise ValueError(f"Unexpected byte_range, got {byte_range}.")
