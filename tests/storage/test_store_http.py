"""Stores read over real HTTP (a server on 127.0.0.1): the same passages, info and verify as the local path,
a 100-passage fetch in a handful of requests, and one-line errors for URLs that hold no store.

Tests whose reads can ask for a folder (info, verify, a URL that holds no store) run against a server with HTML
folder listings (Python's http.server) and one without (like object stores and CDNs), see
tests/fixtures/http_store.py. Opening a store and fetching from it never ask for a folder (the fetch test checks
that), so the fetch tests run against the server without listings only: both servers answer every request they
send alike.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import numpy as np
import pytest

from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreFormatError, StoreReadError
from dilstore.storage.info import store_info
from dilstore.storage.location import StoreLocation
from dilstore.storage.reader import open_store
from dilstore.storage.records import StoredPassage
from dilstore.storage.verify import verify_store
from tests.fixtures.http_store import BackloggedServer, HttpServer, serve_directory
from tests.fixtures.store_fixtures import build_store, random_shards

pytestmark = pytest.mark.usefixtures("quick_retries")  # reads fail on purpose here

SHARDS = 2
IDS = [f"s{shard}/p{row}" for shard in range(SHARDS) for row in range(0, 300, 6)]  # 100 passages, both shards
PER_TOKEN_ARRAYS = {"fp16": 4, "int8": 5}  # texts, token ids, char spans and the encoding's per-token arrays


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fp16, int8 and zstd-compressed stores of the same passages, and a folder that is not a store."""
    root = tmp_path_factory.mktemp("http-stores")
    shards = random_shards([300] * SHARDS, state_shape=(16,), max_words=60)
    shards = [[replace(record, vector=np.full(16, index, dtype=np.float32)) for index, record in enumerate(shard)]
              for shard in shards]  # fmt: skip  # passage vectors, read whole when a shard opens
    build_store(root / "fp16", shards, encoding="fp16")
    build_store(root / "int8", shards, encoding="int8")
    build_store(root / "zstd", shards[:1], encoding="fp16", compressor="zstd")
    (root / "not-a-store").mkdir()
    (root / "not-a-store" / "notes.txt").write_text("no manifest here\n")
    return root


@pytest.fixture(params=[True, False], ids=["listings", "no-listings"])
def server(request: pytest.FixtureRequest, served_root: Path) -> Iterator[HttpServer]:
    with serve_directory(served_root, listings=request.param) as running:
        yield running


@pytest.fixture
def fetch_server(served_root: Path) -> Iterator[HttpServer]:
    """A server without listings, for tests that only open stores and fetch: they ask for no folder."""
    with serve_directory(served_root, listings=False) as running:
        yield running


def folders_asked_for(server: HttpServer, root: Path) -> list[str]:
    """The paths of the requests `server` answered that named a folder under `root` (or ended in '/')."""
    return [path for path in server.counter.paths if path.endswith("/") or (root / path.lstrip("/")).is_dir()]


def assert_same_passages(got: list[StoredPassage], expected: list[StoredPassage]) -> None:
    assert len(got) == len(expected)
    for one, other in zip(got, expected, strict=True):
        assert (one.id, one.title, one.text) == (other.id, other.title, other.text)
        for field in ("token_ids", "char_spans", "states", "vector"):
            if getattr(other, field) is None:  # a store without passage vectors
                assert getattr(one, field) is None, field
                continue
            np.testing.assert_array_equal(getattr(one, field), getattr(other, field), err_msg=field)
            assert getattr(one, field).dtype == getattr(other, field).dtype, field


@pytest.mark.parametrize(("name", "read_path"), [("fp16", "ranged"), ("int8", "ranged"), ("zstd", "zarr")])
def test_a_fetch_over_http_equals_the_local_path(served_root: Path, fetch_server: HttpServer, name: str,
                                                  read_path: str) -> None:  # fmt: skip
    """The same passages as the local path; no request names a folder, so a server's listings change nothing."""
    server = fetch_server
    wanted = [passage_id for passage_id in IDS if passage_id.startswith("s0/")] if name == "zstd" else IDS
    wanted = wanted + wanted[:7][::-1]  # repeats, in another order
    store = open_store(f"{server.url}/{name}")
    assert store.read_path == read_path
    assert_same_passages(store.fetch(wanted), open_store(served_root / name).fetch(wanted))
    assert "s0/p1" in store and "ghost" not in store
    assert server.requests > 0 and folders_asked_for(server, served_root) == []


@pytest.mark.parametrize("read_path", ["ranged", "zarr"])
def test_a_cold_fetch_opens_its_shards_at_once(served_root: Path, read_path: str) -> None:
    """Opening a remote shard takes round trips; one shard after another, a fetch that touches many adds them up.
    Nothing checked that the shards' metadata is read for all of them at once (tests39 M3). One passage of each
    shard makes the fetch touch both: which shards it touches, not how many passages, decides what opens at once."""
    with serve_directory(served_root, listings=False, latency=0.05) as server:
        store = open_store(f"{server.url}/fp16", read_path=read_path)
        server.counter.reset()
        store.fetch([IDS[0], IDS[-1]])  # s0/p0, s1/p294
    metadata = [(path.split("/")[3], start, end) for path, start, end in server.counter.spans
                if path.startswith("/fp16/shards/") and path.endswith("/zarr.json")]  # fmt: skip
    assert {shard for shard, _, _ in metadata} == {"shard-00000", "shard-00001"}
    overlapping = [(one[0], other[0]) for one, other in itertools.combinations(metadata, 2)
                   if one[0] != other[0] and one[1] < other[2] and other[1] < one[2]]  # fmt: skip
    assert overlapping, "no two shards' metadata was read at once"


