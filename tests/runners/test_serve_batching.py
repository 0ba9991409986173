"""The store worker: it hands freed memory back to the operating system once no request waits (glibc's malloc kept
it, and a server under /ask traffic grew from 1.0 to 3.6 GB in 21 minutes, still rising), and it never runs the
request of a client that left."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dilstore.runners import serve_batching
from dilstore.runners.serve_batching import MAX_WAIT_LIMIT_MS, Batcher, Overloaded, ServeSettings
from dilstore.runners.serve_metrics import LATENCY_BUCKETS, Metrics
from dilstore.storage.errors import DilstoreError


@pytest.mark.parametrize(
    ("every", "expected"), [(serve_batching.TRIM_EVERY_SECONDS, [0]), (0.0, [0, 0, 0])],
    ids=["busy-worker-trims-once-idle", "busy-worker-trims-when-the-last-trim-is-old"],
)
def test_the_worker_returns_freed_memory_when_no_request_waits(
    monkeypatch: pytest.MonkeyPatch, every: float, expected: list[int]
) -> None:
    """A worker whose queue never empties also trims once TRIM_EVERY_SECONDS passed since the last trim (0 here:
    after every batch)."""
    monkeypatch.setattr(serve_batching, "TRIM_EVERY_SECONDS", every)
    trims: list[int] = []
    monkeypatch.setattr(serve_batching, "_MALLOC_TRIM", trims.append)
    batches: list[list[int]] = []

    def run_batch(payloads: list[int]) -> list[int]:
        deadline = time.monotonic() + 30
        while not batches and batcher.pending() < 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # the first batch ends with the other two waiting
        batches.append(payloads)
        return [payload + 1 for payload in payloads]

    batcher = Batcher("store", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=10, metrics=Metrics())
    batcher.start()

    async def ask_three() -> list[int]:
        return await asyncio.gather(*(batcher.submit(number, 1) for number in range(3)))

    try:
        answers = asyncio.run(ask_three())
    finally:
        batcher.stop()
    assert answers == [1, 2, 3] and len(batches) == 3
    assert trims == expected, "the first two batches left requests waiting"

    trims.clear()
    batcher = Batcher("store", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=10, metrics=Metrics())
    batcher.start()

    async def ask_one_at_a_time() -> None:
        for number in range(2):
            await batcher.submit(number, 1)
            # The answer is settled before the worker looks at its queue: the next request, sent at once, could
            # arrive first and make the worker busy. Idle means nothing sent until it trimmed (or 30 s passed).
            deadline = time.monotonic() + 30
            while len(trims) <= number and time.monotonic() < deadline:
                await asyncio.sleep(0.001)

    try:
        asyncio.run(ask_one_at_a_time())
    finally:
        batcher.stop()
    assert trims == [0, 0], "an idle worker trims after each batch"


def test_a_request_whose_client_left_is_never_run_and_frees_its_handler() -> None:
    """Requests whose clients had timed out were queued and computed all the same: 20 of them made the next real
    /ask wait 8 s instead of 1 (serve42 M1). The queued job of a client that left is skipped by the worker."""
    from dilstore.runners.serve_app import ClientGone, while_connected

    release = threading.Event()
    seen: list[str] = []

    def run_batch(payloads: list[str]) -> list[str]:
        seen.extend(payloads)
        release.wait(30)  # the first batch holds the worker while the second request waits in the queue
        return [payload.upper() for payload in payloads]

    batcher = Batcher("store", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=10, metrics=Metrics())
    batcher.start()

    async def stays() -> dict[str, str]:
        await asyncio.Event().wait()  # a client that never leaves: its channel says nothing
        return {"type": "http.disconnect"}

    async def leaves() -> dict[str, str]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def two_requests() -> tuple[object, object]:
        first = asyncio.ensure_future(while_connected(batcher.submit("kept", 1), stays))
        while not seen:
            await asyncio.sleep(0.001)
        second = await asyncio.gather(while_connected(batcher.submit("gone", 1), leaves), return_exceptions=True)
        assert batcher.pending() == 0, "the request of a client that left kept its queue slot (review42 L1)"
        release.set()
        return await first, second[0]

    try:
        kept, gone = asyncio.run(two_requests())
    finally:
        release.set()
        batcher.stop()
    assert kept == "KEPT" and isinstance(gone, ClientGone)
    assert seen == ["kept"], "the worker ran the request of a client that had left"


def test_clients_that_leave_are_dropped_through_the_real_app_and_counted_499() -> None:
    """The watch works through FastAPI and the middleware on a real uvicorn server: requests sent and abandoned
    behind a slow one are never run, count as 499 in /metrics, and leave no queue behind (review42 L4)."""
    import socket

    import httpx
    import uvicorn

    from dilstore.runners.serve_app import create_app
    from dilstore.runners.serve_batching import ServeSettings
    from dilstore.runners.serve_requests import ASK
    from dilstore.runners.serve_services import ServedStore

    release, asked = threading.Event(), []

    class SlowService:
        """Stands in for AskService: its first batch waits for `release`."""

        endpoint = ASK
        store = None

        def pairs(self, request: object) -> int:
            return 1

        def run_batch(self, requests: list) -> list[dict[str, str]]:
            asked.extend(request.question for request in requests)
            release.wait(30)
            return [{"answer": request.question} for request in requests]

    store = ServedStore("slow", SlowService())  # type: ignore[arg-type]
    app = create_app([store], ServeSettings(max_batch_pairs=1, max_wait=0.0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as client:
            first = threading.Thread(target=lambda: client.post("/ask", json={"question": "kept"}))
            first.start()
            while not asked:
                time.sleep(0.01)
            body = b'{"question": "gone"}'
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", port)) as gone:
                    gone.sendall(b"POST /ask HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            deadline = time.monotonic() + 30
            while 'code="499"} 5' not in (text := httpx.get(url + "/metrics").text):
                assert time.monotonic() < deadline, text
                time.sleep(0.05)
            assert app.state.batchers["slow"].pending() == 0
            release.set()
            first.join(30)
        assert asked == ["kept"]
    finally:
        release.set()
        server.should_exit = True
        thread.join(30)


def test_chores_run_on_an_idle_worker_at_once_and_a_failing_one_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A reopened store's swap waited for the next request: an idle server kept the replaced copy (its deleted
    files, its model) for as long as no request came (review47 F2). `run_soon` wakes the worker."""
    ran: list[str] = []

    def failing() -> None:
        raise RuntimeError("a chore failed")

    batcher = Batcher("store", lambda payloads: list(payloads), max_batch_pairs=1, max_wait=0.0, queue_size=10,
                      metrics=Metrics())  # fmt: skip
    batcher.start()
    try:
        batcher.run_soon(failing)
        batcher.run_soon(lambda: ran.append(threading.current_thread().name))
        deadline = time.monotonic() + 30
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asyncio.run(batcher.submit(7, 1)) == 7, "the worker goes on after a failed chore"
    finally:
        batcher.stop()
    assert ran == ["dilstore-serve-store"], "on the store's worker thread, with no request sent"
    assert [record.getMessage() for record in caplog.records] == ["store 'store': a task between batches failed"]


