"""Operating-system errors that name the file they are about.

A failed write, flush, fsync or truncate carries no file name: a full disk
was reported as "No space left on device" alone, and the user could not tell
which disk to free (the store's, an output's, or $TMPDIR's; full49 F4).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path

from dilstore.storage.errors import DilstoreError


@contextmanager
def naming(path: str | PathLike[str]) -> Iterator[None]:
    """Raise an OSError of the block that names no file again as the same error (errno, message) naming `path`;
    errors that name their file pass as they are."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


# The errors of a file that cannot be written for want of room: a full disk, a quota, a file size limit.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# What to do about EFBIG, where freeing space does nothing (journal, training saves, precompute, compact).
FILE_SIZE_ADVICE = ("a file grew past the size this process may write (`ulimit -f`) or its filesystem holds: raise "
                    "the limit")


class _CopyFailed(Exception):
    """A file copy's OSError carried out of shutil.copytree, which collects every OSError into one shutil.Error."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def copy_file(source: Path, destination: Path, *, follow_symlinks: bool = True) -> None:
    """shutil.copy2, where a failure for want of room names `destination`, the file it could not write, and the copy
    is writable by its owner within the umask (`_give_copy_mode`).

    shutil's copy on a full disk names the source, the file it read ("No space left on device: STORE/run-summary.json"),
    which sent the user to the store that was being copied (disk56 F3)."""
    try:
        shutil.copy2(source, destination, follow_symlinks=follow_symlinks)
        if follow_symlinks or not os.path.islink(destination):
            _give_copy_mode(Path(destination))
    except OSError as error:
        if error.errno in NO_ROOM:
            raise OSError(error.errno, error.strerror, str(destination)) from error
        raise


def _give_copy_mode(path: Path) -> None:
    """Give the copied file `path` its source's mode (which shutil.copy2 gave it) with the owner's write bit added, and
    no bit the umask takes away.

    shutil.copy2 copies the source's mode: a `dilstore compact --output` of a store made read-only (`chmod -R a-w`,
    another account's files) made a read-only BM25 index folder, failed writing its record into it with "Permission
    denied: OUT/bm25/dilstore-index.json", and left the folder behind, which its cleanup could not delete either, nor
    the next `precompute --overwrite` ("Permission denied: write.lock"; perm57 F3). A 0444 source copies as 0644
    under umask 022, as a new file would; a file its owner kept private (0600) stays so, not widened to the umask's.
    """
    path.chmod(_owned_within_umask(stat.S_IMODE(path.stat().st_mode), stat.S_IWUSR))


def _owned_within_umask(mode: int, owner: int) -> int:
    """`mode` with the owner's `owner` bits added, less the bits this process's umask takes from new files."""
    from dilstore.storage.atomic_files import process_umask  # atomic_files imports this module

    return (mode | owner) & ~process_umask()


def _give_folder_modes(destination: Path) -> None:
    """Give `destination` and the folders below it, as copytree made them (with their sources' modes, a read-only
    one's too, once their files are in: perm57 F3), the owner's read, write and search bits, less the umask's."""
    if not destination.is_dir() or destination.is_symlink():
        return
    _give_folder_mode(str(destination))
    for folder, children, _ in os.walk(destination):  # links to folders are listed, not followed: they stay
        for child in children:
            if not os.path.islink(os.path.join(folder, child)):
                _give_folder_mode(os.path.join(folder, child))


def _give_folder_mode(folder: str) -> None:
    os.chmod(folder, _owned_within_umask(stat.S_IMODE(os.stat(folder).st_mode), stat.S_IRWXU))


def copy_tree(source: Path, destination: Path, *, symlinks: bool = False, dirs_exist_ok: bool = False) -> None:
    """shutil.copytree that stops at the first file it cannot copy, with that file's OSError (`copy_file`).

    shutil.copytree goes on past a failed file and raises one shutil.Error listing every file that failed, each with
    its error as text: a BM25 index copied to a full disk by `dilstore compact` ended in a 1,000-character line of
    tuples (disk56 F3). A folder it cannot make is raised as the OSError its text names, naming that folder."""

    def copy(file_source: str, file_destination: str, *, follow_symlinks: bool = True) -> str:
        try:
            copy_file(Path(file_source), Path(file_destination), follow_symlinks=follow_symlinks)
        except OSError as error:
            raise _CopyFailed(error) from None
        return file_destination

    try:
        shutil.copytree(source, destination, symlinks=symlinks, copy_function=copy, dirs_exist_ok=dirs_exist_ok)
    except _CopyFailed as failed:
        raise failed.error from None
    except shutil.Error as error:  # a folder that could not be made, or given its times and mode
        _, failed_destination, why = error.args[0][0]
        found = re.match(r"\[Errno (\d+)\] ([^:]+)", why)
        if found is None:
            raise OSError(None, why, failed_destination) from None
        raise OSError(int(found[1]), found[2], failed_destination) from None
    finally:  # a failed copy's folders too: its cleanup must be able to delete what is in them
        with contextlib.suppress(OSError):
            _give_folder_modes(Path(destination))


def path_limit(folder: Path, name: str, default: int) -> int:
    """os.pathconf's `name` (PC_NAME_MAX, PC_PATH_MAX) for the file system of `folder`, or `default` where the system
    does not say: the limits a path is measured against before any work, so that a name too long is refused by name."""
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def remove_tree(folder: Path, what: str, then: str = "run the command again") -> None:
    """Delete `folder` (`what` it is, in words); a DilstoreError naming it and the file it failed at, and saying to
    delete it, then to `then`.

    shutil.rmtree's errors name the entry alone, relative to its folder: a copy this user could not delete stopped
    every later run of the store with "Permission denied: precompute.json" (perm57 F4); `precompute --overwrite`
    beside a replacement of other settings it could not delete (another account's), `--append` after a stopped
    append of other settings and `train` deleting an unfinished or old checkpoint said "Operation not permitted:
    zarr.json", no folder named (left58 F3)."""

    def failed(path: str, error: BaseException) -> None:
        strerror = getattr(error, "strerror", None) or error
        raise DilstoreError(f"cannot delete {what} at {folder}: {strerror} (at {path}); delete it (as its owner, or "
                            f"after `chmod -R u+w` on it), then {then}") from None  # fmt: skip

    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=lambda _, path, error: failed(path, error))
    else:  # onerror: deprecated from 3.12 on
        shutil.rmtree(folder, onerror=lambda _, path, info: failed(path, info[1]))
