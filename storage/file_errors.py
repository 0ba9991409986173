"""Operating-system errors that name the file they are about.

A failed write, flush, fsync or truncate carries no file name: a full disk
was reported as "No space left on device" alone, and the user could not tell
which disk to free (the store's, an output's, or $TMPDIR's; full49 F4).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike


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