def greedy_batches(pairs: list[int], max_batch_pairs: int) -> list[list[int]]:
    """The module docstring's rule, by hand: each batch takes the waiting requests in arrival order while their pairs
    fit in max_batch_pairs (a batch may be exactly full), and a request larger than that runs alone."""
    batches: list[list[int]] = []
    total = 0
    for number, size in enumerate(pairs):
        if batches and total + size <= max_batch_pairs:
            batches[-1].append(number)
            total += size
        else:
            batches.append([number])
            total = size
    return batches


@given(pairs=st.lists(st.integers(1, 6), min_size=1, max_size=8), max_batch_pairs=st.integers(1, 6))
@example(pairs=[2, 2, 2], max_batch_pairs=4)  # [[0, 1], [2]]: 2 + 2 fill the batch exactly
@settings(max_examples=40, deadline=None)
def test_requests_waiting_when_the_worker_starts_form_batches_that_fill_up_to_max_batch_pairs(
    pairs: list[int], max_batch_pairs: int
) -> None:
    """Every request is queued before the worker thread starts, so the batches do not depend on timing."""
    batches: list[list[int]] = []

    def run_batch(payloads: list[int]) -> list[int]:
        batches.append(list(payloads))
        return [payload + 1 for payload in payloads]

    batcher = Batcher("store", run_batch, max_batch_pairs=max_batch_pairs, max_wait=0.0, queue_size=len(pairs),
                      metrics=Metrics())  # fmt: skip
    answers = answers_queued_before_start(batcher, pairs)
    assert answers == [number + 1 for number in range(len(pairs))]
    assert batches == greedy_batches(pairs, max_batch_pairs)


