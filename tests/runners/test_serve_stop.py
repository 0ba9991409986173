"""A forced quit of `serve` (a second stop signal while it drains): any signal forces it, and the store workers end
with their batch in progress before the interpreter does.

Under load, a second Ctrl-C printed "RuntimeError: Event loop is closed" from a worker that finished its batch
after the loop closed, or aborted the process (SIGABRT) with a worker still inside torch; a second SIGTERM waited
the whole --shutdown-timeout (crash38 H1, M1).
"""

from __future__ import annotations

import asyncio
import signal
import threading

import uvicorn

from dilstore.runners.serve_batching import Batcher
from dilstore.runners.serve_metrics import Metrics
from dilstore.runners.serve_server import StopServer


def test_abandon_drops_the_queue_and_the_worker_ends_after_the_batch_whose_loop_has_closed() -> None:
    running, release = threading.Event(), threading.Event()
    failures: list[threading.ExceptHookArgs] = []

    def run_batch(payloads: list[int]) -> list[int]:
        running.set()
        release.wait(30)
        return [payload * 2 for payload in payloads]

    batcher = Batcher("store", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=10, metrics=Metrics())
    hook, threading.excepthook = threading.excepthook, failures.append
    try:
        batcher.start()
        loop = asyncio.new_event_loop()
        requests = [loop.create_task(batcher.submit(number, 1)) for number in range(3)]
        loop.run_until_complete(asyncio.sleep(0))  # all three submitted: the first runs, two wait in the queue
        assert running.wait(30)
        assert batcher.abandon() == 2
        for request in requests:
            request.cancel()
        loop.run_until_complete(asyncio.gather(*requests, return_exceptions=True))
        loop.close()  # as a forced quit leaves it
        assert not batcher.join(0.3), "the batch in progress holds the worker"
        release.set()
        assert batcher.join(30)
    finally:
        release.set()
        threading.excepthook = hook
    assert failures == [], [failure.exc_value for failure in failures]


def test_a_request_cancelled_while_it_waited_is_not_run() -> None:
    """After --shutdown-timeout uvicorn cancels the unfinished requests, and the drain then ran each of them for
    nobody (review38 M4)."""
    running, release, ran = threading.Event(), threading.Event(), []

    def run_batch(payloads: list[int]) -> list[int]:
        ran.extend(payloads)
        running.set()
        release.wait(30)
        return payloads

    batcher = Batcher("store", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=10, metrics=Metrics())
    batcher.start()
    loop = asyncio.new_event_loop()
    try:
        requests = [loop.create_task(batcher.submit(number, 1)) for number in range(3)]
        loop.run_until_complete(asyncio.sleep(0))
        assert running.wait(30)
        requests[1].cancel()
        loop.run_until_complete(asyncio.gather(requests[1], return_exceptions=True))
        release.set()
        batcher.stop()  # the drain: runs what is queued
        loop.run_until_complete(asyncio.gather(requests[0], requests[2]))
    finally:
        release.set()
        loop.close()
    assert ran == [0, 2]


def test_any_second_stop_signal_forces_the_quit() -> None:
    for first, second in ((signal.SIGTERM, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT), (signal.SIGINT,
                                                                                                signal.SIGTERM)):
        server = StopServer(uvicorn.Config(app=lambda scope, receive, send: None))
        server.handle_exit(first, None)
        assert server.should_exit and not server.force_exit
        server.handle_exit(second, None)
        assert server.force_exit, (first, second)


def test_uvicorn_logs_no_error_for_a_request_a_forced_quit_cancelled(caplog) -> None:
    """Each cancelled request was an "Exception in ASGI application" traceback under the quit's warning."""
    import logging

    from dilstore.runners.serve_server import cancelled_requests_unlogged

    log = logging.getLogger("uvicorn.error")
    with cancelled_requests_unlogged():
        log.error("Exception in ASGI application\n", exc_info=asyncio.CancelledError())
        log.error("Exception in ASGI application\n", exc_info=ValueError("a real failure"))
    log.error("Exception in ASGI application\n", exc_info=asyncio.CancelledError())  # the filter is gone
    assert [record.exc_info[0] for record in caplog.records] == [ValueError, asyncio.CancelledError]


def test_the_requests_a_shutdown_timeout_cuts_off_are_a_warning_naming_the_option(caplog) -> None:
    """uvicorn logged them at ERROR, though each is answered 503 as designed (serve44 L1)."""
    import logging

    from dilstore.runners.serve_server import shutdown_timeout_reworded

    log = logging.getLogger("uvicorn.error")
    with shutdown_timeout_reworded(2.5):
        log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 3)
        log.error("Exception in ASGI application")
    log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 1)  # the filter is gone
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        ("WARNING", "3 request(s) still unfinished after --shutdown-timeout 2.5 s: answered 503"),
        ("ERROR", "Exception in ASGI application"),
        ("ERROR", "Cancel 1 running task(s), timeout graceful shutdown exceeded"),
    ]


def test_a_handler_that_takes_only_errors_gets_no_line_for_the_requests_a_shutdown_timeout_cut_off() -> None:
    """A handler set to ERROR (an alerting one) goes by the record's level number, not its name: the reworded record
    is a WARNING by both, and a real error still reaches it."""
    import logging

    from dilstore.runners.serve_server import shutdown_timeout_reworded

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.ERROR)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    alerting = Kept()
    log = logging.getLogger("uvicorn.error")
    log.addHandler(alerting)
    try:
        with shutdown_timeout_reworded(2.5):
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 3)
            log.error("Exception in ASGI application")
    finally:
        log.removeHandler(alerting)
    assert [(record.levelno, record.getMessage()) for record in alerting.records] == [
        (logging.ERROR, "Exception in ASGI application")
    ]


def test_a_graceful_stop_leaves_a_worker_stuck_in_its_batch(monkeypatch) -> None:
    """A store worker in a read of a stalled storage server held SIGTERM's graceful stop, and a second signal too:
    the lifespan's shutdown joined it with no bound, and the server exited 300 s later, after fsspec's wait
    (remote52 F6). It is left after FORCED_QUIT_SECONDS, as a forced quit leaves it: the process ends, status 0."""
    import time

    import pytest

    from dilstore.runners import serve_app

    running, release = threading.Event(), threading.Event()

    def run_batch(payloads: list[int]) -> list[int]:
        running.set()
        release.wait(30)  # a read that stalls
        return payloads

    class Quit(Exception):
        """What os._exit does, here: the test goes on."""

    def exit_process(status: int) -> None:
        raise Quit(status)

    monkeypatch.setattr(serve_app, "FORCED_QUIT_SECONDS", 0.2)
    monkeypatch.setattr(serve_app.os, "_exit", exit_process)
    router = object.__new__(serve_app.StoreRouter)
    router.stores, router._checking = [], threading.Lock()
    router.batchers = {"s": Batcher("s", run_batch, max_batch_pairs=1, max_wait=0.0, queue_size=10, metrics=Metrics())}

    async def serve_then_stop() -> None:
        async with router.lifespan(None):  # type: ignore[arg-type]
            request = asyncio.ensure_future(router.batchers["s"].submit(1, 1))
            await asyncio.to_thread(running.wait, 30)
            request.cancel()  # as uvicorn cancels a request unfinished after --shutdown-timeout

    started = time.monotonic()
    try:
        with pytest.raises(Quit) as quit_:
            asyncio.run(serve_then_stop())
    finally:
        release.set()
    assert quit_.value.args == (0,) and time.monotonic() - started < 10