@pytest.mark.parametrize("encoding", ["fp16", "int8"])
def test_a_100_passage_fetch_costs_a_few_requests(fetch_server: HttpServer, encoding: str) -> None:
    """One block per per-token array and shard once the shards are open; opening costs a fixed few more."""
    server = fetch_server
    server.counter.reset()
    store = open_store(f"{server.url}/{encoding}")
    opened = server.requests
    store.fetch(IDS)
    cold = server.requests
    server.counter.reset()
    store.fetch(IDS)
    warm = server.requests
    assert opened <= 10  # manifest, id index
    assert warm <= SHARDS * PER_TOKEN_ARRAYS[encoding]
    assert cold <= opened + SHARDS * 30 + warm  # each shard: its metadata, one round of small arrays and indexes
    if encoding == "fp16":  # what it was before: zarr-python reads the shard index and each chunk per passage
        server.counter.reset()
        open_store(f"{server.url}/{encoding}", read_path="zarr").fetch(IDS)
        assert server.requests > 20 * warm


def test_info_and_verify_over_http_equal_the_local_path(served_root: Path, server: HttpServer, capsys) -> None:
    for name in ("fp16", "int8", "zstd"):
        url = f"{server.url}/{name}"
        remote, local = store_info(url), store_info(served_root / name)
        assert remote.pop("store") == url and remote.pop("files_listed") == "manifest"  # HTML pages are no listing
        assert local.pop("files_listed") == "listing"
        assert remote == {key: value for key, value in local.items() if key != "store"}
        report, expected = verify_store(url), verify_store(served_root / name)
        assert report.ok and report.problems == []
        assert (report.files_checked, report.bytes_checked) == (expected.files_checked, expected.bytes_checked)
    url = f"{server.url}/int8"
    assert main(["info", url, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["store"], printed["passages"], printed["encoding"]) == (url, 2 * 300, "int8")
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "OK"


@pytest.mark.parametrize("listings", [True, False], ids=["listings", "no-listings"])
def test_verify_over_http_reports_a_changed_and_a_missing_file(served_root: Path, tmp_path: Path,
                                                               listings: bool) -> None:  # fmt: skip
    store = Path(shutil.copytree(served_root / "fp16", tmp_path / "fp16"))
    changed = store / "shards" / "shard-00000" / "states" / "values" / "c" / "0" / "0"
    data = bytearray(changed.read_bytes())
    data[100] ^= 0xFF
    changed.write_bytes(bytes(data))
    (store / "shards" / "shard-00001" / "tokens" / "ids" / "c" / "0").unlink()
    with serve_directory(tmp_path, listings=listings) as server:
        report = verify_store(f"{server.url}/fp16")
    assert not report.ok
    assert "shards/shard-00000/states/values/c/0/0: SHA-256 differs from the manifest (the file changed after " \
           "finalize)" in report.problems  # fmt: skip
    assert "missing file shards/shard-00001/tokens/ids/c/0" in report.problems


@pytest.mark.parametrize("damage", ["cut", "removed"])
def test_a_file_cut_or_removed_after_the_store_opened_is_a_store_error(served_root: Path, tmp_path: Path,
                                                                       damage: str) -> None:  # fmt: skip
    """Found at fetch time over HTTP (416 for a range past the end, 404), it was a traceback from aiohttp/fsspec."""
    store = Path(shutil.copytree(served_root / "fp16", tmp_path / "fp16"))
    with serve_directory(tmp_path, listings=True) as server:
        opened = open_store(f"{server.url}/fp16")
        opened.fetch(IDS[:1])  # shard 0 is open: its metadata and whole arrays are read
        states = store / "shards" / "shard-00000" / "states" / "values" / "c" / "0" / "0"
        if damage == "cut":
            states.write_bytes(states.read_bytes()[:10])
        else:
            states.unlink()
        with pytest.raises(StoreFormatError) as raised:
            opened.fetch(IDS[40:43])
    message = str(raised.value)
    assert "shards/shard-00000/states/values/c/0/0" in message and "\n" not in message
    expected = {"cut": "the file is shorter than its metadata says",
                "removed": "not found (the store lacks a file"}[damage]  # fmt: skip
    assert expected in message and "dilstore verify" in message, message


@pytest.mark.parametrize("damage", ["cut", "removed"])
@pytest.mark.parametrize("array", ["hashes", "rows"])
def test_an_id_index_file_cut_or_removed_is_a_store_error_at_open(served_root: Path, tmp_path: Path, damage: str,
                                                                  array: str) -> None:  # fmt: skip
    """zarr-python read a missing index file as zeros: every id then looked absent (hashes), or every passage
    came from row 0 (rows); read whole, the file's absence and size are checked."""
    store = Path(shutil.copytree(served_root / "fp16", tmp_path / "fp16"))
    damaged = store / "index" / array / "c" / "0"
    if damage == "cut":
        damaged.write_bytes(damaged.read_bytes()[:-100])
    else:
        damaged.unlink()
    with serve_directory(tmp_path, listings=True) as server, pytest.raises(StoreFormatError) as raised:
        open_store(f"{server.url}/fp16").fetch(IDS[:3])
    message = str(raised.value)
    assert f"index/{array}/c/0" in message and "\n" not in message
    assert ("missing array file" if damage == "removed" else "its metadata implies") in message


@pytest.mark.parametrize(
    "failing",
    ["manifest.json", "index/zarr.json", "index/rows/c/0", "shards/shard-00001/zarr.json",
     "shards/shard-00001/tokens/ids/zarr.json", "shards/shard-00001/states/values/c/0/0"],
)  # fmt: skip
def test_a_server_error_is_a_read_error_naming_the_file_and_the_next_read_works(
    served_root: Path, failing: str, capsys
) -> None:
    """An HTTP 500 on metadata raised aiohttp's own error (a traceback at the command line), and a 500 on a data
    range a StoreFormatError, which `serve` took for damage and so stopped serving the store for good. On the
    manifest of a server that lists folders, it read as a store never finalized."""
    with serve_directory(served_root, listings=failing == "manifest.json") as server:
        url = f"{server.url}/fp16"
        expected = open_store(served_root / "fp16").fetch(IDS)  # the same passages (the fetch test above)
        opened = open_store(url)
        server.faults[failing] = 500
        with pytest.raises(StoreReadError) as raised:
            open_store(url).fetch(IDS)
        message = str(raised.value)
        assert failing in message and "500" in message and "\n" not in message
        if failing.endswith("/c/0/0"):  # read in one batch with other files' ranges: the failing one is named
            assert message.startswith(f"reading byte ranges of {url}/{failing} failed: "), message
        if failing.startswith("shards/"):  # an open store meets the failure at fetch, and reads again after it
            with pytest.raises(StoreReadError):
                opened.fetch(IDS)
        assert main(["info", url]) == (2 if failing == "manifest.json" else 0)
        err = capsys.readouterr().err
        assert "Traceback" not in err and (not err or err.startswith("dilstore info: error: reading "))
        server.faults.clear()
        assert_same_passages(opened.fetch(IDS), expected)


@pytest.mark.parametrize("read_path", ["auto", "zarr"])
def test_a_missing_file_read_through_zarr_python_is_a_store_error_not_zeros(served_root: Path, tmp_path: Path,
                                                                           read_path: str) -> None:  # fmt: skip
    """zarr-python reads an absent chunk file as the fill value: a compressed store (always read through it) or the
    zarr read path gave states of 0.0, empty texts and token ids 0, and `rerank` scored them without a word."""
    name = "zstd" if read_path == "auto" else "fp16"
    store = Path(shutil.copytree(served_root / name, tmp_path / name))
    expected = open_store(store).fetch(IDS[:3])
    (store / "shards" / "shard-00000" / "passages" / "texts" / "bytes" / "c" / "0").unlink()
    with pytest.raises(StoreFormatError, match=r"missing array file .*shard-00000/passages/texts/bytes/c/0; run "):
        open_store(store, read_path=read_path).fetch(IDS[:3])
    with serve_directory(tmp_path, listings=False) as server, pytest.raises(StoreFormatError, match="missing array"):
        open_store(f"{server.url}/{name}", read_path=read_path).fetch(IDS[:3])
    assert expected[0].text  # the file held text: zeros would have read as ""


def test_a_silent_server_times_out_as_storage_options_say_and_the_error_says_so(served_root: Path) -> None:
    """The README's way to shorten fsspec's 5-minute wait; the timeout's empty message left the error blank."""
    import aiohttp

    options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=0.5)}}
    with serve_directory(served_root, latency=3.0) as server, pytest.raises(DilstoreError) as raised:
        open_store(f"{server.url}/fp16", storage_options=options)
    assert str(raised.value).endswith("(DILSTORE_READ_TIMEOUT sets the wait)"), str(raised.value)


