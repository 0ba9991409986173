"""One writer per store: an advisory lock held for a whole `precompute` run.

Two writers on one store once left shards of mixed encodings, all marked
committed, that resume then trusted. The lock is `fcntl.flock` on a small
file beside the store (`.NAME.dilstore-lock` in the store's parent folder),
not inside it, so that `--overwrite`, which deletes the store folder, cannot
delete the lock out from under a second writer. The file holds the pid of
the writer that holds the lock, for the error message; the kernel releases
the lock when that process ends, however it ends (kill -9 included).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dilstore.storage.errors import DilstoreError


def lock_path(store: Path) -> Path:
    """The lock file of `store`: beside it, named after it."""
    store = Path(store).absolute()
    return store.parent / f".{store.name}.dilstore-lock"


@contextmanager
def write_lock(store: Path) -> Iterator[Path]:
    """Hold the write lock of `store` for the `with` block; a DilstoreError naming the holder's pid if taken."""
    path = lock_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise DilstoreError(
                f"--output {store} is being written by pid {holder} (lock {path}); wait for that run or stop it"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        yield path
    finally:
        os.close(descriptor)
