"""Temporary folders in $TMPDIR that a killed command does not leave behind for good.

`precompute` keeps its progress counts in one, and `index` copies an appended
store's whole passage text into one. Ctrl-C, SIGTERM and SIGHUP remove them
(`stop_signals`), but SIGKILL (or the out-of-memory killer) cannot be caught,
and each such kill left a folder that nothing removed: for `index`, a copy
of the corpus. So each folder holds a lock for as long as its command runs,
and the next command that makes one, of any kind, removes those whose lock
is free: their command has ended, however it ended. The lock is `flock`, which
the kernel releases with the process, across process namespaces too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dilstore.storage.errors import DilstoreError

OWNER_LOCK = ".dilstore-owner-lock"
# What every scratch folder's name starts with: the sweep of abandoned ones takes every kind (left61 F6).
SCRATCH_PREFIX = "dilstore-"


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A new folder `$TMPDIR/PREFIX*`, held and removed when the block ends; abandoned ones of every kind go first.

    `prefix` starts with SCRATCH_PREFIX. Abandoned folders were swept by kind only, so the copy of a store's passage
    text a killed `index` left (the corpus' size) stayed until the next `index`; a `precompute` left it (left61 F6).

    A TMPDIR that is no writable folder is refused, naming it; the block's writes into the folder that find its disk
    full say that it is $TMPDIR's (see check_temporary_folder, full_temporary_folder).
    """
    check_temporary_folder()
    remove_abandoned(SCRATCH_PREFIX)
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    # Locked under another name, then renamed: a folder is never seen with an unlocked OWNER_LOCK while its owner runs.
    unnamed = folder / f"{OWNER_LOCK}.new"
    descriptor = os.open(unnamed, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        unnamed.rename(folder / OWNER_LOCK)
        yield folder
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT) and Path(error.filename or "/").is_relative_to(folder):
            raise full_temporary_folder(error, folder) from None
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(descriptor)


def check_temporary_folder() -> None:
    """A DilstoreError naming TMPDIR where it is set to no folder, or to one this user cannot write: Python's tempfile
    then passed it over for /tmp without a word, and a run told to keep its scratch on a big volume (a batch job's
    scratch disk that failed to mount, a container's emptyDir) filled the small root file system instead (env57 F4).
    """
    configured = os.environ.get("TMPDIR")
    if not configured:
        return
    folder = Path(configured)
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise DilstoreError(f"TMPDIR={configured} {what}: set TMPDIR to a writable folder (or unset it for /tmp)")
    if not os.access(folder, os.W_OK | os.X_OK):  # EROFS too, for root
        raise DilstoreError(f"TMPDIR={configured} is not writable (read-only, or not this user's): set TMPDIR to a "
                            "writable folder (or unset it for /tmp)")  # fmt: skip


def full_temporary_folder(error: OSError, folder: Path) -> DilstoreError:
    """`error`, a full disk met writing into the scratch folder `folder`, saying that it is $TMPDIR's: `index` said
    only "No space left on device: /tmp/dilstore-collection-x1/part-00000.jsonl" (env57 F4)."""
    return DilstoreError(f"{error.strerror}: {error.filename} (the temporary folder {folder.parent}, $TMPDIR): set "
                         "TMPDIR to a folder with room")  # fmt: skip


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