def test_a_silent_server_times_out_after_the_wait_the_environment_sets(
    served_root: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """fsspec waits 5 minutes for a silent server, and no command could shorten it: a `serve` store's one worker
    was held that long (remote40 M2)."""
    monkeypatch.setenv("DILSTORE_READ_TIMEOUT", "0.5")
    with serve_directory(served_root, latency=3.0) as server:
        assert main(["info", f"{server.url}/fp16"]) == 2
    err = capsys.readouterr().err
    assert "Timeout" in err and err.rstrip().endswith("(DILSTORE_READ_TIMEOUT sets the wait)"), err
    monkeypatch.setenv("DILSTORE_READ_TIMEOUT", "soon")
    assert main(["info", "http://127.0.0.1:1/store"]) == 2
    assert "DILSTORE_READ_TIMEOUT must be a number of seconds above 0, got 'soon'" in capsys.readouterr().err
    assert main(["info", str(served_root / "fp16")]) == 0  # read for stores over http(s) only (review40c)


@pytest.mark.parametrize(("value", "seconds"), [("0", None), ("0.0", None), ("-1", None), ("inf", None),
                                                ("nan", None), ("1e-3", 0.001), (" 2 ", 2.0), ("", None)])
def test_the_read_timeout_is_a_number_of_seconds_above_zero(
    monkeypatch: pytest.MonkeyPatch, value: str, seconds: float | None
) -> None:
    """0 is refused as a negative wait is: aiohttp takes a connect or read timeout of 0 as none, which would leave
    only the whole request's five minutes that the variable is there to shorten."""
    from dilstore.storage.location import read_timeout

    monkeypatch.setenv("DILSTORE_READ_TIMEOUT", value)
    if seconds is None and value.strip():
        with pytest.raises(DilstoreError, match="must be a number of seconds above 0"):
            read_timeout()
    else:
        assert read_timeout() == seconds


def test_the_read_timeout_leaves_client_options_the_caller_gave_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """DILSTORE_READ_TIMEOUT sets the wait of an http(s) store only where --storage-options give no client options:
    theirs are kept, not replaced (mut59 M4: the check could go and no test noticed)."""
    monkeypatch.setenv("DILSTORE_READ_TIMEOUT", "30")
    given = {"client_kwargs": {"trust_env": True}}
    assert StoreLocation.parse("http://127.0.0.1:1/store", given).storage_options == given
    timed = StoreLocation.parse("http://127.0.0.1:1/store").storage_options["client_kwargs"]["timeout"]
    assert (timed.sock_read, timed.sock_connect, timed.total) == (30.0, 30.0, 300.0)


@pytest.mark.parametrize("path", ["", "  ", "\t"])
def test_a_blank_store_path_is_refused_as_empty(path: str) -> None:
    """A path of spaces read as a folder of that name (mut59 M5)."""
    with pytest.raises(DilstoreError, match="^the store path is empty$"):
        StoreLocation.parse(path)


def test_a_store_url_with_a_trailing_slash_reads_like_the_one_without(served_root: Path) -> None:
    """The root of `http://host/store/` is `http://host/store`: its files are not asked for at `store//...`
    (mut59 M6)."""
    with serve_directory(served_root, listings=False) as server:
        store = open_store(f"{server.url}/fp16/")
        assert store.location.root == f"{server.url}/fp16"
        assert_same_passages(store.fetch(IDS[:3]), open_store(served_root / "fp16").fetch(IDS[:3]))


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (just bound and released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_urls_without_a_store_give_one_line_errors(server: HttpServer, capsys) -> None:
    cases = [  # (URL, message, verify's exit status: 1 reports a problem, 2 a usage error)
        (f"{server.url}/nothing", "no store at", 1),
        (f"{server.url}/not-a-store", "no store at", 1),  # a folder with no store was "never finalized"
        (f"http://127.0.0.1:{_closed_port()}/store", "cannot reach store", 1),
        (f"ftp://127.0.0.1:{_closed_port()}/store", "cannot reach store ftp://", 2),  # was a bare "Connection refused"
        ("s3-nowhere://bucket/store", "cannot open store s3-nowhere://bucket/store: Protocol not known", 2),
    ]
    for url, message, verify_status in cases:
        with pytest.raises(DilstoreError, match=message):
            open_store(url)
        assert main(["info", url]) == 2
        err = capsys.readouterr().err
        assert err.startswith("dilstore info: error: ") and message in err and len(err.splitlines()) == 1
        assert main(["verify", url]) == verify_status
        assert message in "".join(capsys.readouterr())


class _Refusing(SimpleHTTPRequestHandler):
    """A private bucket, a wrong password, a load balancer whose backend is down: every request refused."""

    def do_GET(self) -> None:
        self.send_error(403)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def test_a_server_that_refuses_every_request_is_one_line_naming_the_store_without_its_password(capsys) -> None:
    """A 403 (or 401, 502) for the manifest was a traceback from aiohttp, exit 1; a password in the URL was printed
    by every message, and by serve's /stores and error bodies (remote40 H2, M1)."""
    with BackloggedServer(("127.0.0.1", 0), _Refusing) as refusing:
        threading.Thread(target=refusing.serve_forever, args=(0.05,), daemon=True).start()
        try:
            url = f"http://alice:s3cr3t@127.0.0.1:{refusing.server_address[1]}/store"
            assert main(["info", url]) == 2
            err = capsys.readouterr().err
            assert err.startswith("dilstore info: error: cannot reach store http://alice:***@127.0.0.1:"), err
            assert "403" in err and "s3cr3t" not in err and len(err.splitlines()) == 1, err
            assert main(["verify", url]) == 1  # a problem found, as for a host that cannot be reached
            said = "".join(capsys.readouterr())
            assert "cannot reach store http://alice:***@" in said and "s3cr3t" not in said and "Traceback" not in said
        finally:
            refusing.shutdown()


def test_a_url_with_a_query_string_is_refused_without_echoing_it(capsys) -> None:
    """Each file's path went after the query ("no store at URL"), and the query, an access token, was printed
    (remote40 M4)."""
    assert main(["info", "https://127.0.0.1:1/store?sig=SECRET"]) == 2
    err = capsys.readouterr().err
    assert "query string or fragment are not supported (https://127.0.0.1:1/store?***)" in err and "SECRET" not in err


def test_a_url_with_a_fragment_is_refused_as_one_with_a_query_string() -> None:
    """Each file's path went after the fragment, which a client never sends: every file read as the store's folder
    (mut59 M7: the fragment's half of the check could go and no test noticed)."""
    with pytest.raises(DilstoreError, match=r"query string or fragment are not supported \(http://127.0.0.1:1/st#v2\)"):
        StoreLocation.parse("http://127.0.0.1:1/st#v2")


def test_only_a_remote_store_s_unexpected_errors_are_taken_for_a_store_out_of_reach(tmp_path: Path) -> None:
    """An error that is no OSError is a remote backend's refusal (aiohttp's 403) but a bug on the local filesystem,
    which raises OSError for what it cannot reach: it goes up as it is, not as "cannot reach store" (mut59 M8)."""

    def broken(path: str) -> bool:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        StoreLocation.parse(tmp_path)._reach(broken, "")
    with pytest.raises(DilstoreError, match="^cannot reach store memory://st: ValueError: a bug"):
        StoreLocation.parse("memory://st")._reach(broken, "")


@pytest.mark.parametrize("name", ["fp16", "zstd"])
def test_a_server_that_ignores_byte_ranges_is_a_clear_error(served_root: Path, name: str) -> None:
    """Python's own http.server sends whole files for ranged requests: the reader says so instead of misreading
    (a compressed store, read through zarr-python, failed with its checksum ValueError, a traceback)."""

    class WholeFiles(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            """Silent."""

    server = BackloggedServer(("127.0.0.1", 0), partial(WholeFiles, directory=str(served_root)))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)  # polls: shutdown waits one
    thread.start()
    try:
        with pytest.raises(DilstoreError, match="server does not answer byte ranges") as raised:
            open_store(f"http://127.0.0.1:{server.server_address[1]}/{name}").fetch(IDS[:3])
        assert "shorter" not in str(raised.value)  # it got more bytes than it asked for, not fewer
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_threads_share_one_store_over_http_while_shards_are_evicted(served_root: Path,
                                                                     fetch_server: HttpServer) -> None:  # fmt: skip
    server = fetch_server
    expected = {passage.id: passage for passage in open_store(served_root / "int8").fetch(IDS)}
    store = open_store(f"{server.url}/int8", max_open_shards=1)  # threads keep reopening shards
    batches = [IDS[start::8] for start in range(8)] * 2
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(store.fetch, batches))
    for ids, passages in zip(batches, results, strict=True):
        assert_same_passages(passages, [expected[passage_id] for passage_id in ids])
    assert len(store.manifest.shards) > 1 and len(store._shards) <= 1, "the open shards stay within the bound"


def test_an_appended_store_with_replaced_rows_reads_over_http_like_the_local_path(tmp_path: Path) -> None:
    from dilstore.storage.append import commit_append
    from tests.fixtures.store_fixtures import fingerprint_for
    from tests.storage.test_store_append import GENERATION, records, write_append

    store = build_store(tmp_path / "appended", [records(["a", "b", "c"])])
    write_append(store, [records(["b", "d"], seed=7)])
    commit_append(store, GENERATION, fingerprint_for(), replace=True)
    with serve_directory(tmp_path, listings=False) as server:
        url = f"{server.url}/appended"
        remote = open_store(url)
        assert_same_passages(remote.fetch(["a", "b", "c", "d"]), open_store(store).fetch(["a", "b", "c", "d"]))
        assert remote.superseded().rows.tolist() == open_store(store).superseded().rows.tolist() == [1]
        info, local = store_info(url), store_info(store)
        assert {key: info[key] for key in ("passages", "tokens", "shards", "superseded", "bytes_on_disk")} == \
               {key: local[key] for key in ("passages", "tokens", "shards", "superseded", "bytes_on_disk")}  # fmt: skip
        report = verify_store(url)
    assert report.ok, report.problems
    assert report.files_checked == verify_store(store).files_checked


def test_secrets_of_store_urls_are_hidden_in_every_part_and_only_http_has_a_query(tmp_path: Path) -> None:
    """A chained URL printed its password, and a '?' or '#' in a local or S3 key was refused as a query
    (review40b M1, M2); any message naming a store file by its full URL is scrubbed (H1)."""
    from dilstore.storage.location import StoreLocation, redacted
    from dilstore.storage.secrets import scrubbed

    assert redacted("simplecache::https://u:pw1@h/store") == "simplecache::https://u:***@h/store"
    assert redacted("=http://u:pw1@h/store") == "=http://u:***@h/store"  # a serve argument without a name
    assert redacted("s3://bucket/run?1") == "s3://bucket/run?1" and redacted("https://h/s?t=1") == "https://h/s?***"
    store = tmp_path / "s#1"
    store.mkdir()
    assert StoreLocation.parse(f"file://{store}").url == f"file://{store}"
    StoreLocation.parse("simplecache::http://u:Pw-7x@127.0.0.1:1/store")
    assert scrubbed("cannot open http://u:Pw-7x@127.0.0.1:1/store/shards/x") == (
        "cannot open http://u:***@127.0.0.1:1/store/shards/x")


@pytest.mark.parametrize("chain", ["simplecache::", "filecache::", "blockcache::simplecache::"])
def test_the_query_of_an_http_url_is_hidden_behind_a_cache_prefix_too(chain: str) -> None:
    """A signed URL's query (a token) in the http(s) part of a chained URL is hidden as in a plain one, in
    `redacted` and in the refusal of a query string that names the store."""
    from dilstore.storage.location import StoreLocation, redacted

    assert redacted(f"{chain}https://h/store?sig=S3CRET") == f"{chain}https://h/store?***"
    assert redacted(f"{chain}s3://bucket/run?1") == f"{chain}s3://bucket/run?1"
    with pytest.raises(DilstoreError) as raised:
        StoreLocation.parse(f"{chain}https://127.0.0.1:1/store?sig=S3CRET")
    assert f"({chain}https://127.0.0.1:1/store?***)" in str(raised.value) and "S3CRET" not in str(raised.value)


def recorded_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The relative paths every StoreLocation.read_bytes is asked for from now on, in order (it still reads them)."""
    from dilstore.storage.location import StoreLocation

    reads: list[str] = []
    real = StoreLocation.read_bytes

    def read_bytes(self: StoreLocation, relative: str, at_most: int | None = None) -> bytes:
        reads.append(relative)
        return real(self, relative, at_most)

    monkeypatch.setattr(StoreLocation, "read_bytes", read_bytes)
    return reads


def test_a_store_at_a_url_reads_its_manifest_again_at_most_every_so_often(
    served_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/health reads a remote store's manifest again (review40b H2: a probe every second sent two requests a store,
    on the event loop): one GET, at most every BUILD_CHECK_SECONDS."""
    from dilstore.storage import reader

    reads = recorded_reads(monkeypatch)
    with serve_directory(served_root) as files, open_store(f"{files.url}/fp16") as store:
        reads.clear()
        store.check_unchanged()
        store.check_unchanged()
        assert reads == ["manifest.json"]
        monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 0.0)
        store.check_unchanged()
        assert reads == ["manifest.json"] * 2


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_manifest_a_server_failed_once_is_read_not_taken_for_no_store(
    served_root: Path, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    """fsspec's `exists` reads any error status as absent; the manifest read next to tell a failing server from no
    store then worked, and the store was reported as `no store at URL` (exit 2) after one 503 (remote52 F3)."""
    from dilstore.storage.location import StoreLocation

    real = StoreLocation.exists
    with serve_directory(served_root) as files:
        def exists(location: StoreLocation, relative: str = "") -> bool:
            try:
                return real(location, relative)
            finally:
                files.faults.clear()  # one hiccup: the server answers the next request

        monkeypatch.setattr(StoreLocation, "exists", exists)
        files.faults["manifest.json"] = status
        with open_store(f"{files.url}/fp16") as store:
            assert_same_passages(store.fetch(IDS[:3]), open_store(served_root / "fp16").fetch(IDS[:3]))


def test_a_store_at_a_url_found_rebuilt_stays_so_until_its_manifest_is_read_again(
    served_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check within BUILD_CHECK_SECONDS of one that found another build passed, reading nothing: a server took
    that as the files back as opened and served the other build's bytes (remote52 F1). It fails as the last read
    did, also when a read due cannot read the manifest (gone while the store is rebuilt again, a server's hiccup:
    that proves nothing); a manifest read again that names the opened build again (the old one put back) passes."""
    import dataclasses

    from dilstore.storage import reader
    from dilstore.storage.format import StoreChangedError
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest, write_manifest

    site = shutil.copytree(served_root / "fp16", tmp_path / "site" / "fp16")
    manifest = read_manifest(StoreLocation.parse(site))
    with serve_directory(site.parent) as files, open_store(f"{files.url}/fp16") as store:
        monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 0.0)
        write_manifest(site, dataclasses.replace(manifest, generation="another-build"))
        with pytest.raises(StoreChangedError, match="another-build"):
            store.check_unchanged()
        monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 3600.0)
        with pytest.raises(StoreChangedError, match="another-build"):
            store.check_unchanged()  # no read: the last one's finding
        monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 0.0)
        files.faults["manifest.json"] = 404
        with pytest.raises(StoreChangedError, match="another-build"):
            store.check_unchanged()  # read again, and nothing read
        files.faults.clear()
        write_manifest(site, manifest)  # the opened build is back
        store.check_unchanged()


def test_a_long_running_reader_of_a_store_at_a_url_finds_it_rebuilt_on_a_lookup(
    served_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ask` from stdin (check_files on) read a store at a URL rebuilt under it at the old build's offsets and exited
    0 (remote52 F7): a lookup reads the manifest again, at most every BUILD_CHECK_SECONDS, and names the rebuild. A
    one-off reader (check_files off) sends no request for it."""
    import dataclasses

    from dilstore.storage import reader
    from dilstore.storage.format import StoreChangedError
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest, write_manifest

    site = shutil.copytree(served_root / "fp16", tmp_path / "site" / "fp16")
    manifest = read_manifest(StoreLocation.parse(site))
    reads = recorded_reads(monkeypatch)
    with serve_directory(site.parent) as files, open_store(f"{files.url}/fp16") as store:
        expected = store.fetch(IDS[:2])
        reads.clear()
        store.fetch(IDS[:2])
        assert "manifest.json" not in reads  # check_files off
        store.check_files = True
        monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 3600.0)
        assert_same_passages(store.fetch(IDS[:2]), expected)
        assert_same_passages(store.fetch(IDS[:2]), expected)
        assert reads.count("manifest.json") == 1  # one read, then none within BUILD_CHECK_SECONDS
        write_manifest(site, dataclasses.replace(manifest, generation="another-build"))
        monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 0.0)
        with pytest.raises(StoreChangedError, match="another-build"):
            store.fetch(IDS[:2])


