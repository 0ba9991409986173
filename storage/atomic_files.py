"""Writing a file so that readers see either nothing or the whole of it: the one atomic write of the project.

Each write goes to a uniquely named temporary file in the destination folder
(named with the store's temporary prefix, which finalize and verify skip),
is flushed to disk and renamed over the destination, and the folder is
flushed too, so two writers of the same file (a retried bundle, a re-run
after a crash) never interleave, a killed writer leaves no partial file under
the final name, and a crash after the rename cannot lose the file. The
manifest, TREC runs, ranking data files and shard parts are all written here.

A SIGKILL between the temporary's creation and the rename still leaves the
temporary behind (no handler runs). Its name carries the writer's host and
process id, and the writer holds a lock on it until the rename, so the
next write of a file the user named removes the leftovers of writers that
are gone: a re-run to the same `--output` or
`--predictions` leaves no hidden file of the killed run beside it (a
store's own leftovers go at finalize and commit).

The file gets the mode any new file gets under the process's umask (0644
under the usual 022), not the 0600 of a bare temporary file: a store is read
by query servers, web servers and other users than the one that wrote it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import glob
import hashlib
import os
import socket
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path

from dilstore.storage.durability import fsync_dir
from dilstore.storage.file_errors import naming
from dilstore.storage.format import TMP_PREFIX

_NEW_FILE_MODE = 0o666  # what open() asks for; the umask takes bits away


def atomic_write_bytes(path: Path, data: bytes, *, named_by_user: bool = False, make_folder: bool = True) -> None:
    """Write `data` to `path` atomically, creating parent folders as needed unless the file is `named_by_user` or
    `make_folder` is False.

    A file named by the user (a TREC run, predictions, a journal beside them) must have its folder: a missing one
    is a FileNotFoundError naming it (not the temporary file the write would have made there). And what killed
    writes of that file left beside it is removed first (remove_dead_writers_temporaries), where a store's own
    files leave that to finalize and commit (remove_stale_writes): listing a folder of thousands of parts at each
    write would cost more than the write. Without `make_folder`, a missing folder is a FileNotFoundError too, and
    nothing is listed: a file in a folder another process may remove (a run's progress reports, dask50 F6).
    """
    if not named_by_user:
        if make_folder:
            path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        if path.parent.exists():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path.parent))
        raise FileNotFoundError(errno.ENOENT, "no such folder", str(path.parent))
    else:
        remove_dead_writers_temporaries(path)
    with naming(path):  # a full disk fails the write or the fsync, which name no file
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{_temporary_stem(path)}{_writer()}.",
                                             suffix=".tmp")  # fmt: skip
    try:
        with naming(path):
            with os.fdopen(handle, "wb") as stream:  # closes the descriptor whatever fails (review49 F6)
                with contextlib.suppress(OSError):  # a filesystem without locks: the cleanup deletes nothing then
                    fcntl.flock(handle, fcntl.LOCK_EX)  # held until the rename: a live write's temporary is not dead
                os.fchmod(handle, _NEW_FILE_MODE & ~process_umask())
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
                os.replace(temporary, path)
            fsync_dir(path.parent)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def remove_dead_writers_temporaries(path: Path) -> list[Path]:
    """Delete the temporaries that killed writes of `path` by this host's processes left beside it; those removed.

    Only a writer known to be gone is cleaned up after: one of this host (another host's process ids mean nothing
    here, on a shared folder) whose process no longer exists here, and whose lock on the temporary is gone (a
    writer holds it until its rename: a writer in another pid namespace of this host, a container's, has process
    ids of its own, review46 M1). A live writer's temporary, another user's included, stays, and so do
    temporaries named in the form before the writer was in the name (remove_stale_writes takes those where no
    writer can be at work).
    """
    this_host = f"{_temporary_stem(path)}{_host()}-"
    removed = []
    for name in glob.glob(f"{glob.escape(this_host)}*.tmp", root_dir=path.parent):
        pid = name[len(this_host) :].split(".")[0]  # HOST-PID.XXXXXXXX.tmp
        if pid.isdigit() and not _process_exists(int(pid)) and not _locked(path.parent / name):
            (path.parent / name).unlink(missing_ok=True)
            removed.append(path.parent / name)
    return removed


def _temporary_stem(path: Path) -> str:
    """The start of the names of `path`'s temporaries: the store's temporary prefix and the file's name."""
    return f"{TMP_PREFIX}{path.name}."


def _writer() -> str:
    """This process as a writer, in its temporaries' names: its host and its process id (`0a1b2c3d-4242`)."""
    return f"{_host()}-{os.getpid()}"


@functools.cache
def _host() -> str:
    """A short hash of this host's name: names stay short whatever the host is called."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _locked(path: Path) -> bool:
    """Whether a writer holds its lock on the temporary `path` (one that cannot be opened counts as held)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(descriptor)
    return False


def _process_exists(pid: int) -> bool:
    """Whether a process `pid` exists on this host (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def process_umask() -> int:
    """The process's umask, read once: reading it means setting it, so it is set straight back."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_new_file_modes(directory: Path) -> None:
    """Give the safetensors files under `directory` that this process's user owns the mode open() gives a new file.

    safetensors writes its files 0600 whatever the umask, so a trained model's weights were the one file of its
    folder that a server running as another user could not read. Other files, and other users', are left as they
    are (a shared folder may hold files this run did not write).
    """
    for path in Path(directory).rglob("*.safetensors"):
        give_new_file_mode(path)


def give_new_file_mode(path: Path) -> None:
    """Give the regular file `path`, when this process's user owns it, the mode open() gives a new file."""
    mode = _NEW_FILE_MODE & ~process_umask()
    status = path.lstat()
    if stat.S_ISREG(status.st_mode) and status.st_uid == os.getuid() and stat.S_IMODE(status.st_mode) != mode:
        path.chmod(mode)


def atomic_write_text(path: Path, text: str, *, named_by_user: bool = False, make_folder: bool = True) -> None:
    """Write `text` as UTF-8 to `path` atomically (see atomic_write_bytes)."""
    atomic_write_bytes(path, text.encode("utf-8"), named_by_user=named_by_user, make_folder=make_folder)


def remove_stale_writes(folder: Path, skip: Collection[str] = ()) -> list[Path]:
    """Delete the temporaries of atomic writes killed midway below `folder` (its subfolders named in `skip`
    left alone); the paths removed.

    A SIGKILL between mkstemp and the rename leaves one such file (`.tmp-NAME.XXXX.tmp`) beside the part it
    was writing; a re-run writes the part again under its own name, and the temporary stayed in the store for
    good. Call this only where no writer is at work: finalize and commit_append run after every shard's.
    """
    pattern = f"{TMP_PREFIX}*.tmp"  # atomic_write_bytes's names
    removed = []
    for entry in Path(folder).iterdir():
        if entry.name in skip:
            continue
        for path in entry.rglob(pattern) if entry.is_dir() else [entry] if entry.match(pattern) else []:
            if path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed
