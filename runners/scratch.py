"""Temporary folders in $TMPDIR that a killed command does not leave behind for good.

`precompute` keeps its progress counts in one, and `index` copies an appended
store's whole passage text into one. Ctrl-C, SIGTERM and SIGHUP remove them
(`stop_signals`), but SIGKILL (or the out-of-memory killer) cannot be caught,
and each such kill left a folder that nothing removed: for `index`, a copy
of the corpus. So each folder holds a lock for as long as its command runs,
and the next command that makes one of the same kind removes those whose lock
is free: their command has ended, however it ended. The lock is `flock`, which
the kernel releases with the process, across process namespaces too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

OWNER_LOCK = ".dilstore-owner-lock"


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A new folder `$TMPDIR/PREFIX*`, held and removed when the block ends; abandoned ones of `prefix` go first."""
    remove_abandoned(prefix)
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    # Locked under another name, then renamed: a folder is never seen with an unlocked OWNER_LOCK while its owner runs.
    unnamed = folder / f"{OWNER_LOCK}.new"
    descriptor = os.open(unnamed, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        unnamed.rename(folder / OWNER_LOCK)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(descriptor)


def remove_abandoned(prefix: str) -> list[Path]:
    """Remove the folders `$TMPDIR/PREFIX*` whose owner lock is free (their command ended without removing them).

    A folder without the lock (made by an older dilstore, or by something else) and one another user owns are left.
    """
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            descriptor = os.open(folder / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(folder)
            removed.append(folder)
        except OSError:  # locked (its command still runs), or not ours to remove
            continue
        finally:
            os.close(descriptor)
    return removed
