"""One writer per folder: an advisory lock held for a whole run that writes a store, an index or a training run.

Two writers on one store once left shards of mixed encodings, all marked
committed, that resume then trusted; two `train qa` runs into one folder
crashed each other's checkpoints; two `dilstore index` runs deleted each
other's half-built index. The lock is `fcntl.flock` on a small file beside
the folder (`.NAME.dilstore-lock` in its parent folder; `.NAME.dilstore-index-lock`
for a store's BM25 index), not inside it, so that `--overwrite`, which deletes
the store folder, cannot delete the lock out from under a second writer. The
file holds the pid of the writer that holds the lock, for the error message;
the kernel releases the lock when that process ends, however it ends (kill -9
included). The writer removes the file (and the folders it made for it, when
still empty) as it lets go, so that a refused run leaves nothing behind (a
`train` whose inputs were missing left `runs/.NAME.dilstore-lock`); a writer
that opened the file just before it was removed sees that once it holds the
lock, and takes the lock of the file now there instead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import naming

WRITE_ROLE = "dilstore"
INDEX_ROLE = "dilstore-index"
PID_WAIT_SECONDS = 0.5  # how long a refused writer waits for the holder to record its pid
_FOLDER_ATTEMPTS = 5  # makings of a lock file's folders that another writer's cleanup may remove in between
# What open() asks for, as for any new file: the umask decides. It was 0644, which no umask widens: a lock file a
# killed run left (a writer removes its own as it lets go) refused the store's other writers in its group under
# umask 002 (perm57 F5).
_LOCK_FILE_MODE = 0o666


def lock_path(folder: Path, role: str = WRITE_ROLE) -> Path:
    """The lock file of `folder` for `role`: beside its real path, named after both.

    The folder's real path decides (symbolic links resolved, as far as they lead), so that two spellings of one
    folder (`lk` and a link to it) take one lock: they took two, and two index builds ran on one store at once.
    """
    folder = Path(os.path.realpath(folder))  # Path.resolve raises on a link loop; realpath leaves the loop as it is
    return folder.parent / f".{folder.name}.{role}-lock"


@contextmanager
def write_lock(folder: Path, role: str = WRITE_ROLE, doing: str = "written") -> Iterator[Path]:
    """Hold `folder`'s lock for `role` in the `with` block; a DilstoreError naming the holder's pid if taken.

    `doing` says what the holder does to the folder, for the message.
    """
    path = lock_path(folder, role)
    _check_ancestors(Path(folder))
    made = [ancestor for ancestor in (path.parent, *path.parent.parents) if not ancestor.exists()]
    descriptor = _locked(path, Path(folder), role, doing)
    try:
        with naming(path):  # a full disk fails the pid's write, which names no file
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):  # removed while held, so that no writer takes a lock on a removed file
            path.unlink()
        os.close(descriptor)
        for ancestor in made:  # deepest first; a folder the run wrote into is not empty and stays
            with contextlib.suppress(OSError):
                ancestor.rmdir()


def _locked(path: Path, folder: Path, role: str, doing: str) -> int:
    """A descriptor of the lock file at `path`, locked; a DilstoreError naming the holder if another has it."""
    while True:
        descriptor = _opened(path, folder)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # The holder /proc/locks names; the file may still hold an earlier holder's pid.
            holder = writer_of(folder, role) or _holder_pid(descriptor)
            os.close(descriptor)
            raise _taken(folder, holder, path, doing) from None
        if _is_file_at(descriptor, path):
            return descriptor
        os.close(descriptor)  # its holder removed it as it let go, after this process opened it: lock the new one


def _taken(folder: Path, holder: str, path: Path, doing: str) -> DilstoreError:
    """The error of a writer turned away from `folder`, whose lock at `path` `holder` holds."""
    return DilstoreError(f"{folder} is being {doing} by pid {holder} (lock {path}); wait for that run or stop it")


def refuse_if_locked(folder: Path) -> None:
    """Raise the error `write_lock(folder)` would when another process holds that lock, before a run does slow work
    ahead of taking it (a model and the JVM loaded, then the run turned away: qa48 L6). A check, not the lock:
    `write_lock` still decides. Only output files are checked so, under the default role."""
    holder = writer_of(folder)
    if holder is not None:
        raise _taken(folder, holder, lock_path(folder), "written")


def _opened(path: Path, folder: Path) -> int:
    """The lock file at `path` opened for reading and writing, made (with its folders) if missing.

    A writer letting go of a sibling's lock removes the folders it made, when empty, which may be the moment
    between this process's mkdir and its open: it makes them again.
    """
    attempts = 0
    try:
        while True:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                return os.open(path, os.O_RDWR | os.O_CREAT, _LOCK_FILE_MODE)
            except FileNotFoundError as error:  # the folder went between the two, or takes no new files
                attempts += 1
                if attempts == _FOLDER_ATTEMPTS and path.parent.is_dir():  # /proc says ENOENT (train46 F4)
                    raise DilstoreError(f"cannot create the lock file {path}: its folder {path.parent} takes no "
                                        f"new files ({error.strerror})") from None  # fmt: skip
                if attempts == _FOLDER_ATTEMPTS:
                    raise DilstoreError(f"cannot create the lock file {path}: its folder {path.parent} was removed "
                                        f"{attempts} times as it was made") from None  # fmt: skip
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):  # a read-only mount says EROFS
            raise
        if path.exists():  # the folder is writable, or the file would not be there: the file itself is not
            # /proc/locks leaves out the holders in other pid namespaces (another container sharing the folder) and
            # knows none on other machines: "no process holds it: delete it" sent the user to delete a live writer's
            # lock, letting a second writer in (read57b F2).
            left = ("; no process this system shows holds it: unless a run of it goes on in another container or "
                    "on another machine, a run killed at once (kill -9 or the out-of-memory killer) left it: delete it"
                    if _held_by(path) is None else "")  # fmt: skip
            raise DilstoreError(f"cannot open the lock file {path} of {folder}: {error.strerror}; it must be "
                                f"readable and writable by this user{left}") from None  # fmt: skip
        raise DilstoreError(f"cannot create the lock file {path}: {error.strerror}; the lock of {folder} lives "
                            f"beside it, so its folder {path.parent} must be writable") from None  # fmt: skip


def _is_file_at(descriptor: int, path: Path) -> bool:
    """Whether `descriptor` is the file now at `path`."""
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _holder_pid(descriptor: int) -> str:
    """The pid the lock's holder wrote into the lock file. It writes it just after it took the lock, so a writer
    refused at that moment may find the file still empty: wait up to PID_WAIT_SECONDS for it."""
    deadline = time.monotonic() + PID_WAIT_SECONDS
    while not (holder := os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()):
        if time.monotonic() >= deadline:
            return "unknown"
        time.sleep(0.01)
    return holder


def _held_by(path: Path) -> str | None:
    """The pid of a process that holds an flock on the file at `path` (this one included), or None: none does, or this
    system does not say (Linux's /proc/locks names flock holders)."""
    try:
        status = path.stat()
        table = Path("/proc/locks").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    device = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    for line in table.splitlines():  # "1: FLOCK  ADVISORY  WRITE 28626 fe:00:2146315 0 EOF"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device and fields[4].isdigit():
            return fields[4]
    return None


def writer_of(folder: Path, role: str = WRITE_ROLE) -> str | None:
    """The pid of another process that holds `folder`'s lock for `role`, or None: none holds it, this process does
    (an `--append` reading the manifest of the store it locked is no writer to wait for), or this system does not
    say (Linux's /proc/locks names flock holders).

    Read, not probed by taking the lock: a reader that took it, however briefly, could turn away a writer starting
    at that moment.
    """
    holder = _held_by(lock_path(folder, role))
    return None if holder is None or int(holder) == os.getpid() else holder


def compactor_of(store: Path) -> str | None:
    """The pid of a `dilstore compact` of `store` in another process (it holds both the store's write lock and its
    index lock), or None."""
    writer = writer_of(store)
    return writer if writer is not None and writer_of(store, INDEX_ROLE) == writer else None


def _check_ancestors(folder: Path) -> None:
    """A DilstoreError when the nearest existing folder above `folder` is a file (mkdir said only "File exists")."""
    for ancestor in folder.absolute().parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise DilstoreError(f"{folder} cannot be made: {ancestor} is a file, not a folder")
            return
