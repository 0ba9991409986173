"""Making writes durable before they become visible: fsync files and directories, and publish finished folders."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from dilstore.storage.file_errors import naming
from dilstore.storage.format import TMP_PREFIX


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (new names, renames) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        with naming(path):
            os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(path: Path) -> None:
    """Flush every file and directory under `path` to disk, so a rename that publishes it is safe. An fsync that
    fails (an I/O error of the write-back, a quota a network filesystem meets only then) names its file: it said
    "Input/output error" alone (disk56 F4)."""
    for directory, _, files in os.walk(path, topdown=False):
        for file_name in files:
            descriptor = os.open(os.path.join(directory, file_name), os.O_RDONLY)
            try:
                with naming(os.path.join(directory, file_name)):
                    os.fsync(descriptor)
            finally:
                os.close(descriptor)
        fsync_dir(Path(directory))


def replace_dir(finished: Path, target: Path, aside: Path | None = None) -> None:
    """Put the complete folder `finished` at `target`, replacing what is there (a folder, a file or a link).

    An existing target is renamed aside before `finished` is renamed in, and back if that fails (or is
    interrupted), so at every moment a complete folder, old or new, is at one of the two names; then the old one
    is deleted. `finished`'s files reach the disk before the rename publishes them, and the rename itself after.
    The aside name is `aside` where the caller finishes a killed replacement itself (a whole store), else
    `.tmp-old-NAME-<uuid>`, a stale write that finalize and verify know.
    """
    fsync_tree(finished)
    if os.path.lexists(target):
        aside = aside or target.with_name(f"{aside_prefix(target.name)}{uuid.uuid4().hex}")
        remove_path(aside)
        os.rename(target, aside)
        try:
            os.rename(finished, target)
        except BaseException:
            if os.path.lexists(finished):  # not renamed in (an interrupt after the rename leaves the new one)
                os.rename(aside, target)
            raise
        remove_path(aside)
    else:
        os.rename(finished, target)
    fsync_dir(target.parent)


def aside_prefix(name: str) -> str:
    """How the names of the folders `replace_dir` sets a `name` aside in begin: a kill between its renames leaves
    one, whole, for the next writer to remove."""
    return f"{TMP_PREFIX}old-{name}-"


def remove_path(path: Path) -> None:
    """Delete what is at `path`, whatever it is (a folder tree, a file, a symbolic link); nothing if nothing is there.

    `shutil.rmtree(path, ignore_errors=True)` alone leaves a file or a link where a folder was expected.
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()