def _served_shards(seed: int = 0) -> list[list[StoredPassage]]:
    """The passages of `served_root`'s stores (another `seed`: passages of other lengths)."""
    shards = random_shards([300] * SHARDS, state_shape=(16,), seed=seed, max_words=60)
    return [[replace(record, vector=np.full(16, index, dtype=np.float32)) for index, record in enumerate(shard)]
            for shard in shards]  # fmt: skip


@pytest.fixture(scope="module")
def rebuilt_fp16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fp16 store rebuilt: each shard's rows in reverse order, so every file keeps its old size (read only)."""
    shards = [shard[::-1] for shard in _served_shards()]
    return build_store(tmp_path_factory.mktemp("rebuilt") / "fp16", shards, encoding="fp16")


@pytest.fixture(scope="module")
def rebuilt_zstd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zstd store rebuilt: its shard's rows in reverse order (read only)."""
    return build_store(tmp_path_factory.mktemp("rebuilt") / "zstd", [_served_shards()[0][::-1]], encoding="fp16",
                       compressor="zstd")  # fmt: skip


def _copy_over(build: Path, site: Path, *, manifest: bool, later: float = 0.0) -> None:
    """Copy every file of `build` over the same name under `site`, as `cp -r` onto a web server's folder does (the
    manifest too, or not yet: a copy still under way), each dated `later` seconds after its old copy."""
    for source in sorted(build.rglob("*")):
        target = site / source.relative_to(build)
        if source.is_dir() or (source.name == "manifest.json" and not manifest):
            continue
        before = target.stat().st_mtime if target.exists() else time.time()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        os.utime(target, (before + later, before + later))


