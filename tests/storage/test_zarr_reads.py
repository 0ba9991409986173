"""How a failed read of a store file is reported (storage/read_failures.py, storage/zarr_reads.py): damage or a
failure in transit, by name."""

from __future__ import annotations

import errno

import pytest
from fsspec.exceptions import FSTimeoutError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dilstore.storage import ranged
from dilstore.storage.format import StoreFormatError, StoreReadError
from dilstore.storage.read_failures import (
    MESSAGE_WIDTH,
    READ_ATTEMPTS,
    describe,
    is_transient,
    read_failure,
    retry_delay,
)
from tests.fixtures.limits import address_space_limit


class RangeNotSatisfiable(Exception):
    """An HTTP client's error for a 416, as aiohttp's ClientResponseError carries it."""

    status = 416


def test_a_timeout_without_a_message_says_what_happened() -> None:
    """fsspec's timeout has an empty message: the command printed `dilstore rerank: error: ` and nothing else."""
    assert describe(FSTimeoutError()) == ("FSTimeoutError: the server did not answer in time (DILSTORE_READ_TIMEOUT "
                                          "sets the wait)")  # fmt: skip
    failure = read_failure("http://host/store/index/zarr.json", FSTimeoutError())
    assert isinstance(failure, StoreReadError)
    assert str(failure) == (
        "reading http://host/store/index/zarr.json failed: FSTimeoutError: the server did not answer in time "
        "(DILSTORE_READ_TIMEOUT sets the wait); try again"
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
    failure = read_failure("/s/f", OSError(errno.EIO, "Input/output error"), local=True)
    assert isinstance(failure, StoreReadError) and str(failure).endswith("; try again")
    failure = read_failure("/s/f", OSError(errno.EMFILE, "Too many open files"), local=True)
    assert isinstance(failure, StoreReadError) and str(failure).endswith("raise the open-file limit (ulimit -n)")
    assert isinstance(read_failure("https://h/s/f", PermissionError(errno.EACCES, "x")), StoreReadError)


class SlowDown(Exception):
    """A server's 503 asking to back off, as aiohttp's ClientResponseError carries it."""

    status = 503

    def __init__(self, retry_after: str | None = None) -> None:
        super().__init__("503, message='Slow Down'")
        self.headers = {} if retry_after is None else {"Retry-After": retry_after}


class FlakyFilesystem:
    """An fsspec-like filesystem whose first `failures` calls of cat_ranges raise `error`."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def cat_ranges(self, paths, starts, stops, on_error="raise"):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return [bytes(stop - start) for start, stop in zip(starts, stops, strict=True)]


def test_a_remote_read_that_fails_in_transit_is_tried_again_then_reported(monkeypatch) -> None:
    """One 503 (S3's "slow down") or reset ended a whole rerank run over HTTP, its work lost (remote40 M3)."""
    waits: list[float] = []
    monkeypatch.setattr(ranged.time, "sleep", waits.append)
    flaky = FlakyFilesystem(2, ConnectionResetError("reset by peer"))
    assert [bytes(block) for block in ranged.read_blocks(flaky, [("f", 0, 4)])] == [bytes(4)]
    assert flaky.calls == 3 and waits == [0.5, 1.0]
    down = FlakyFilesystem(READ_ATTEMPTS, SlowDown("1.5"))
    with pytest.raises(StoreReadError, match="Slow Down"):
        ranged.read_blocks(down, [("f", 0, 4)])
    assert down.calls == READ_ATTEMPTS and waits[2:] == [1.5, 1.5]  # the server's Retry-After
    damaged = FlakyFilesystem(1, RangeNotSatisfiable("416"))  # damage: no retry mends it
    with pytest.raises(StoreFormatError):
        ranged.read_blocks(damaged, [("f", 0, 4)])
    assert damaged.calls == 1
    assert retry_delay(SlowDown("600"), 0) == 2.0 and retry_delay(SlowDown("Wed, 21 Oct 2026"), 1) == 1.0


def test_a_retry_after_that_is_no_finite_number_waits_the_doubling_wait() -> None:
    """`Retry-After: nan` was read as NaN: time.sleep raised ValueError, a traceback from `ask` (exit 1) and a 500
    from `serve` where a 502 was due, and zarr's asyncio.sleep waited on and on (remote52 F2)."""
    assert [retry_delay(SlowDown(value), 1) for value in ("nan", "NaN", "-nan", "inf", "-inf", "1e999")] == [
        1.0, 1.0, 1.0, 2.0, 1.0, 2.0]  # fmt: skip
    assert retry_delay(SlowDown("-5"), 0) == 0.5


def test_a_chunk_read_through_zarr_that_fails_in_transit_is_tried_again(monkeypatch) -> None:
    import asyncio

    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    from dilstore.storage import zarr_reads

    class Flaky(MemoryStore):
        calls = 0

        async def get(self, key, prototype, byte_range=None):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise SlowDown()
            return await super().get(key, prototype, byte_range)

    async def no_wait(seconds: float) -> None:
        pass

    monkeypatch.setattr(zarr_reads.asyncio, "sleep", no_wait)
    memory = Flaky()
    prototype = default_buffer_prototype()
    asyncio.run(memory.set("a/c/0", prototype.buffer.from_bytes(b"abcd")))
    store = zarr_reads.RequiredChunksStore(memory, "http://host/store")
    assert asyncio.run(store.get("a/c/0", prototype)).to_bytes() == b"abcd" and Flaky.calls == 2


class Forbidden(Exception):
    """A server's 403, as aiohttp's ClientResponseError carries it."""

    status = 403


def test_a_refusal_or_an_untrusted_certificate_says_what_to_check_and_is_not_tried_again(monkeypatch) -> None:
    """Both said "try again", which no retry mends (remote40 L1)."""
    import ssl

    failure = read_failure("https://h/s/manifest.json", Forbidden("403, message='Forbidden'"))
    assert isinstance(failure, StoreReadError) and str(failure).endswith(
        "the server refuses it; check the credentials (in the URL or the environment) and the store's permissions")
    certificate = ssl.SSLCertVerificationError("certificate verify failed: self-signed certificate")
    assert "SSL_CERT_FILE names a certificate bundle to trust" in str(read_failure("https://h/s/f", certificate))
    assert not is_transient(Forbidden()) and not is_transient(certificate) and is_transient(SlowDown())
    monkeypatch.setattr(ranged.time, "sleep", lambda seconds: None)
    refused = FlakyFilesystem(READ_ATTEMPTS, Forbidden("403"))
    with pytest.raises(StoreReadError, match="the server refuses it"):
        ranged.read_blocks(refused, [("f", 0, 4)])
    assert refused.calls == 1


def test_an_error_s_text_is_its_first_line_cut_to_a_readable_width() -> None:
    """A server's bad answer put a kilobyte of raw response bytes over several lines into the message (remote40 L3)."""
    raw = ValueError("\nBad status line:\n Expected HTTP/ " + "x" * 2000)
    assert describe(raw) == "ValueError: Bad status line:"
    assert len(describe(ValueError("y" * 2000))) == len("ValueError: ") + MESSAGE_WIDTH


class BytesFilesystem:
    """An fsspec-like filesystem of files held in memory, answering cat_ranges as a local one does."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def cat_ranges(self, paths, starts, stops, on_error="raise"):
        return [self.files[path][start:stop] for path, start, stop in zip(paths, starts, stops, strict=True)]


FILES = {"a": bytes(range(200)), "b": bytes(range(255, 55, -1))}
byte_ranges = st.lists(
    st.tuples(st.sampled_from(sorted(FILES)), st.integers(0, 200), st.integers(0, 200)).map(
        lambda r: (r[0], min(r[1], r[2]), max(r[1], r[2]))
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(byte_ranges, st.integers(0, 64))
@example([("a", 0, 100), ("a", 10, 50)], 0)  # the second inside the first: one block that must keep the first's end
@example([("a", 10, 50), ("a", 0, 100), ("a", 20, 30)], 0)
def test_read_blocks_gives_each_range_its_own_bytes_however_the_ranges_overlap_or_nest(ranges, gap: int) -> None:
    """Ranges of one file that overlap, touch, nest or lie within `gap` are read as merged blocks; each range still
    gets exactly data[start:stop], in the order asked."""
    views = ranged.read_blocks(BytesFilesystem(FILES), ranges, gap=gap)
    assert [bytes(view) for view in views] == [FILES[path][start:stop] for path, start, stop in ranges]


@pytest.mark.parametrize(("error", "unreadable"), [
    (PermissionError(errno.EACCES, "Permission denied", "/s/shards/a"), "/s/shards/a"),
    (PermissionError(errno.EPERM, "Operation not permitted", "/s/shards/a"), "/s/shards/a"),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "/s/shards/a"), None),  # a folder opens: no permission to mend
    (OSError(errno.ELOOP, "Too many levels of symbolic links", "/s/shards/a"), None),
])
def test_only_a_file_refused_for_permission_is_named_unreadable(error: OSError, unreadable: str | None) -> None:
    """(mut57c) `serve` looks again at the file a lasting failure names as `unreadable` (perm57 F1), and serves the
    store again once it opens: a directory in a file's place opens too, so it must not be named; a file refused with
    EPERM (an immutable file, a mount's policy) must be."""
    failure = read_failure("shard a", error, local=True)
    assert isinstance(failure, StoreFormatError) and getattr(failure, "unreadable", None) == unreadable


def test_a_read_short_of_memory_under_an_address_space_limit_or_for_a_map_is_a_read_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under `ulimit -v` a MemoryError reading a store's file said "no file of a store is that large; run `dilstore
    verify`", damage, on which `serve` takes the store out of service; a map refused for want of memory (ENOMEM) was
    a 502 saying "Cannot allocate memory; try again" (limits59 F7)."""

    address_space_limit(monkeypatch, 3000 << 20)
    for error in (MemoryError(), OSError(errno.ENOMEM, "Cannot allocate memory")):
        failure = read_failure("/s/shards/shard-00000/states/values/c/0/0", error, local=True)
        assert isinstance(failure, StoreReadError), error
        assert str(failure) == ("reading /s/shards/shard-00000/states/values/c/0/0 failed: this process ran out of "
                                "memory under its address-space limit (ulimit -v) of 3,000 MiB")  # fmt: skip


def test_a_shortage_is_found_in_an_error_s_causes_and_context_and_nowhere_else(monkeypatch) -> None:
    """(mut59b M3) process_shortage's walk and words went untested where its callers' tests do not reach: an error
    raised while handling too many open files (its __context__) could be damage, ENFILE (the system's table full)
    could be missed, a cause chain that loops could hang the read, any RuntimeError naming a thread could read as
    "no thread could be started", and macOS's unlimited address space (RLIM_INFINITY there is 2**63 - 1, not -1)
    could be named as a limit of 8 EiB, and no test noticed."""
    import resource
    import threading

    from dilstore.storage.read_failures import address_space_words, process_shortage, thread_refused

    handling = ValueError("zarr gave up")
    handling.__context__ = OSError(errno.EMFILE, "Too many open files")  # raised while handling it
    assert process_shortage(handling).startswith("this process holds as many open files as it may")
    assert process_shortage(OSError(errno.ENFILE, "Too many open files in system")).startswith("this process holds")
    looped, other = ValueError("a"), KeyError("b")
    looped.__cause__, other.__context__ = other, looped
    found: list[str | None] = []
    walk = threading.Thread(target=lambda: found.append(process_shortage(looped)), daemon=True)
    walk.start()
    walk.join(5)
    assert found == [None]
    assert thread_refused(RuntimeError("can't start new thread"))
    assert not thread_refused(RuntimeError("threads can only be started once"))
    monkeypatch.setattr(resource, "RLIM_INFINITY", 2**63 - 1)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2**63 - 1, 2**63 - 1))
    assert address_space_words() == ""