def answers_queued_before_start(batcher: Batcher, pairs: list[int]) -> list[int]:
    """Queue one request per entry of `pairs` (its payload its position, its pair count the entry), then start the
    worker and stop it after the answers: every request is queued first, so the batches do not depend on timing."""

    async def ask_all_then_start() -> list[int]:
        asked = [asyncio.ensure_future(batcher.submit(number, size)) for number, size in enumerate(pairs)]
        while batcher.pending() < len(pairs):
            await asyncio.sleep(0)
        batcher.start()
        return await asyncio.gather(*asked)

    try:
        return asyncio.run(ask_all_then_start())
    finally:
        batcher.stop()


def run_blocked_then_together(run_batch: Callable[[list[int]], list[int]], later: tuple[int, int]) -> list[object]:
    """Submit 0 (which `run_batch` must hold for 0.2 s), then the two `later` payloads while it runs, so that they
    form the next batch; every outcome, exceptions included."""
    batcher = Batcher("store", run_batch, max_batch_pairs=4, max_wait=0.05, queue_size=10, metrics=Metrics())
    batcher.start()

    async def ask() -> list[object]:
        first = asyncio.ensure_future(batcher.submit(0, 1))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(batcher.submit(number, 1)) for number in later]
        return await asyncio.gather(first, *rest, return_exceptions=True)

    try:
        return asyncio.run(ask())
    finally:
        batcher.stop()


@given(pairs=st.lists(st.integers(0, 2), min_size=1, max_size=6))
@settings(max_examples=20, deadline=None)
def test_with_max_batch_pairs_1_every_request_runs_alone_even_one_of_no_pairs(pairs: list[int]) -> None:
    """`max_batch_pairs=1` turns batching off (the module docstring): a request that counts no pairs still takes
    a batch's place, so requests of none do not pile into one batch."""
    batches: list[list[int]] = []

    def run_batch(payloads: list[int]) -> list[int]:
        batches.append(list(payloads))
        return list(payloads)

    batcher = Batcher("store", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=len(pairs), metrics=Metrics())
    answers = answers_queued_before_start(batcher, pairs)
    assert answers == list(range(len(pairs)))
    assert batches == [[number] for number in range(len(pairs))]


