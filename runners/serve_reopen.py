"""How `dilstore serve` opens a store again once it changed on disk: an append committed, a compaction, a
rebuild with `--overwrite`, or its BM25 index rebuilt by `dilstore index`.

A Reopener holds the way the store was opened at start-up (the same checks, model and index choice) and a
stamp of the files that change when the store or its index does: the manifest's and the index folder's
entries (name, inode, size, modification time). The server's router (runners/serve_app.py) compares stamps at
each check; a reopen that failed is tried again once the stamp moved on, or after a wait that doubles with each
failure, so a store rebuilt by another model does not load a model at every check. A store at a URL is stamped by
its local index folder alone: it is reopened when that changes, or once its manifest names another build, after
RETRY_SECONDS (doubling with each failure as above).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from dilstore.storage.format import MANIFEST_FILE
from dilstore.storage.location import StoreLocation

if TYPE_CHECKING:
    from dilstore.runners.serve_services import ServedStore, Service

RETRY_SECONDS = 30.0  # the first wait before a failed reopen is tried again with no change seen; it doubles
MAX_RETRY_DOUBLINGS = 6  # up to 64 times RETRY_SECONDS (32 minutes)

Stamp = Hashable | None


class RemoteStamp(NamedTuple):
    """The stamp of a store at a URL: its local BM25 index folder's entries (None: no such folder; (): no index
    given). Its own files are on a server, and only a read of its manifest says it was rebuilt."""

    index: tuple[tuple[str, tuple[int, ...]], ...] | None


@dataclass
class Reopener:
    """Opens a served store again (`open`, as at start-up, given the service served now, whose model the new copy
    keeps when the store's fingerprint did not change) and says when that is worth trying (`due`).

    opened: the stamp of the copy being served; failed: the stamp when a reopen last failed (None: none failed
    since the last success); failures: reopens failed in a row; tried_at: when the served copy was opened or a
    reopen last tried (time.monotonic()).
    """

    open: Callable[[Service], ServedStore]
    stamp: Callable[[], Stamp]
    opened: Stamp = None
    failed: Stamp = None
    failures: int = 0
    tried_at: float = field(default_factory=time.monotonic)

    def due(self, unavailable: bool) -> bool:
        """Whether to reopen the store now: a local store's files changed since the served copy was opened, and
        since a reopen last failed or the wait after it passed; a store at a URL whose local index folder changed
        so, or that is `unavailable` (its manifest names another build), once the wait passed. The wait
        (RETRY_SECONDS, doubling with each failure) lets a store copied into place file by file (a reopen halfway
        failed, and the manifest, copied first, never changed again) be served, without loading a model at every
        check for a store of another model."""
        now = self.stamp()
        waited = time.monotonic() - self.tried_at >= retry_wait(self.failures)
        changed = now != self.opened and (now != self.failed or waited)
        if isinstance(now, RemoteStamp):
            # Its --index folder is local and stamped: an index put there for a rebuilt store (or an append) is
            # opened at the next check. It was not looked at, and a store whose reopens had failed for want of it
            # waited up to 32 minutes after it was there (conc54 F3).
            return changed or (unavailable and waited)
        return changed

    def succeeded(self, stamp: Stamp) -> None:
        """Record that the copy opened at `stamp` is now served."""
        self.opened, self.failed, self.failures, self.tried_at = stamp, None, 0, time.monotonic()

    def gave_up(self, stamp: Stamp) -> None:
        """Record that a reopen begun at `stamp` failed."""
        self.failed, self.failures, self.tried_at = stamp, self.failures + 1, time.monotonic()


def retry_wait(failures: int) -> float:
    """Seconds to wait, with nothing changed, before a store is opened again after `failures` failed reopens in a row
    (0: since the served copy was opened, for a store at a URL): RETRY_SECONDS, then twice as long after each failure
    past the first, up to 2**MAX_RETRY_DOUBLINGS times (30 s, 1, 2, 4 ... 32 minutes, as README.md says; the first
    retry came after a minute and the last after 64, multi53 F3)."""
    return RETRY_SECONDS * 2 ** min(max(failures - 1, 0), MAX_RETRY_DOUBLINGS)


def files_stamp(store_path: str, index_dir: Path | None) -> Stamp:
    """What changes when a local store is appended to, compacted or rebuilt, or its index rebuilt: the manifest's
    identity and the index folder's entries; for a store at a URL, its local index folder's alone (a RemoteStamp).

    A few stats, cheap enough for every check of a running server.
    """
    root = StoreLocation.parse(store_path).local_root
    if root is None:
        return RemoteStamp(_entries(index_dir) if index_dir is not None else ())
    return _identity(root / MANIFEST_FILE), _entries(index_dir) if index_dir is not None else ()


def _identity(path: Path) -> tuple[int, ...]:
    """The file's inode, size and modification time; () when it cannot be read."""
    try:
        status = os.stat(path)
    except OSError:
        return ()
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def _entries(folder: Path) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """Each entry of the folder with its identity, by name; None when the folder is missing."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    return tuple((name, _identity(folder / name)) for name in names)
