"""How a failed read of a store file is reported (storage/zarr_reads.py): damage or a failure in transit, by name."""

from __future__ import annotations

import errno

from fsspec.exceptions import FSTimeoutError

from dilstore.storage.format import StoreFormatError, StoreReadError
from dilstore.storage.zarr_reads import describe, read_failure


class RangeNotSatisfiable(Exception):
    """An HTTP client's error for a 416, as aiohttp's ClientResponseError carries it."""

    status = 416


def test_a_timeout_without_a_message_says_what_happened() -> None:
    """fsspec's timeout has an empty message: the command printed `dilstore rerank: error: ` and nothing else."""
    assert describe(FSTimeoutError()) == "FSTimeoutError: the server did not answer in time"
    failure = read_failure("http://host/store/index/zarr.json", FSTimeoutError())
    assert isinstance(failure, StoreReadError)
    assert str(failure) == (
        "reading http://host/store/index/zarr.json failed: FSTimeoutError: the server did not answer in time; "
        "try again"
    )


def test_a_range_past_the_end_of_a_file_is_damage_and_anything_else_a_read_error() -> None:
    assert isinstance(read_failure("f", RangeNotSatisfiable("416")), StoreFormatError)
    assert "shorter than its metadata says" in str(read_failure("f", RangeNotSatisfiable("416")))
    assert isinstance(read_failure("f", ConnectionResetError("reset by peer")), StoreReadError)
    assert describe(ConnectionResetError("reset by peer")) == "ConnectionResetError: reset by peer"


def test_a_local_file_that_cannot_be_read_for_good_is_damage_and_a_passing_failure_a_read_error() -> None:
    """Every local OSError was made damage, so too many open files took a served store offline until a restart."""
    lasting = [IsADirectoryError(errno.EISDIR, "Is a directory"), PermissionError(errno.EACCES, "Permission denied"),
               OSError(errno.ELOOP, "Too many levels of symbolic links"), ValueError("embedded null byte")]
    for error in lasting:
        assert isinstance(read_failure("/s/f", error, local=True), StoreFormatError), error
    for error in [OSError(errno.EMFILE, "Too many open files"), OSError(errno.EIO, "Input/output error")]:
        failure = read_failure("/s/f", error, local=True)
        assert isinstance(failure, StoreReadError) and str(failure).endswith("; try again"), error
    assert isinstance(read_failure("https://h/s/f", PermissionError(errno.EACCES, "x")), StoreReadError)
