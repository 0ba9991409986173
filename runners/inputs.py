"""Checks of the files and folders a command reads, before any work: each names its option and what is wrong."""

from __future__ import annotations

from pathlib import Path

from dilstore.storage.errors import DilstoreError


def require_file(path: Path, flag: str) -> None:
    """A DilstoreError naming `flag` unless `path` is a regular file (missing, a folder, a device or FIFO).

    A pipe (`<(zcat FILE)`, /dev/stdin) can be read once, and the commands that ask for a file read it more than
    once (a checksum for the journal, a second epoch): the second read found nothing, and a resume took another
    piped file's answers for its own (qa48 H1).
    """
    if path.is_file():
        return
    if not path.exists():
        raise DilstoreError(f"{flag} {path}: no such file")
    if path.is_dir():
        raise DilstoreError(f"{flag} {path}: is a directory; give a file")
    raise DilstoreError(f"{flag} {path}: is not a regular file; give a file (a pipe, such as <(zcat FILE), can be "
                        "read only once, and this file is read more than once)")


def require_directory(path: Path, flag: str) -> None:
    """A DilstoreError naming `flag` unless `path` is a directory."""
    if path.is_dir():
        return
    if not path.exists():
        raise DilstoreError(f"{flag} {path}: no such directory")
    raise DilstoreError(f"{flag} {path}: is a file, not a directory")
