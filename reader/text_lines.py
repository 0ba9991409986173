"""Reading a UTF-8 text file line by line with errors that name the file and the line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from storage.errors import DilstoreError


def numbered_lines(path: Path, what: str = "file") -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded text with its line break) for each line of the UTF-8 file `path`.

    `what` names the expected kind of file in the error for a directory
    ("a JSONL file", "a file"). A missing or unreadable file and a line that is
    not UTF-8 raise DilstoreError naming the file (and the line).
    """
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise DilstoreError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DilstoreError(f"{path}: is a directory, not {what}") from None
    except OSError as error:
        raise DilstoreError(f"{path}: cannot be read ({error.strerror or error})") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DilstoreError(f"{path}:{number}: not UTF-8 text (byte {error.start} of the line)") from None
