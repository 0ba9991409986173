"""Where a store lives: a local directory or an fsspec URL, behind one small interface.

Readers, `verify` and `info` take either; only local stores can be
memory-mapped, and only local stores are written (the writer's atomic renames
need a real filesystem).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import fsspec
import zarr
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from zarr.abc.store import Store as ZarrStore
from zarr.storage import FsspecStore, LocalStore

_READ_BLOCK = 8 << 20
_HASH_THREADS = 4


@dataclass(frozen=True)
class StoreLocation:
    """A store root on some filesystem; paths below are relative to it, '/'-separated."""

    url: str
    fs: fsspec.AbstractFileSystem
    root: str
    storage_options: dict[str, Any]

    @classmethod
    def parse(cls, path_or_url: str | Path, storage_options: dict[str, Any] | None = None) -> StoreLocation:
        """The location of a local path or fsspec URL (e.g. `memory://store`, `gs://bucket/store`)."""
        url = str(path_or_url)
        options = dict(storage_options or {})
        fs, root = url_to_fs(url, **options)
        return cls(url=url, fs=fs, root=root.rstrip("/") or "/", storage_options=options)

    @property
    def local_root(self) -> Path | None:
        """The root as a local path, or None when the store is not on the local filesystem."""
        return Path(self.root) if isinstance(self.fs, LocalFileSystem) else None

    def path(self, relative: str) -> str:
        """Full filesystem path of `relative`."""
        return f"{self.root}/{relative}" if relative else self.root

    def exists(self, relative: str = "") -> bool:
        return bool(self.fs.exists(self.path(relative)))

    def is_dir(self, relative: str = "") -> bool:
        return bool(self.fs.isdir(self.path(relative)))

    def read_bytes(self, relative: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(relative)))

    def files(self) -> dict[str, int]:
        """Every file under the root: relative path -> size in bytes, sorted by path."""
        found = self.fs.find(self.root, detail=True, withdirs=False)
        prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        sizes = {}
        for name, info in found.items():
            stripped = self.fs._strip_protocol(name)
            if stripped.startswith(prefix):
                sizes[stripped[len(prefix) :]] = int(info["size"])
        return dict(sorted(sizes.items()))

    def sha256(self, relative: str) -> str:
        """Hex SHA-256 of a file's bytes."""
        digest = hashlib.sha256()
        with self.fs.open(self.path(relative), "rb") as file:
            while block := file.read(_READ_BLOCK):
                digest.update(block)
        return digest.hexdigest()

    def sha256_many(self, relatives: list[str]) -> dict[str, str | OSError]:
        """SHA-256 of many files, hashed on a few threads; a file that cannot be read maps to its error."""

        def one(relative: str) -> str | OSError:
            try:
                return self.sha256(relative)
            except OSError as error:
                return error

        with ThreadPoolExecutor(max_workers=_HASH_THREADS) as pool:
            return dict(zip(relatives, pool.map(one, relatives), strict=True))

    @cached_property
    def zarr_store(self) -> ZarrStore:
        """A read-only zarr-python store at the root (made once per location)."""
        local = self.local_root
        if local is not None:
            return LocalStore(local, read_only=True)
        return FsspecStore.from_url(self.url, storage_options=self.storage_options, read_only=True)

    def open_group(self, relative: str) -> zarr.Group:
        """Open the Zarr v3 group at `relative` read-only with zarr-python."""
        return zarr.open_group(store=self.zarr_store, path=relative, mode="r", zarr_format=3)