@pytest.mark.parametrize("validators", [("ETag", "Last-Modified"), ("ETag",), ("Last-Modified",)],
                         ids=["etag-and-date", "etag", "date"])  # fmt: skip
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest-copied", "manifest-not-yet"])
def test_a_store_rebuilt_at_its_url_with_files_of_the_same_sizes_is_found_at_the_next_read(
    served_root: Path, rebuilt_fp16: Path, tmp_path: Path, validators: tuple[str, ...], manifest: bool
) -> None:
    """A store rebuilt in place and copied over its files at the same URL was read, by a Store opened before, with
    the old build's offsets into the new files until the next manifest check (up to BUILD_CHECK_SECONDS later, or
    never for a one-off reader): other passages' texts and states, with nothing said (stale54 F1). Each answer's
    ETag (or Last-Modified) is now compared with the one the shard read when it opened: the next fetch raises
    StoreChangedError, with no request more, whether or not the new manifest is there yet; a Store opened again
    reads the new build. Here every file of the new build has its old size (each shard's rows in reverse order),
    so no size tells. A Last-Modified has whole seconds: the copies are dated 2 s after the old ones."""
    from dilstore.storage.format import StoreChangedError

    site = shutil.copytree(served_root / "fp16", tmp_path / "site" / "fp16")
    build = rebuilt_fp16
    arrays = [path.relative_to(build) for path in build.rglob("c/*") if path.is_file()]
    assert arrays and all((site / path).stat().st_size == (build / path).stat().st_size for path in arrays)
    assert any((site / path).read_bytes() != (build / path).read_bytes() for path in arrays)
    wanted = IDS[::25]  # both shards
    with serve_directory(site.parent, validators=validators) as files:
        store = open_store(f"{files.url}/fp16")
        before = store.fetch(wanted)
        files.counter.reset()
        store.fetch(wanted)
        requests = files.requests
        _copy_over(build, site, manifest=manifest, later=2.0)
        files.counter.reset()
        with pytest.raises(StoreChangedError, match="open it again"):
            store.fetch(wanted)
        assert files.requests <= requests + 2  # the same reads; once found, the manifest (HEAD, GET) to name it
        if manifest:  # the new build, whole, opened again: the same passages, read from their new rows
            with open_store(f"{files.url}/fp16") as again:
                assert_same_passages(again.fetch(wanted), before)


