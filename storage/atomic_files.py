"""Writing a file so that readers see either nothing or the whole of it: the one atomic write of the project.

Each write goes to a uniquely named temporary file in the destination folder
(named with the store's temporary prefix, which finalize and verify skip),
is flushed to disk and renamed over the destination, and the folder is
flushed too, so two writers of the same file (a retried bundle, a re-run
after a crash) never interleave, a killed writer leaves no partial file under
the final name, and a crash after the rename cannot lose the file. The
manifest, TREC runs, ranking data files and shard parts are all written here.

The file gets the mode any new file gets under the process's umask (0644
under the usual 022), not the 0600 of a bare temporary file: a store is read
by query servers, web servers and other users than the one that wrote it.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path

from dilstore.storage.durability import fsync_dir
from dilstore.storage.format import TMP_PREFIX

_NEW_FILE_MODE = 0o666  # what open() asks for; the umask takes bits away


def atomic_write_bytes(path: Path, data: bytes, *, create_parents: bool = True) -> None:
    """Write `data` to `path` atomically, creating parent folders as needed unless not `create_parents`.

    Without `create_parents` a missing folder is a FileNotFoundError naming it (not the temporary file the write
    would have made there), for writers whose caller names the file (a TREC run, predictions) and expects its folder.
    """
    if create_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        if path.parent.exists():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path.parent))
        raise FileNotFoundError(errno.ENOENT, "no such folder", str(path.parent))
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, _NEW_FILE_MODE & ~process_umask())
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
        fsync_dir(path.parent)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


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


def atomic_write_text(path: Path, text: str, *, create_parents: bool = True) -> None:
    """Write `text` as UTF-8 to `path` atomically (see atomic_write_bytes)."""
    atomic_write_bytes(path, text.encode("utf-8"), create_parents=create_parents)


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
