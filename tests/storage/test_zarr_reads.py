"""How a failed read of a store file is reported (storage/zarr_reads.py): damage or a failure in transit, by name."""

from __future__ import annotations

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
