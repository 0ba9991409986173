"""Checks of the files and folders a command reads, before any work: each names its option and what is wrong."""

from __future__ import annotations

from pathlib import Path

from dilstore.storage.errors import DilstoreError


def require_file(path: Path, flag: str) -> None:
    """A DilstoreError naming `flag` unless `path` is a regular file (missing, a folder, a device or FIFO)."""
    if path.is_file():
        return
    if not path.exists():
        raise DilstoreError(f"{flag} {path}: no such file")
    kind = "a directory" if path.is_dir() else "not a regular file"
    raise DilstoreError(f"{flag} {path}: is {kind}; give a file")


def require_directory(path: Path, flag: str) -> None:
    """A DilstoreError naming `flag` unless `path` is a directory."""
    if path.is_dir():
        return
    if not path.exists():
        raise DilstoreError(f"{flag} {path}: no such directory")
    raise DilstoreError(f"{flag} {path}: is a file, not a directory")