@pytest.mark.parametrize("validators", [("ETag", "Last-Modified"), ("Last-Modified",), ()],
                         ids=["etag-and-date", "date", "none"])  # fmt: skip
def test_a_compressed_store_rebuilt_at_its_url_is_found_at_the_next_read(
    served_root: Path, rebuilt_zstd: Path, tmp_path: Path, validators: tuple[str, ...]
) -> None:
    """(left55b F3) A compressed store (read through zarr-python, whose FsspecStore keeps only an answer's body) that
    was rebuilt and copied over at its URL was read by a Store opened before with the old build's chunk offsets
    into the new files, until the manifest check: other passages, a decode error, or nothing said. Each answer's
    ETag, else Last-Modified, and size are now compared with the first answer's for the same file, as on the ranged
    path: the next fetch raises StoreChangedError, before the new manifest is there; a Store opened again reads the
    new build. Without validators only a file of another size is found (every compressed file here has one: the
    rows are reversed, so each chunk holds other passages and compresses to another length)."""
    from dilstore.storage.format import StoreChangedError

    site = shutil.copytree(served_root / "zstd", tmp_path / "site" / "zstd")
    build = rebuilt_zstd
    changed = [path.relative_to(build) for path in build.rglob("c/*")
               if path.is_file() and (site / path.relative_to(build)).read_bytes() != path.read_bytes()]  # fmt: skip
    assert changed
    if not validators:
        assert any((site / path).stat().st_size != (build / path).stat().st_size for path in changed)
    wanted = [f"s0/p{row}" for row in range(0, 300, 37)]
    with serve_directory(site.parent, validators=validators) as files:
        store = open_store(f"{files.url}/zstd")
        before = store.fetch(wanted)
        _copy_over(build, site, manifest=False, later=2.0)
        with pytest.raises(StoreChangedError, match="was replaced after this reader opened it .*open it again"):
            store.fetch(wanted)
        _copy_over(build, site, manifest=True, later=2.0)
        with open_store(f"{files.url}/zstd") as again:
            assert_same_passages(again.fetch(wanted), before)


