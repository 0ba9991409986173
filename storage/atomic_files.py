"""Writing a file so that readers see either nothing or the whole of it.

Each write goes to a uniquely named temporary file in the destination folder
(named with the store's temporary prefix, which finalize and verify skip)
and is renamed over the destination, so two writers of the same file (a
retried bundle, a re-run after a crash) never interleave and a killed writer
leaves no partial file under the final name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dilstore.storage.format import TMP_PREFIX


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically, creating parent folders as needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` as UTF-8 to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
