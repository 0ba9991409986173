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
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import FsspecStore, WrapperStore

from dilstore.storage.format import ZARR_METADATA_FILE, StoreFormatError, StoreReadError
from dilstore.storage.location import in_this_process
from dilstore.storage.read_failures import READ_ATTEMPTS, read_failure, refuse_special_file, retry_delay, worth_retrying

# What opening a zarr group or array of a store raises for metadata that is not what the store needs: missing, of
# another node type, malformed (a field of another type), or JSON nested too deep for Python's parser (hostile46
# F4: a traceback).
METADATA_ERRORS = (FileNotFoundError, zarr.errors.NodeTypeValidationError, RecursionError, ValueError, TypeError,
                   KeyError)  # fmt: skip


class RequiredChunksStore(WrapperStore):
    """A read-only zarr store whose chunk (array data) files must exist and whose failed reads name the file."""

    def __init__(self, store: Store, url: str, *, local: bool = False) -> None:
        super().__init__(store)
        self.url = url
        self.local = local

    def _with_store(self, store: Store) -> RequiredChunksStore:
        return type(self)(store, self.url, local=self.local)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """zarr's Store.get, a failure in transit tried again (up to READ_ATTEMPTS reads); a missing array file
        (any but a zarr.json, whose absence zarr itself reads) is a StoreFormatError."""
        root = getattr(self._store, "root", None)  # a LocalStore's folder
        if self.local and root is not None:
            refuse_special_file(Path(root) / key, self._path(key))
        self._refresh_after_fork()
        for attempt in range(READ_ATTEMPTS):
            try:
                value = await self._store.get(key, prototype, byte_range)
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
