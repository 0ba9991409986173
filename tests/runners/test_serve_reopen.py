"""`dilstore serve` opens a store again once it changed on disk, with no restart: an append is served, a store
rebuilt or compacted in its place is served as it is now, a store of another model put in its place is
unavailable (and loads no model at every check) until a store the model made is back, and an append that cannot
be opened yet leaves the old copy served. The copy a reopened one replaces is closed once no batch reads it.

The stores are tiny EARL stores opened as the command opens them (`open_served_store`), so no JVM starts.
"""

from __future__ import annotations

import functools
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dilstore.reader.modeling.earl import EarlRanker
from dilstore.reader.serving.rerank import open_reranker
from dilstore.runners import serve_app, serve_reopen
from dilstore.runners.cmd_serve import open_served_store
from dilstore.runners.serve_reopen import Reopener
from dilstore.storage.append import commit_append, first_free_shard
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import append_dir
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.writer import write_shard
from tests.reader.serving.test_rerank import DOCUMENTS, earl_records, write_earl_store
from tests.runners.test_serve import WAIT, metric, running, tiny  # noqa: F401 (tiny: the module's stores, a fixture)

QUERY = "Who rings the harbour bell?"
IDS = ["kili", "tram", "cafe", "curie"]
NEW = {"bell": "The harbour master rings the bell at noon every day."}
GENERATION = "0123456789abcdef"


@pytest.fixture
def quick_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server checks its stores every 50 ms instead of every few seconds."""
    monkeypatch.setattr(serve_app, "WATCH_SECONDS", 0.05)


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    """`condition()`'s first true value, asked every 50 ms for at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not (value := condition()):
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)
    return value


def append_documents(store: Path, ranker_dir: Path, documents: dict[str, str]) -> None:
    """Commit `documents`, encoded by the ranker as the store's kind, as one append (as `precompute --append`)."""
    manifest = read_manifest(StoreLocation.parse(store))
    folder = store / append_dir(GENERATION)
    folder.mkdir(parents=True)
    records = earl_records(EarlRanker.from_pretrained(ranker_dir), manifest.kind, documents)
    write_shard(folder, first_free_shard(manifest), records, kind=manifest.kind, encoding=manifest.encoding,
                durable=False, generation=GENERATION)  # fmt: skip
    commit_append(store, GENERATION, manifest.fingerprint)


def passages(client: httpx.Client) -> int:
    return client.get("/stores").json()["stores"][0]["info"]["passages"]


def scores(response: httpx.Response) -> dict[str, float]:
    assert response.status_code == 200, response.text
    return {result["doc_id"]: result["score"] for result in response.json()["results"]}


@pytest.fixture
def served_copy(tiny: dict[str, Any], tmp_path: Path) -> Iterator[Path]:  # noqa: F811 (the fixture imported above)
    """A copy of the tiny S2 store, free to change under the server."""
    yield shutil.copytree(tiny["s2"], tmp_path / "s2")