def test_every_byte_request_zarr_sends_reads_through_the_check_as_fsspec_store_reads_it(tmp_path: Path) -> None:
    """(mut55) The checked store (storage/zarr_reads.py) sends zarr-python's GETs itself: a whole file, a range, an
    empty range (no request), an offset and a suffix each read the bytes FsspecStore reads, with the headers given
    in storage_options (here a password); and without validators a file read whole and replaced by one of another
    size is found, its size taken from the body when no Content-Range says it."""
    import base64

    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    from zarr.storage import FsspecStore

    from dilstore.storage.format import StoreChangedError
    from dilstore.storage.zarr_reads import RequiredChunksStore

    data = bytes(range(100))
    (tmp_path / "a" / "c").mkdir(parents=True)
    (tmp_path / "a" / "c" / "0").write_bytes(data)
    prototype = default_buffer_prototype()
    secret = {"Authorization": "Basic " + base64.b64encode(b"reader:S3CRET").decode()}
    requests = [(None, data), (RangeByteRequest(10, 20), data[10:20]), (RangeByteRequest(7, 7), b""),
                (OffsetByteRequest(90), data[90:]), (SuffixByteRequest(5), data[-5:])]  # fmt: skip
    with serve_directory(tmp_path, credentials="reader:S3CRET", validators=()) as files:
        inner = FsspecStore.from_url(f"{files.url}/a", storage_options={"headers": secret}, read_only=True)
        checked = RequiredChunksStore(inner, f"{files.url}/a", local=False)
        for request, expected in requests:
            plain = sync(inner.get("c/0", prototype, request))
            assert plain is not None and plain.to_bytes() == expected, request
            read = sync(checked.get("c/0", prototype, request))
            assert read is not None and read.to_bytes() == expected, request
        (tmp_path / "a" / "c" / "0").write_bytes(data + b"more")
        with pytest.raises(StoreChangedError, match="100 bytes when opened, now 104"):
            sync(checked.get("c/0", prototype, None))


def test_a_server_without_validators_reads_and_finds_a_file_of_another_size_replaced(
    served_root: Path, tmp_path: Path
) -> None:
    """A server that sends neither ETag nor Last-Modified reads as before; a file replaced by one of another size
    is still found at the next read, by the size in each answer's Content-Range (stale54 F1). One of the same size
    is found only by the manifest check (README: `ask`)."""
    from dilstore.storage.format import StoreChangedError

    site = shutil.copytree(served_root / "fp16", tmp_path / "site" / "fp16")
    build = build_store(tmp_path / "rebuilt", _served_shards(seed=1), encoding="fp16")
    with serve_directory(site.parent, validators=()) as files:
        store = open_store(f"{files.url}/fp16")
        with open_store(served_root / "fp16") as local:
            assert_same_passages(store.fetch(IDS), local.fetch(IDS))
        _copy_over(build, site, manifest=False)
        with pytest.raises(StoreChangedError, match="bytes when opened, now"):
            store.fetch(IDS)


def test_what_tells_a_file_replaced_is_its_etag_else_its_date_and_its_size() -> None:
    """(stale54 F1) The ETag decides where both answers have one (a proxy's `W/` changes no byte, and a date that
    differs beside the same ETag is no change); without it the Last-Modified; the size in either case; a header
    one answer lacks says nothing."""
    from dilstore.storage.ranged import FileVersion

    opened = FileVersion('"a"', "Mon, 30 Nov 2026 10:00:00 GMT", 100)
    assert FileVersion('W/"a"', "Tue, 01 Dec 2026 10:00:00 GMT", 100).change_from(opened) is None
    assert "ETag" in (FileVersion('"b"', opened.modified, 100).change_from(opened) or "")
    assert "Last-Modified" in (FileVersion(None, "Tue, 01 Dec 2026 10:00:00 GMT", 100).change_from(opened) or "")
    assert "bytes when opened" in (FileVersion('"a"', opened.modified, 101).change_from(opened) or "")
    assert FileVersion().change_from(opened) is None