@pytest.mark.parametrize(
    "error",
    [
        # review47 F5: a store's files changed under a batch, with a warning per compaction under load
        "changed",
        # remote52 F4: a silent storage server or a 503, already tried READ_ATTEMPTS times with its waits: 8 clients
        # of a stalled server got their 502 after 149 s, not 17
        "read",
    ],
)
def test_a_batch_that_meets_a_changed_store_or_a_failed_remote_read_is_not_run_again_request_by_request(
    error: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each request of such a batch ran again alone, against the same files or the same server: the error is each
    request's, at once."""
    from fsspec.exceptions import FSTimeoutError

    from dilstore.storage.format import StoreChangedError
    from dilstore.storage.read_failures import read_failure

    raised = {"changed": StoreChangedError("the store was rebuilt"),  # the reader's error after its READ_ATTEMPTS:
              "read": read_failure("https://h/s/shards/shard-00000/states/c/0", FSTimeoutError())}[error]  # fmt: skip
    calls: list[list[int]] = []

    def run_batch(payloads: list[int]) -> list[int]:
        calls.append(list(payloads))
        if len(calls) == 1:
            time.sleep(0.2)  # the other two arrive meanwhile and form the next batch
            return list(payloads)
        raise raised

    outcomes = run_blocked_then_together(run_batch, (1, 2))
    assert outcomes[0] == 0 and all(outcome is raised for outcome in outcomes[1:])
    assert calls == [[0], [1, 2]], "run once, not again request by request"
    assert not [record for record in caplog.records if "running each alone" in record.getMessage()]


def test_a_batch_that_meets_one_damaged_file_answers_the_others_alone() -> None:
    """A store error of one request (a shard's file missing, a 404 from a web server) is no change of the whole
    store: the others of its batch are run again alone and answered (review47b M)."""
    from dilstore.storage.format import StoreFormatError

    batches: list[list[int]] = []

    def run_batch(payloads: list[int]) -> list[int]:
        batches.append(list(payloads))
        if payloads == [0]:
            time.sleep(0.2)  # the next two arrive meanwhile and form one batch
        if 13 in payloads:
            raise StoreFormatError("shard-00013/states/values/c/0: not found")
        return list(payloads)

    outcomes = run_blocked_then_together(run_batch, (7, 13))
    assert batches[:2] == [[0], [7, 13]], "the two formed one batch"
    assert outcomes[:2] == [0, 7] and isinstance(outcomes[2], StoreFormatError)


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` in a /metrics text, by their labels."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            found[tuple(re.findall(r'(\w+)="([^"]*)"', labels))] = float(value)
    return found


@given(values=st.lists(st.sampled_from([0.0, *LATENCY_BUCKETS, 0.007, 3.0, 45.0]), min_size=1, max_size=12))
@example(values=[0.005, 0.01])  # each exactly a bound: counted in that bucket (Prometheus' le is "at most")
@settings(max_examples=40, deadline=None)
def test_a_latency_on_a_bucket_bound_counts_in_that_bucket(values: list[float]) -> None:
    metrics = Metrics()
    for value in values:
        metrics.count_request("/ask", 200, value)
    buckets = _samples(metrics.render(), "dilstore_request_seconds_bucket")
    for bound in LATENCY_BUCKETS:
        assert buckets[(("endpoint", "/ask"), ("le", f"{bound:g}"))] == sum(value <= bound for value in values)


@given(batches=st.lists(st.integers(1, 5000), min_size=1, max_size=8))
@example(batches=[2048, 1])  # one batch above the largest bound (1024)
@settings(max_examples=40, deadline=None)
def test_the_inf_bucket_counts_every_batch_above_the_largest_bound_too(batches: list[int]) -> None:
    metrics = Metrics()
    for pairs in batches:
        metrics.observe_batch("qa", 1, pairs, [])
    text = metrics.render()
    assert _samples(text, "dilstore_batch_pairs_bucket")[(("store", "qa"), ("le", "+Inf"))] == len(batches)
    assert _samples(text, "dilstore_batch_pairs_bucket")[(("store", "qa"), ("le", "1024"))] == sum(
        pairs <= 1024 for pairs in batches)  # fmt: skip
    assert _samples(text, "dilstore_batch_pairs_count")[(("store", "qa"),)] == len(batches)


@pytest.mark.parametrize(
    ("status", "retry_later", "kind"),
    [(200, False, None), (400, False, "bad_request"), (404, False, "bad_request"), (422, False, "bad_request"),
     (499, False, "client_gone"), (500, False, "internal"), (502, False, "store_read"),
     (503, True, "overloaded"), (503, False, "unavailable")],
)
def test_each_error_status_counts_as_its_kind(status: int, retry_later: bool, kind: str | None) -> None:
    """A 400 (a body FastAPI could not read as JSON) is a bad request as a 422 is, not a success."""
    metrics = Metrics()
    metrics.count_request("/ask", status, 0.01, retry_later=retry_later)
    errors = _samples(metrics.render(), "dilstore_errors_total")
    assert errors == ({} if kind is None else {(("endpoint", "/ask"), ("kind", kind)): 1.0})


@given(store=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12))
@example(store='a\\b"c\nd')  # a backslash, a quote and a newline
@settings(max_examples=60, deadline=None)
def test_a_store_name_reads_back_from_its_escaped_label_value(store: str) -> None:
    """Each store label is escaped as the text format asks (backslash, quote, newline), so that a parser reads the
    name back as given: an unescaped backslash before 'n' or '"' read as another character."""
    metrics = Metrics()
    metrics.observe_batch(store, 1, 1, [0.0])
    metrics.watch_queue(store, lambda: 3)
    lines = [line for line in metrics.render().split("\n") if line.startswith(("dilstore_queue_depth{",
                                                                                  "dilstore_batch_pairs_count{"))]
    assert len(lines) == 2
    for line in lines:
        value = re.fullmatch(r'\w+\{store="((?:[^"\\]|\\.)*)"\} \d+', line, re.DOTALL)
        assert value is not None, line
        assert re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value.group(1)) == store


@given(arrivals=st.lists(st.booleans(), max_size=12))
@example(arrivals=[True, True, True, False, False])  # three arrived, two answered: one in flight
@settings(max_examples=40, deadline=None)
def test_requests_in_flight_are_those_arrived_and_not_yet_answered(arrivals: list[bool]) -> None:
    """Each request adds one as it arrives and takes one away once answered (never more than arrived)."""
    metrics, now = Metrics(), 0
    for arrived in arrivals:
        change = 1 if arrived or now == 0 else -1
        metrics.in_flight("/ask", change)
        now += change
    lines = [line for line in metrics.render().split("\n") if line.startswith("dilstore_requests_in_flight{")]
    assert lines == ([f'dilstore_requests_in_flight{{endpoint="/ask"}} {now}'] if arrivals else [])


@pytest.mark.parametrize("milliseconds", [0.0, MAX_WAIT_LIMIT_MS])
def test_a_max_wait_at_either_end_of_its_range_is_taken(milliseconds: float) -> None:
    """"from 0 to 60000" ms, both ends included; a millisecond past the end is refused."""
    assert ServeSettings(max_wait=milliseconds / 1000).max_wait * 1000 == milliseconds
    with pytest.raises(DilstoreError, match=f"max-wait-ms must be from 0 to {MAX_WAIT_LIMIT_MS:g}, got 60001"):
        ServeSettings(max_wait=(MAX_WAIT_LIMIT_MS + 1) / 1000)


def test_a_batch_whose_url_store_refuses_one_shard_answers_the_others_alone(tmp_path, quick_retries) -> None:
    """A read refused for good (an HTTP 403 on one shard's file of a store at a URL; a local disk's I/O error) is no
    failure in transit: nothing tried it again, and requests of the batch that do not read that file are answered
    when run alone, as a damaged file's are (review52 F1: remote52 F4 gave every request of the batch the error)."""
    from dilstore.storage.format import StoreReadError
    from dilstore.storage.reader import open_store
    from tests.fixtures.http_store import serve_directory
    from tests.fixtures.store_fixtures import build_store, random_shards

    build_store(tmp_path / "store", random_shards([4, 4]))
    ids = {0: "s0/p0", 1: "s0/p1", 2: "s1/p1"}  # the third request reads shard 1, whose states are refused
    with serve_directory(tmp_path) as server:
        store = open_store(f"{server.url}/store")
        server.faults["store/shards/shard-00001/states/values/c/0/0"] = 403

        def run_batch(payloads: list[int]) -> list[int]:
            if payloads == [0]:
                time.sleep(0.2)  # the other two arrive meanwhile and form the next batch
            store.fetch([ids[payload] for payload in payloads])
            return list(payloads)

        outcomes = run_blocked_then_together(run_batch, (1, 2))
    assert outcomes[:2] == [0, 1], outcomes
    assert isinstance(outcomes[2], StoreReadError) and "refuses" in str(outcomes[2])


def test_the_queue_takes_queue_size_requests_and_refuses_the_next() -> None:
    """`queue_size` requests may wait; the next is Overloaded, the app's 503 (mut58: one over the limit was taken
    and no test noticed)."""
    batcher = Batcher("store", lambda payloads: list(payloads), max_batch_pairs=1, max_wait=0.0, queue_size=2,
                      metrics=Metrics())  # fmt: skip

    async def fill_then_one_more() -> None:
        waiting = [asyncio.ensure_future(batcher.submit(number, 1)) for number in range(2)]
        while batcher.pending() < 2:
            await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="store 'store' has 2 requests queued, its limit"):
            await asyncio.wait_for(batcher.submit(2, 1), timeout=5)  # taken, it would wait: no worker runs
        for request in waiting:
            request.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(fill_then_one_more())
    assert batcher.pending() == 0


@pytest.mark.parametrize("name", ["max_batch_pairs", "queue_size", "max_top_p"])
def test_serve_limits_of_zero_are_refused(name: str) -> None:
    """No batch, queue or top_p of 0 (mut58: only the bounds' other side was tested)."""
    with pytest.raises(DilstoreError, match=f"{name.replace('_', '-')} must be at least 1, got 0"):
        ServeSettings(**{name: 0})


def test_a_lone_request_that_fails_is_run_once_and_abandon_drops_what_waits() -> None:
    """A batch of one request that fails is that request's failure: not run again alone (mut58: the second run went
    unnoticed). A forced quit's `abandon` drops the requests still queued and says how many, and refuses later ones
    (mut58: untested)."""
    calls: list[list[int]] = []

    def run_batch(payloads: list[int]) -> list[int]:
        calls.append(list(payloads))
        raise ValueError("a bad question")

    batcher = Batcher("store", run_batch, max_batch_pairs=4, max_wait=0.0, queue_size=10, metrics=Metrics())
    with pytest.raises(ValueError, match="a bad question"):
        answers_queued_before_start(batcher, [1])
    assert calls == [[0]]

    idle = Batcher("store", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=10, metrics=Metrics())

    async def queue_two_then_abandon() -> int:
        waiting = [asyncio.ensure_future(idle.submit(number, 1)) for number in range(2)]
        while idle.pending() < 2:
            await asyncio.sleep(0)
        dropped = idle.abandon()
        assert idle.pending() == 0  # before its clients leave: the worker would run none of them
        for request in waiting:
            request.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return dropped

    assert asyncio.run(queue_two_then_abandon()) == 2

    async def one_more() -> None:  # the store is shutting down: refused, not queued for a worker that has ended
        await asyncio.wait_for(idle.submit(9, 1), timeout=5)

    with pytest.raises(Overloaded, match="store 'store' is shutting down"):
        asyncio.run(one_more())


def test_a_batch_the_next_request_does_not_fit_starts_without_waiting_for_more() -> None:
    """A waiting request too large to join ends the batch at once: waiting `max_wait` for one that might fit only
    delayed both (mut58: a batch that waited out its max_wait here went unnoticed)."""
    batcher = Batcher("store", lambda payloads: list(payloads), max_batch_pairs=2, max_wait=5.0, queue_size=10,
                      metrics=Metrics())  # fmt: skip
    started = time.perf_counter()
    assert answers_queued_before_start(batcher, [1, 2]) == [0, 1]
    assert time.perf_counter() - started < 2.5, "waited for more though the next request could not join"


def test_a_batch_under_load_waits_up_to_max_wait_for_a_request_that_fills_it() -> None:
    """Two requests waiting when the worker starts form a batch that waits, up to max_wait, for more: one arriving
    0.2 s later joins it (mut58: a batch that never waited went unnoticed)."""
    calls: list[list[int]] = []

    def run_batch(payloads: list[int]) -> list[int]:
        calls.append(list(payloads))
        return list(payloads)

    batcher = Batcher("store", run_batch, max_batch_pairs=4, max_wait=5.0, queue_size=10, metrics=Metrics())

    async def two_then_one_later() -> list[int]:
        first = [asyncio.ensure_future(batcher.submit(number, 1)) for number in range(2)]
        while batcher.pending() < 2:
            await asyncio.sleep(0)
        batcher.start()
        await asyncio.sleep(0.2)
        return await asyncio.gather(*first, batcher.submit(2, 2))

    try:
        assert asyncio.run(two_then_one_later()) == [0, 1, 2]
    finally:
        batcher.stop()
    assert calls == [[0, 1, 2]]