@pytest.mark.usefixtures("quick_watch")
def test_an_append_is_served_without_a_restart_and_the_old_copy_is_closed(
    tiny: dict[str, Any], served_copy: Path, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """An append was never served: the server kept the store as it was opened until a restart."""
    store = open_served_store("s2", str(served_copy), tiny["ranker_dir"], None)
    first = store.service
    with caplog.at_level("INFO", logger="dilstore.serve"), running([store]) as (client, _):
        before = client.post("/rerank", json={"query": QUERY, "doc_ids": [*IDS, "bell"]})
        append_documents(served_copy, tiny["ranker_dir"], NEW)
        wait_for(lambda: passages(client) == len(DOCUMENTS) + 1, "the watch to open the appended store")
        after = client.post("/rerank", json={"query": QUERY, "doc_ids": [*IDS, "bell"]})
        health = client.get("/health")
    assert before.status_code == 422 and "bell" in before.json()["detail"]
    expected = open_reranker(served_copy, tiny["ranker_dir"]).rerank(QUERY, [*IDS, "bell"])
    assert scores(after) == pytest.approx(expected, rel=1e-6)
    assert health.status_code == 200
    assert store.service is not first
    assert store.service.reranker.model is first.reranker.model, "the fingerprint is unchanged: no second model"
    with pytest.raises(DilstoreError, match="is closed"):  # swapped out at the next batch, and closed there
        first.store.fetch(["kili"])
    opened = [record.getMessage() for record in caplog.records if "opened again" in record.getMessage()]
    assert len(opened) == 1 and re.fullmatch(
        re.escape(f"opened again: store 's2' (earl-s2, fp16, {len(DOCUMENTS) + 1} passages) from {served_copy}, "
                  f"model {tiny['ranker_dir']} (it held {len(DOCUMENTS)} passages; opened in ") + r"\d+\.\d\d s\)",
        opened[0])  # fmt: skip


def test_a_store_rebuilt_in_its_place_is_served_as_it_is_now(
    tiny: dict[str, Any], served_copy: Path, tmp_path: Path  # noqa: F811
) -> None:
    """`compact` and `precompute --overwrite` put another store in the folder: it was unavailable until a restart.
    The first request to meet the new files waits while the store is opened again, and is answered from it: a
    store's clients see no error while it is compacted."""
    store = open_served_store("s2", str(served_copy), tiny["ranker_dir"], None)
    first = store.service
    with running([store]) as (client, _):
        assert client.post("/rerank", json={"query": QUERY, "doc_ids": IDS}).json()["encoding"] == "fp16"
        served_copy.rename(tmp_path / "old")  # as a compaction swaps a store in: another folder in its place
        shutil.copytree(tiny["s1"], served_copy)  # the same ranker's S1 store, in fp32
        answered = client.post("/rerank", json={"query": QUERY, "doc_ids": IDS})  # before any check found it
        health = client.get("/health")
        listed = client.get("/stores").json()["stores"][0]
        text = client.get("/metrics").text
    assert health.status_code == 200, health.text
    assert answered.json()["encoding"] == "fp32" and listed["info"]["kind"] == "earl-s1"
    assert metric(text, "dilstore_errors_total", endpoint="/rerank", kind="unavailable") == 0
    assert store.service.reranker.model is not first.reranker.model, "another fingerprint: its model loaded anew"
    assert scores(answered) == pytest.approx(open_reranker(tiny["s1"], tiny["ranker_dir"]).rerank(QUERY, IDS), rel=1e-6)


def test_a_store_of_another_model_in_its_place_is_unavailable_until_the_right_one_is_back(
    tiny: dict[str, Any], served_copy: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """The reopen of a store the served model did not make fails once, names why, and is not tried again at every
    check (a model load each); a store the model made, put back, is served again."""
    other = write_earl_store(tmp_path / "other", EarlRanker.from_pretrained(tiny["other_ranker_dir"]), "earl-s2",
                             "fp16")  # fmt: skip
    store = open_served_store("s2", str(served_copy), tiny["ranker_dir"], None)
    with caplog.at_level("INFO", logger="dilstore.serve"), running([store]) as (client, _):
        served_copy.rename(tmp_path / "old")
        shutil.copytree(other, served_copy)
        unhealthy = [client.get("/health") for _ in range(3)]
        refused = client.post("/rerank", json={"query": QUERY, "doc_ids": IDS})
        shutil.rmtree(served_copy)
        shutil.copytree(tiny["s2"], served_copy)
        healthy = client.get("/health")
        answered = client.post("/rerank", json={"query": QUERY, "doc_ids": IDS})
    assert [response.status_code for response in unhealthy] == [503] * 3
    problem = unhealthy[0].json()["problems"]["s2"]
    assert "was replaced by another file after" in problem  # the served copy's files: it cannot serve on
    assert "; opening it again failed: " in problem and "was made by a different model" in problem
    assert refused.status_code == 503 and refused.json()["detail"] == (
        f"store 's2' is unavailable: {problem}; it is opened again once its files change (a new build, its BM25 "
        "index rebuilt)")  # fmt: skip
    failed = [record for record in caplog.records if "different model" in record.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "ERROR", "tried once for that store, not at every check"
    assert healthy.status_code == 200, healthy.text
    assert scores(answered) == pytest.approx(open_reranker(tiny["s2"], tiny["ranker_dir"]).rerank(QUERY, IDS), rel=1e-6)


def test_an_append_that_cannot_be_opened_yet_leaves_the_old_copy_served(
    tiny: dict[str, Any], served_copy: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """A dilbert store appended to before `dilstore index` covers it fails to open (its index is behind): the old
    copy, whose files the append did not touch, is served meanwhile, with one warning; the index rebuilt (its
    folder changed), the store is opened again."""
    store = open_served_store("s2", str(served_copy), tiny["ranker_dir"], None)
    assert isinstance(store.reopener, Reopener)
    opens = store.reopener.open

    def index_behind(served: object) -> None:
        raise DilstoreError("the index is behind")

    monkeypatch.setattr(store.reopener, "open", index_behind)
    with caplog.at_level("INFO", logger="dilstore.serve"), running([store]) as (client, _):
        append_documents(served_copy, tiny["ranker_dir"], NEW)
        checks = [client.get("/health") for _ in range(3)]
        old = client.post("/rerank", json={"query": QUERY, "doc_ids": IDS})
        monkeypatch.setattr(store.reopener, "open", opens)
        (served_copy / "bm25").mkdir()  # the watched index folder changed: worth trying again
        client.get("/health")
        new = client.post("/rerank", json={"query": QUERY, "doc_ids": [*IDS, "bell"]})
    assert [response.status_code for response in checks] == [200] * 3
    assert scores(old).keys() == set(IDS)
    warned = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warned == ["store 's2' changed on disk but cannot be opened again: the index is behind; it is served as it "
                      "was opened"]  # fmt: skip
    assert scores(new).keys() == {*IDS, "bell"}


def test_a_store_at_a_url_is_reopened_at_most_every_retry_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store at a URL has no files to stamp (nor, serving no BM25, an index folder): only one found rebuilt is
    reopened, RETRY_SECONDS after the last try."""
    stamp = functools.partial(serve_reopen.files_stamp, "http://127.0.0.1:9/store", None)
    reopener = Reopener(open=lambda: None, stamp=stamp, opened=stamp())  # type: ignore[arg-type, return-value]
    assert not reopener.due(unavailable=True), "opened just now"
    assert not reopener.due(unavailable=False)
    monkeypatch.setattr(serve_reopen, "RETRY_SECONDS", 0.0)
    assert reopener.due(unavailable=True) and not reopener.due(unavailable=False)


def test_a_store_at_a_url_is_reopened_once_its_local_index_changes(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """(conc54 F3) A store at a URL had no stamp at all, its local `--index` folder included: after the store was
    rebuilt on its server, every reopen failed on the old build's index, and once the right index was put in the
    folder the server waited for the next doubled retry (up to 32 minutes), 503 all along; an index rebuilt for an
    append to the store on its server was never looked at."""
    clock = [1000.0]
    monkeypatch.setattr(serve_reopen.time, "monotonic", lambda: clock[0])
    index = tmp_path / "bm25"
    index.mkdir()
    (index / "segments_1").write_bytes(b"old build")
    stamp = functools.partial(serve_reopen.files_stamp, "http://127.0.0.1:9/store", index)
    reopener = Reopener(open=lambda served: None, stamp=stamp, opened=stamp(),  # type: ignore[arg-type, return-value]
                        tried_at=clock[0])
    clock[0] += serve_reopen.RETRY_SECONDS
    assert not reopener.due(unavailable=False) and reopener.due(unavailable=True), "found rebuilt on its server"
    for _ in range(4):  # each reopen failed on the old build's index
        reopener.gave_up(stamp())
    clock[0] += serve_reopen.RETRY_SECONDS
    assert not reopener.due(unavailable=True), "nothing changed here: the doubled wait holds"
    shutil.rmtree(index)
    index.mkdir()
    (index / "segments_2").write_bytes(b"the rebuilt store's index")
    assert reopener.due(unavailable=True), "the index for the rebuilt store is in place: opened at the next check"
    reopener.succeeded(stamp())
    assert not reopener.due(unavailable=False)
    (index / "segments_3").write_bytes(b"rebuilt for an append on the server")
    assert reopener.due(unavailable=False)
    earl = functools.partial(serve_reopen.files_stamp, "http://127.0.0.1:9/earl", None)  # no index: a rerank store
    unindexed = Reopener(open=lambda served: None, stamp=earl, opened=earl(), tried_at=clock[0])  # type: ignore
    assert not unindexed.due(unavailable=True), "opened just now"
    clock[0] += serve_reopen.RETRY_SECONDS
    assert unindexed.due(unavailable=True) and not unindexed.due(unavailable=False)


def test_a_failed_reopen_of_unchanged_files_waits_longer_after_each_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store copied into place file by file failed its reopen halfway, and its manifest (copied first) never
    changed again: it stayed unavailable for good. Unchanged files are tried again after a wait that doubles."""
    clock = [1000.0]
    monkeypatch.setattr(serve_reopen.time, "monotonic", lambda: clock[0])
    local = Reopener(open=lambda: None, stamp=lambda: ("manifest", 2), opened=("manifest", 1))  # type: ignore
    assert local.due(unavailable=False), "the files changed since the served copy was opened"
    waits = []
    longest = serve_reopen.RETRY_SECONDS * 2**8  # twice the longest wait expected: a retry never due fails, not hangs
    for _ in range(10):
        local.gave_up(("manifest", 2))
        started = clock[0]
        while not local.due(unavailable=True):
            clock[0] += 1.0
            assert clock[0] - started <= longest, f"failure {len(waits) + 1} was never tried again in {longest:g} s"
        waits.append(clock[0] - started)
    # README: "after 30 s, then 1, 2, 4 ... up to 32 minutes"; the waits were 1, 2, 4 ... 64 minutes (multi53 F3).
    assert waits == [serve_reopen.RETRY_SECONDS * 2**doubling for doubling in (0, 1, 2, 3, 4, 5, 6, 6, 6, 6)]
    assert max(waits) == 32 * 60
    local.gave_up(("manifest", 2))
    monkeypatch.setattr(local, "stamp", lambda: ("manifest", 3))
    assert local.due(unavailable=True), "files changed again: at once"


@pytest.mark.usefixtures("quick_watch")
def test_a_failed_check_is_logged_and_the_watch_goes_on(
    tiny: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """An unexpected error in one check must not end the watch: the stores would go unchecked from then on."""
    calls: list[int] = []

    def check_stores(self: serve_app.StoreRouter) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("a passing failure")

    monkeypatch.setattr(serve_app.StoreRouter, "check_stores", check_stores)
    store = open_served_store("s2", str(tiny["s2"]), tiny["ranker_dir"], None)
    with caplog.at_level("ERROR", logger="dilstore.serve"), running([store]):
        wait_for(lambda: len(calls) >= 3, "the watch to check again")
    assert [record.getMessage() for record in caplog.records] == ["checking the stores failed"]


def deleted_maps(folder: Path) -> list[str]:
    """This process's memory maps of files under `folder` that were deleted."""
    return [line for line in Path("/proc/self/maps").read_text().splitlines()
            if f"{folder}/" in line and line.endswith("(deleted)")]  # fmt: skip


@pytest.mark.usefixtures("quick_watch")
def test_an_idle_server_lets_the_replaced_copy_go_without_a_request(
    tiny: dict[str, Any], served_copy: Path, tmp_path: Path  # noqa: F811
) -> None:
    """After a compaction, an idle server kept the old copy (its maps of the deleted files, its model) until the next
    request, and even then until a full garbage collection ran (review47 F1, F2)."""
    store = open_served_store("s2", str(served_copy), tiny["ranker_dir"], None)
    first = store.service
    with running([store]) as (client, _):
        assert client.post("/rerank", json={"query": QUERY, "doc_ids": IDS}).status_code == 200  # maps the shards
        served_copy.rename(tmp_path / "old")
        shutil.copytree(tiny["s1"], tmp_path / "new").rename(served_copy)  # whole, as a compaction swaps it in
        shutil.rmtree(tmp_path / "old")  # as a compaction deletes the old build
        assert deleted_maps(tmp_path / "old"), "the old copy maps the files just deleted"
        wait_for(lambda: store.service is not first, "the swap, with no request sent")
        wait_for(lambda: not deleted_maps(tmp_path / "old"), "the old copy's maps to go")
        assert client.post("/rerank", json={"query": QUERY, "doc_ids": IDS}).json()["encoding"] == "fp32"


def test_a_store_moved_away_and_back_is_available_again(
    tiny: dict[str, Any], served_copy: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """A store moved away and back stayed unavailable until a restart, /health still saying its manifest was gone
    (review47 F3): its files are the ones it opened, which a check now finds."""
    store = open_served_store("s2", str(served_copy), tiny["ranker_dir"], None)
    with caplog.at_level("INFO", logger="dilstore.serve"), running([store]) as (client, _):
        served_copy.rename(tmp_path / "away")
        gone = client.get("/health")
        (tmp_path / "away").rename(served_copy)
        back = client.get("/health")
        answered = client.post("/rerank", json={"query": QUERY, "doc_ids": IDS})
    assert gone.status_code == 503 and "manifest.json is gone" in gone.json()["problems"]["s2"]
    assert back.status_code == 200, back.text
    assert scores(answered).keys() == set(IDS)
    assert "store 's2' is available again: its files are back as it was opened" in caplog.messages


def test_an_index_rebuilt_under_the_same_file_names_changes_the_stamp(tmp_path: Path) -> None:
    """A BM25 index built again into its folder may hold the same names (segments_1, _0.cfs): each file's own
    identity, not the names alone, tells the server to reopen, and an untouched store keeps its stamp."""
    from dilstore.storage.durability import replace_dir

    store, index = tmp_path / "store", tmp_path / "store-bm25"
    store.mkdir()
    (store / "manifest.json").write_text("{}", encoding="utf-8")
    for folder, content in ((index, "old"), (tmp_path / "rebuilt", "new index")):
        folder.mkdir()
        for name in ("segments_1", "_0.cfs"):
            (folder / name).write_text(content, encoding="utf-8")
    before = serve_reopen.files_stamp(str(store), index)
    assert serve_reopen.files_stamp(str(store), index) == before
    replace_dir(tmp_path / "rebuilt", index)
    assert sorted(path.name for path in index.iterdir()) == ["_0.cfs", "segments_1"]
    assert serve_reopen.files_stamp(str(store), index) != before


class ClosingService:
    """Stands in for a store's service: counts its closings."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_a_reopened_copy_still_pending_is_closed_when_a_newer_one_takes_its_place() -> None:
    """No batch ever read the copy a newer reopening replaced before the swap: it is closed then (its maps and
    searcher let go), the serving copy at the swap, and the newest is served and left open."""
    from dilstore.runners.serve_services import ServedStore

    first, second, third = ClosingService(), ClosingService(), ClosingService()
    store = ServedStore("s", first)  # type: ignore[arg-type]
    store.take(ServedStore("s", second))  # type: ignore[arg-type]
    store.take(ServedStore("s", third))  # type: ignore[arg-type]
    assert [first.closed, second.closed, third.closed] == [0, 1, 0] and store.latest is third
    store.swap()
    assert [first.closed, second.closed, third.closed] == [1, 1, 0] and store.service is third


def test_an_error_met_by_a_copy_a_reopened_one_replaced_marks_nothing() -> None:
    """A batch on the old copy meets its changed files after the reopened copy was taken, before or after the swap:
    the store stays available; the same error met by the copy now served marks it."""
    from dilstore.runners.serve_services import ServedStore

    old, new = ClosingService(), ClosingService()
    store = ServedStore("s", old)  # type: ignore[arg-type]
    store.take(ServedStore("s", new))  # type: ignore[arg-type]
    assert store.fail(DilstoreError("the old copy's shard went away"), old) is False  # type: ignore[arg-type]
    store.swap()
    assert store.fail(DilstoreError("the old copy's shard went away"), old) is False  # type: ignore[arg-type]
    assert store.problem is None
    assert store.fail(DilstoreError("the new copy's shard went away"), new) is True  # type: ignore[arg-type]
    assert store.problem == "the new copy's shard went away"


@pytest.mark.usefixtures("quick_watch")
def test_a_store_file_made_readable_again_is_served_without_a_restart(
    tiny: dict[str, Any], served_copy: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    """(perm57 F1) A store file the server's user could not read (`chmod 000`, another account's file) made the store
    unavailable, and a `chmod` that mended it changed nothing until a restart: only a change of the manifest or the
    index reopened it, which a permission is not. The file is now looked at again. Root reads any file, so the
    refusal is what os.open raises here."""
    import os

    store = open_served_store("s2", str(served_copy), tiny["ranker_dir"], None)
    denied = {str(path) for path in (served_copy / "shards").rglob("*") if path.is_file() and "states" in path.parts}
    real = os.open

    def opened(path: Any, flags: int, *args: Any, **options: Any) -> int:
        if os.fspath(path) in denied:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path, flags, *args, **options)

    with caplog.at_level("INFO", logger="dilstore.serve"), running([store]) as (client, _):
        monkeypatch.setattr(os, "open", opened)
        refused = client.post("/rerank", json={"query": QUERY, "doc_ids": IDS})
        assert refused.status_code == 503 and "Permission denied" in refused.text, refused.text
        assert "is served again once" in refused.json()["detail"] and client.get("/health").status_code == 503
        monkeypatch.setattr(os, "open", real)  # as a `chmod 644` mends it
        wait_for(lambda: client.get("/health").status_code == 200, "the store to be served again")
        assert scores(client.post("/rerank", json={"query": QUERY, "doc_ids": IDS})).keys() == set(IDS)
    assert any(message.startswith("store 's2' is available again: ") and message.endswith("can be read now")
               for message in caplog.messages), caplog.messages  # fmt: skip
    assert any(message.startswith("store 's2' is unavailable until ") and " can be read by this user, or its files "
               "change" in message for message in caplog.messages), caplog.messages  # the log says so (mut57c)