def test_verify_of_a_store_behind_a_password_hides_it_in_each_problem(
    served_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A part zarr-python could not read (its id index answered 404) was a problem quoting zarr's error, whose
    repr of its store held the URL with its password: `verify` printed it, text and --json (remote52 F5)."""
    with serve_directory(served_root, credentials="reader:S3CRET") as files:
        url = files.url.replace("http://", "http://reader:S3CRET@") + "/fp16"
        files.faults["/fp16/index/"] = 404
        assert main(["verify", "--no-progress", url]) == 1
        assert main(["verify", "--json", url]) == 1
        report = verify_store(url)
    printed = capsys.readouterr()
    assert "id index: cannot be read" in printed.out and "reader:***@" in printed.out
    assert "S3CRET" not in printed.out + printed.err and not [line for line in report.problems if "S3CRET" in line]


@pytest.mark.parametrize("name", ["fp16", "zstd"])
def test_a_store_behind_a_password_reads_on_both_read_paths(served_root: Path, name: str) -> None:
    """The password was hidden from the location's URL, and zarr-python's store (every shard's metadata, a compressed
    store's data) was opened with the hidden one: 401 on every read of every remote store with a password."""
    wanted = IDS[:5] if name == "fp16" else [f"s0/p{row}" for row in range(0, 300, 60)]  # zstd: one shard
    with serve_directory(served_root, credentials="reader:S3CRET") as files:
        url = files.url.replace("http://", "http://reader:S3CRET@") + f"/{name}"
        with open_store(url) as remote:
            assert remote.url == url.replace("S3CRET", "***")
            assert_same_passages(remote.fetch(wanted), open_store(served_root / name).fetch(wanted))
        with pytest.raises(DilstoreError):  # the server does check the password
            open_store(url.replace("S3CRET", "wrong")).fetch(wanted)


@contextmanager
def dripping_server() -> Iterator[str]:
    """A server on 127.0.0.1 that answers every request with headers at once and then one byte of its 60-byte body
    every 0.2 s (12 s in all): each byte resets a wait between reads. Its URL; stopped after."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def drip(connection: socket.socket) -> None:
        with connection:
            head = connection.recv(65536).startswith(b"HEAD")
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\nConnection: close\r\n\r\n")
            while not head and not stop.wait(0.2):
                try:
                    connection.sendall(b" ")
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=drip, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_a_server_that_drips_its_answer_is_cut_off_by_the_whole_request_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """DILSTORE_READ_TIMEOUT bounded only the gap between two reads: a byte every few seconds held a command, or a
    served store's worker, for good (hostile47 F6). A whole request now has at most ten waits (or 5 minutes)."""
    from dilstore.storage import location

    monkeypatch.setenv("DILSTORE_READ_TIMEOUT", "0.3")  # ten waits: 3 s; the drip's gap is 0.2 s
    monkeypatch.setattr(location, "_TOTAL_SECONDS", 0.0)
    started = time.monotonic()
    with dripping_server() as url, pytest.raises(DilstoreError, match="Timeout"):
        open_store(f"{url}/store")
    assert time.monotonic() - started < 10


def test_an_object_store_s_manifest_longer_than_the_limit_is_refused_as_too_long(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object store's manifest is read by a ranged read of one byte more than the limit: a longer one is refused
    as too long, not as the broken JSON of its first bytes, and one of the limit's length is read whole."""
    import fsspec

    from dilstore.storage import manifest
    from dilstore.storage.location import StoreLocation

    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 100)
    memory = fsspec.filesystem("memory")
    memory.pipe("/long-manifest-store/manifest.json", b"{" + b" " * 150 + b"}")
    memory.pipe("/limit-manifest-store/manifest.json", b"{" + b" " * 98 + b"}")
    try:
        with pytest.raises(StoreFormatError, match=r"manifest.json is longer than 100 bytes, more than any store's"):
            manifest.read_manifest(StoreLocation.parse("memory://long-manifest-store"))
        with pytest.raises(StoreFormatError) as raised:  # 100 bytes: read whole, and refused for what they say
            manifest.read_manifest(StoreLocation.parse("memory://limit-manifest-store"))
        assert "longer than" not in str(raised.value)
    finally:
        memory.rm(["/long-manifest-store", "/limit-manifest-store"], recursive=True)


def test_a_manifest_longer_than_any_store_s_is_refused_unread(
    served_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3 GB file in the manifest's place took 6.3 GB of memory to be refused as not JSON, and an endless HTTP body
    grew until the memory ran out, which read as "try again" (hostile47 F7). At most MAX_MANIFEST_BYTES are read."""
    from dilstore.storage import manifest
    from dilstore.storage.read_failures import read_failure

    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 100)  # the stores' manifests are kilobytes
    with pytest.raises(StoreFormatError, match=r"manifest.json is longer than 100 bytes, more than any store's"):
        open_store(served_root / "fp16")
    with serve_directory(served_root) as server, pytest.raises(StoreFormatError, match=r"is longer than 100 bytes"):
        open_store(f"{server.url}/fp16")  # read as a stream: an endless body is not read whole
    assert isinstance(read_failure("a file", MemoryError()), StoreFormatError)


@pytest.mark.parametrize("name", ["fp16", "zstd"])
def test_a_store_at_a_url_inherited_across_fork_reads_in_the_child(served_root: Path, name: str) -> None:
    """The Store's docstring says a process may inherit one across fork; one at a URL, opened and read before the
    fork, refused every read in the child: a StoreReadError "RuntimeError: This class is not fork-safe; try again"
    (fsspec's async filesystems are bound to the process that made them), and trying again never helped
    (api54 F5). The child reads what the parent reads."""
    import os
    import pickle

    wanted = [passage_id for passage_id in IDS if passage_id.startswith("s0/")][:20]
    with serve_directory(served_root, listings=False) as server:
        store = open_store(f"{server.url}/{name}")
        expected = [(passage.id, passage.text, passage.states.tolist()) for passage in store.fetch(wanted[:3])]
        expected = [(passage.id, passage.text, passage.states.tolist()) for passage in store.fetch(wanted)]
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the child: one answer down the pipe, then out without pytest's teardown
            gc.disable()  # a collection would touch, and so copy, every object of the test process's heap
            try:
                got: object = [(passage.id, passage.text, passage.states.tolist()) for passage in store.fetch(wanted)]
            except Exception as error:  # noqa: BLE001 - the parent shows it
                got = f"{type(error).__name__}: {error}"
            with os.fdopen(write, "wb") as out:
                pickle.dump(got, out)
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as answer:
            got = pickle.load(answer)  # noqa: S301 - the test's own child wrote it
        os.waitpid(child, 0)
    assert got == expected
