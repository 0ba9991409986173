"""Making writes durable before they become visible: fsync files and directories."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (new names, renames) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(path: Path) -> None:
    """Flush every file and directory under `path` to disk, so a rename that publishes it is safe."""
    for directory, _, files in os.walk(path, topdown=False):
        for file_name in files:
            descriptor = os.open(os.path.join(directory, file_name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        fsync_dir(Path(directory))
