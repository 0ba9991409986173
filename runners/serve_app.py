"""The query server's FastAPI app: /ask and /rerank over mounted stores, /health, /stores, /metrics.

Each store is served by one service (runners/serve_services.py) that owns its
reader (or reranker) and runs on that store's Batcher worker thread
(runners/serve_batching.py); the request bodies are in runners/serve_requests.py:

- AskService (a `dilbert` store): /ask answers the way `dilstore ask --json`
  does (reader/serving/odqa.py: BM25 top-p, stored states, online layers, the seed's
  μ fusion), and batches the question–passage pairs of concurrent requests
  through one `OpenDomainReader.read` call.
- RerankService (an `earl-s1`/`earl-s2`/`listformer` store): /rerank scores given
  document ids, or BM25's top k when the store has an index, with the store's
  reranker (reader/serving/rerank.py), one request at a time.

Errors: a request the server cannot serve gets a 4xx with a message
(`{"detail": ...}`): 422 for a malformed body or a bad field (FastAPI's
validation, or the reader's own checks of the question), 404 for an unknown
store, 400 for a store of the wrong kind or a BM25 request to a store without
an index. A full queue gets 503 with Retry-After. A failure inside the model
gets 500 for the failing request only. A store whose files changed under the
server (rebuilt with --overwrite, moved, deleted, damaged: StoreFormatError)
is marked unavailable: its requests get 503, and /health answers 503 naming
it, so a load balancer takes the server out of rotation. The stores are
checked every WATCH_SECONDS and at each /health: one whose manifest or BM25
index changed (an append, a compaction, a rebuild) is opened again as at
start-up and served from its next batch on (runners/serve_reopen.py), which
also ends its unavailability. A read of a remote store that
fails in transit (StoreReadError: a server error, a timeout), or a local
disk's I/O error on the manifest, gets 502 for that request only; the store
stays served.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.message
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse as FastAPIJSONResponse
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from dilstore.runners.serve_batching import Batcher, Overloaded, ServeSettings
from dilstore.runners.serve_metrics import CLIENT_GONE, CONTENT_TYPE, Metrics
from dilstore.runners.serve_reopen import Reopener
from dilstore.runners.serve_requests import ASK, RERANK, AskRequest, ClientError, RerankRequest
from dilstore.runners.serve_responses import (
    HEALTH_RESPONSES,
    METRICS_RESPONSES,
    AskAnswer,
    RerankAnswer,
    query_responses,
)
from dilstore.runners.serve_services import ServedStore, Service
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreChangedError, StoreFormatError, StoreReadError
from dilstore.storage.messages import listed, other_form_hint
from dilstore.storage.read_failures import thread_refused
from dilstore.storage.secrets import scrubbed

logger = logging.getLogger("dilstore.serve")
# --access-log's lines: on stdout, as uvicorn's own access log wrote them (cmd_serve.log_as_uvicorn_does).
access_logger = logging.getLogger("dilstore.serve.access")
# What the log and a 503 say when the system refuses this process another thread (Python's RuntimeError "can't start
# new thread"): each /health was a 500 with an ASGI traceback in the log, and the watch logged one every 5 s
# (limits59 F3).
NO_THREAD = ("no thread could be started: the limit on this user's processes and threads (ulimit -u) or the "
             "container's pids limit is reached")  # fmt: skip
# The store a request was sent to, for its access-log line: set by the router, read by the middleware that made the
# dict (the route runs in a task of its own, which shares the dict, not the variable's value).
_REQUEST_STORE: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("request_store", default=None)

# How long a forced quit waits for the stores' batches in progress.
FORCED_QUIT_SECONDS = 10

ENDPOINTS = (ASK, RERANK, "/health", "/stores", "/metrics")
RETRY_AFTER_SECONDS = 1
MAX_BODY_BYTES = 1 << 20
UNPARSED_BODY = "There was an error parsing the body"  # FastAPI's 400 detail for a body it cannot decode
T = TypeVar("T")


HEALTH_CHECK_SECONDS = 2.0  # how long /health waits for the stores' checks; what they find later shows next time
WATCH_SECONDS = 5.0  # how often the stores are checked (and a changed one reopened) with no /health asked


def _readable(path: str) -> bool:
    """Whether this process can open the file at `path` for reading now (a store's file whose permission had refused
    it: an unavailable store stayed so after a `chmod` mended it, until a restart; perm57 F1)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def _count(value: object) -> str:
    """A passage count as /stores gives it, with thousands separators."""
    return f"{value:,}" if isinstance(value, int) else str(value)


def _read_failed(name: str, error: Exception) -> ClientError:
    """The 502 of a request whose read of a store at a URL failed, logged; the store stays served."""
    message = scrubbed(f"reading store {name!r} failed: {error}")
    logger.warning("%s", message)
    return ClientError(502, message)


class JSONResponse(FastAPIJSONResponse):
    """FastAPI's JSON response, whose strings may hold the lone surrogates (U+DC80..U+DCFF) that Python decodes a
    path's bytes that are not UTF-8 to: written as JSON's escapes (`\\udcff`). A store in such a folder was served,
    but its name and path made /health, /stores and every error that names it a 500, and a load balancer took the
    server out of rotation (unicode56 F9)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":")).encode("utf-8", "backslashreplace")  # fmt: skip


def create_app(stores: Sequence[ServedStore], settings: ServeSettings) -> FastAPI:
    """The app over already opened stores; its lifespan starts and drains one Batcher per store."""
    router = StoreRouter(stores, settings, Metrics())
    app = FastAPI(
        title="dilstore query server",
        description="Open-domain QA (/ask) and EARL reranking (/rerank) over precomputed shard stores.",
        lifespan=router.lifespan,
    )
    app.state.metrics = router.metrics
    app.state.batchers = router.batchers
    add_request_handling(app, router.metrics, access_log=settings.access_log)
    add_routes(app, router)
    return app


class StoreRouter:
    """The served stores by name, one Batcher each, and how a request reaches its store and comes back."""

    def __init__(self, stores: Sequence[ServedStore], settings: ServeSettings, metrics: Metrics) -> None:
        if not stores:
            raise DilstoreError("no store to serve")
        self.names = [store.name for store in stores]
        if len(set(self.names)) != len(self.names):
            raise DilstoreError(f"store names must differ, got {self.names}; name them as NAME=DIR")
        self.stores, self.settings, self.metrics = list(stores), settings, metrics
        self.by_name = {store.name: store for store in stores}
        self._checking = threading.Lock()  # held by the one check_stores running (the watch's or a /health's)
        self.batchers = {
            store.name: Batcher(
                store.name,
                store.run_batch,
                # /rerank runs each request alone: only /ask batches pairs across requests.
                max_batch_pairs=settings.max_batch_pairs if store.service.endpoint == ASK else 1,
                max_wait=settings.max_wait,
                queue_size=settings.queue_size,
                metrics=metrics,
            )
            for store in stores
        }

    @asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        """Start every Batcher; at shutdown, stop them all (each runs what is still queued).

        A forced quit (a second signal while uvicorn waits for the connections
        to close, as its log line invites) skips the shutdown and cancels this
        instead; starlette logged that cancellation as an ERROR traceback. It
        is one warning saying what was cut (`forced_quit`).
        """
        for batcher in self.batchers.values():
            batcher.start()
        watch = asyncio.ensure_future(self.watch())
        try:
            yield
        except asyncio.CancelledError:
            watch.cancel()
            self.forced_quit()
            return
        watch.cancel()
        # uvicorn has already waited for the requests in flight, and cancelled those past --shutdown-timeout: a
        # worker still in a batch FORCED_QUIT_SECONDS later is stuck (a URL store's stalled read held SIGTERM, and a
        # second one, for 5 minutes a read: remote52 F6), and is left as a forced quit leaves it.
        ended = await asyncio.gather(*(asyncio.to_thread(batcher.stop, FORCED_QUIT_SECONDS)
                                       for batcher in self.batchers.values()))  # fmt: skip
        self.quit_without([name for name, done in zip(self.batchers, ended, strict=True) if not done])

    async def watch(self) -> None:
        """Check the stores every WATCH_SECONDS, off the event loop: a store changed on disk is found (and
        reopened) without waiting for a request or a /health."""
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            try:
                await asyncio.to_thread(self.check_stores)
            except Exception as error:  # noqa: BLE001 (the watch goes on: the next check may find the stores readable)
                if thread_refused(error):
                    logger.warning("the stores are checked again in %g s: %s", WATCH_SECONDS, NO_THREAD)
                else:
                    logger.exception("checking the stores failed")

    def forced_quit(self) -> None:
        """Drop every store's queue, then give the batches in progress FORCED_QUIT_SECONDS to end, all stores at
        once; a batch that hangs (a URL store's read that stalls) ends the process without it, since the
        interpreter's exit would wait for it or abort (SIGABRT) inside torch."""
        queued = sum(batcher.abandon() for batcher in self.batchers.values())
        logger.warning("forced to quit: the requests in flight and %d queued were not answered", queued)
        deadline = time.monotonic() + FORCED_QUIT_SECONDS
        self.quit_without([name for name, batcher in self.batchers.items()
                           if not batcher.join(max(0.0, deadline - time.monotonic()))])  # fmt: skip

    @staticmethod
    def quit_without(stuck: list[str]) -> None:
        """End the process (status 0) without the workers of the stores `stuck` in a batch, if any: the
        interpreter's exit would wait for them, or abort (SIGABRT) inside torch."""
        if stuck:
            logger.warning("store(s) %s still in a batch after %d s: quitting without waiting for it", listed(stuck),
                           FORCED_QUIT_SECONDS)  # fmt: skip
            logging.shutdown()
            os._exit(0)

    def choose(self, name: str | None, endpoint: str) -> ServedStore:
        """The store a request names, or the first that answers `endpoint`; a ClientError when there is none."""
        if name is None:
            for store in self.stores:
                if store.latest.endpoint == endpoint:
                    return store
            raise ClientError(400, f"no store served here answers {endpoint}")
        if name not in self.by_name:
            # A name typed in another Unicode form than the folder's (macOS writes names decomposed) printed alike
            # in the list (left57 F2), as fetch and rerank name an id in another form.
            hint = other_form_hint(self.by_name, [name], where="among them", what="store names")
            raise ClientError(404, f"no store named {name!r}; stores: {', '.join(self.names)}{hint}")
        store = self.by_name[name]
        if store.latest.endpoint != endpoint:
            raise ClientError(400, f"store {name!r} answers {store.latest.endpoint}, not {endpoint}")
        return store

    async def answer(self, request: AskRequest | RerankRequest, endpoint: str, receive: Receive) -> Response:
        """The response to one /ask or /rerank request: its result, or the error status the module docstring lists;
        a request whose client left while it waited is dropped (CLIENT_GONE), queued or not."""
        try:
            store = self.choose(request.store, endpoint)
            if (noted := _REQUEST_STORE.get()) is not None:
                noted["store"] = store.name
            if store.problem is not None:
                raise store.unavailable()
            pairs = store.latest.pairs(request)  # type: ignore[arg-type]
            if pairs > self.settings.max_top_p:
                raise ClientError(422, f"this server answers at most {self.settings.max_top_p} passages per request, "
                                  f"got {pairs}")  # fmt: skip
            result = await self.run(store, request, pairs, receive)
        except ClientError as error:
            return JSONResponse({"detail": scrubbed(str(error))}, status_code=error.status)
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        except Overloaded as error:
            return JSONResponse(
                {"detail": f"overloaded: {error}; retry later"},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        except Exception as error:  # noqa: BLE001 (a model failure is this request's 500, the server goes on)
            if thread_refused(error):  # a passing shortage of the whole process, not this request's failure
                logger.warning("%s: 503: %s", endpoint, NO_THREAD)
                return JSONResponse({"detail": f"{NO_THREAD}; retry later"}, status_code=503,
                                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})  # fmt: skip
            logger.exception("%s failed", endpoint)
            return JSONResponse({"detail": scrubbed(f"internal error: {type(error).__name__}: {error}")},
                                status_code=500)  # fmt: skip
        return JSONResponse(result)

    async def run(self, store: ServedStore, request: AskRequest | RerankRequest, pairs: int, receive: Receive, *,
                  again: bool = True) -> Any:
        """The request's result from its store's worker.

        A request that meets the store's files changed under it (StoreFormatError) waits while the store is opened
        again if its manifest or index changed (a compaction or rebuild swapped in: `reopened`), then runs `again`
        on the new copy: the clients of a store being compacted get answers, not errors. Otherwise the store is
        marked unavailable (503). Over HTTP a 404, a short body or a whole file for a range is one answer of a
        server (a CDN edge mid-deploy), no proof that the store changed: 502 for this request, the store stays.
        """
        service = store.latest
        try:
            return await while_connected(self.batchers[store.name].submit(request, pairs), receive)
        except StoreFormatError as error:
            if service.store.location.local_root is None and not isinstance(error, StoreChangedError):
                raise _read_failed(store.name, error) from None
            if again and await self.reopened(store, service):
                return await self.run(store, request, pairs, receive, again=False)
            if not store.fail(error, service):
                raise ClientError(503, f"store {store.name!r} was opened again while this request was read from its "
                                       "old files; send it again") from None  # fmt: skip
            raise store.unavailable() from None
        except StoreReadError as error:  # a remote read failed in transit: this request only, the store stays
            raise _read_failed(store.name, error) from None

    async def reopened(self, store: ServedStore, service: Service) -> bool:
        """Whether a copy of `store` other than `service` serves now, after a check of the store (`check_store`,
        which opens it again when its files changed), off the event loop."""
        if store.reopener is None:
            return False
        await asyncio.to_thread(self.check_store, store)
        return store.problem is None and store.latest is not service

    def check_stores(self) -> None:
        """Check each store (`check_store`); when a check is already running (the watch's, or another /health's),
        return at once: it finds what this one would."""
        if not self._checking.acquire(blocking=False):
            return
        try:
            for store in self.stores:
                self.check_store(store)
        finally:
            self._checking.release()

    def check_store(self, store: ServedStore) -> None:
        """Reopen a store when its Reopener says so (a local store's manifest or index changed on disk; a store at a
        URL that names another build); then check an available store's files (`Store.check_unchanged`), marking
        one that changed unavailable, so that a store replaced under an idle server takes /health out of a load
        balancer's rotation before any request reaches it. A reopen that failed is logged once per change of the
        files: as a warning while the old copy's files are intact (an append whose BM25 index is not rebuilt yet:
        it is served as it was), else in the problem."""
        with store.checking:  # one check of a store at a time: a request's (`reopened`) waits for the watch's
            self._check_store(store)

    def _check_store(self, store: ServedStore) -> None:
        """`check_store`, with the store's check lock held."""
        reopener, failure = store.reopener, None
        attempted = reopener is not None and reopener.due(store.problem is not None)
        if attempted:
            failure = self.reopen(store, reopener)
        if store.problem is not None:
            if failure is not None:
                store.problem = scrubbed(f"it changed on disk, and opening it again failed: {failure}")
                logger.error("store %r is unavailable: %s", store.name, store.problem)
            elif not attempted and store.files_changed and self._back_as_opened(store):
                logger.info("store %r is available again: its files are back as it was opened", store.name)
                store.problem = None
            elif not attempted and store.unreadable is not None and _readable(store.unreadable) and \
                    self._back_as_opened(store):  # fmt: skip
                logger.info("store %r is available again: %s can be read now", store.name, store.unreadable)
                store.problem, store.unreadable = None, None
            return
        service = store.latest
        try:
            service.store.check_unchanged()
        except StoreReadError as error:  # the disk failed a look, which may work next time: served as it was
            logger.warning("checking store %r failed: %s", store.name, scrubbed(str(error)))
            return
        except StoreFormatError as error:
            if reopener is not None and not attempted and reopener.due(True):  # a store at a URL rebuilt on its server
                failure = self.reopen(store, reopener)
                if failure is None:
                    return
            reopening = f"; opening it again failed: {failure}" if failure is not None else ""
            store.fail(type(error)(f"{error}{reopening}"), service)
            return
        if failure is not None:
            logger.warning("store %r changed on disk but cannot be opened again: %s; it is served as it was "
                           "opened", store.name, failure)  # fmt: skip

    @staticmethod
    def _back_as_opened(store: ServedStore) -> bool:
        """Whether the unavailable store's files are the ones it opened again (a folder moved away and back), which
        no reopen notices: its stamp is the one it was opened with (review47 F3)."""
        try:
            store.latest.store.check_unchanged()
        except (StoreFormatError, StoreReadError):  # a failed look proves nothing back (review49 F1)
            return False
        return True

    def reopen(self, store: ServedStore, reopener: Reopener) -> str | None:
        """Open `store` again as at start-up and serve the new copy from its next batch on (None), or say why that
        failed (it is tried again once the store's files change)."""
        stamp = reopener.stamp()
        before = store.description.get("info", {}).get("passages")
        started = time.monotonic()
        try:
            fresh = reopener.open(store.latest)
        except Exception as error:  # noqa: BLE001 (any failure leaves the store as it is)
            reopener.gave_up(stamp)
            return scrubbed(str(error) if isinstance(error, DilstoreError) else f"{type(error).__name__}: {error}")
        if fresh.service.endpoint != store.latest.endpoint:
            fresh.service.close()
            reopener.gave_up(stamp)
            return (f"the folder now holds a store of kind {fresh.description.get('info', {}).get('kind')}, which "
                    f"answers {fresh.service.endpoint}, not {store.latest.endpoint} (a restart serves it so)")
        store.take(fresh)
        self.batchers[store.name].run_soon(store.swap)  # at once when idle: the old copy's files go
        reopener.succeeded(stamp)
        logger.info("opened again: %s (it held %s passages; opened in %.2f s)", fresh.summary(), _count(before),
                    time.monotonic() - started)
        return None

    def health(self) -> JSONResponse:
        """200 naming the stores, or 503 naming those that became unavailable and why (as found so far)."""
        problems = {store.name: store.problem for store in self.stores if store.problem is not None}
        if problems:
            return JSONResponse({"status": "unavailable", "stores": self.names, "problems": problems}, status_code=503)
        return JSONResponse({"status": "ok", "stores": self.names})

    def descriptions(self) -> dict[str, Any]:
        """/stores: each store's name, endpoint, `dilstore info --json` and model, and its problem if it has one."""
        return {
            "stores": [
                {"name": store.name, "endpoint": store.latest.endpoint, **store.description,
                 **({} if store.problem is None else {"problem": store.problem})}
                for store in self.stores
            ]
        }  # fmt: skip


def add_request_handling(app: FastAPI, metrics: Metrics, *, access_log: bool = False) -> None:
    """Count every request in `metrics`, log it with `access_log` (access_line), refuse oversized bodies by their
    declared length, and answer bodies that cannot be decoded or validated with a 422 that says why."""

    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        endpoint = request.url.path if request.url.path in ENDPOINTS else "other"
        started = time.perf_counter()
        metrics.in_flight(endpoint, 1)
        status, retry_later = 500, False
        noted: dict[str, str] = {}
        _REQUEST_STORE.set(noted)
        try:
            try:
                response = too_large(request) or encoded(request) or await call_next(request)
            except asyncio.CancelledError:  # --shutdown-timeout ended a request still unfinished (a stalled client)
                response = JSONResponse({"detail": "the server shut down before this request was complete"}, 503)
            status, retry_later = response.status_code, "retry-after" in response.headers
            return response
        finally:
            seconds = time.perf_counter() - started
            metrics.in_flight(endpoint, -1)
            metrics.count_request(endpoint, status, seconds, retry_later=retry_later, store=noted.get("store"))
            if access_log:
                access_logger.info("%s", access_line(request, status, seconds, noted.get("store")))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        # FastAPI answers a body it cannot read with 400 "There was an error parsing the body"; the cause it was
        # raised from says why: the client left mid-body, or the bytes are not JSON (not UTF-8, nested too deep, an
        # integer of thousands of digits).
        if error.status_code == 400 and error.detail == UNPARSED_BODY and isinstance(error.__cause__, ClientDisconnect):
            return Response(status_code=CLIENT_GONE)
        if error.status_code == 400 and error.detail == UNPARSED_BODY and error.__cause__ is not None:
            # Python's own advice for a number of over 4,300 digits ("; use sys.set_int_max_str_digits() ...")
            # is for the server, not its client.
            reason = str(error.__cause__).split("; use sys.", 1)[0]
            return JSONResponse({"detail": f"the body is not valid JSON: {reason}"}, status_code=422)
        if error.status_code == 413:  # the routes' max_body_size: a chunked body that passed the cap as it arrived
            message = f"the request body passed {MAX_BODY_BYTES:,} bytes, the most the server reads"
            return JSONResponse({"detail": message}, status_code=413)
        return await http_exception_handler(request, error)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI reads a body of another declared type as bytes, which then fail as "not a dictionary".
        content_type = request.headers.get("content-type")
        if not is_json_type(content_type):
            declared = "has no content-type" if content_type is None else f"has content-type {content_type!r}"
            return JSONResponse({"detail": f"the body must be JSON, sent with content-type application/json; this "
                                           f"request {declared}"}, status_code=422)
        # FastAPI's own handler echoes each bad input back, and fails with a 500 on a NaN or infinity.
        details = [{"type": e["type"], "loc": list(e["loc"]), "msg": _message(e)} for e in error.errors()]
        return JSONResponse({"detail": details}, status_code=422)


def access_line(request: Request, status: int, seconds: float, store: str | None) -> str:
    """A request's access-log line: client, method, path, HTTP version, status, seconds and the store it was sent to.

    uvicorn's own line (obs57 F2) had no duration and no store, so a slow or failing store could not be told from
    the log, and it held the query string, where a client's proxy token or key would be written to the log; the
    server reads no query string. The path is quoted as uvicorn does, so a percent-encoded newline cannot forge a
    line.
    """
    client = f"{request.client.host}:{request.client.port}" if request.client else "-"
    path = urllib.parse.quote(request.url.path)
    version = request.scope.get("http_version", "1.1")
    line = f'{client} - "{request.method} {path} HTTP/{version}" {status} {seconds:.3f}s'
    return line if store is None else f"{line} store={json.dumps(store, ensure_ascii=True)}"


def _message(error: dict[str, Any]) -> str:
    """A validation error's message, saying why JSON did not parse ("JSON decode error" did not) and that an empty
    body is empty ("Field required" of the body did not)."""
    if error["type"] == "json_invalid":
        where = f" at character {error['loc'][1]}" if len(error["loc"]) > 1 else ""
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}{where}"
    if error["type"] == "missing" and tuple(error["loc"]) == ("body",):
        return "the body is empty; send a JSON object"
    return error["msg"]


def is_json_type(content_type: str | None) -> bool:
    """Whether a content-type header declares JSON (application/json or application/*+json, any parameters): the
    bodies FastAPI parses as JSON (it reads any other, and one with no content-type, as bytes)."""
    if content_type is None:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def encoded(request: Request) -> JSONResponse | None:
    """A 415 for a body sent with a content-encoding (gzip, ...), which the server does not decode; else None.

    Read as it came, a gzip body was "not valid JSON: 'utf-8' codec can't decode byte 0x8b".
    """
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return None
    return JSONResponse({"detail": f"the server reads bodies sent without a content-encoding; this request's is "
                                   f"{encoding!r}"}, status_code=415)  # fmt: skip


def too_large(request: Request) -> JSONResponse | None:
    """A 413 for a request whose declared body is over MAX_BODY_BYTES, before any of it is read; else None.

    A request body is a question or a query with at most MAX_TOP_P-ish ids: kilobytes. So a client cannot make the
    server read and parse megabytes per request. A chunked body (no Content-Length) is cut by the routes'
    max_body_size as it arrives instead.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        message = f"the request body is {int(declared):,} bytes; the server reads at most {MAX_BODY_BYTES:,}"
        return JSONResponse({"detail": message}, status_code=413)
    return None


class ClientGone(Exception):
    """The client of a request left before its answer was ready."""


async def while_connected(work: Awaitable[T], receive: Receive) -> T:
    """`await work`, unless the client leaves first: then ClientGone, with `work` cancelled.

    `receive` is the request's ASGI channel, its body already read: what comes next is the disconnect. A
    Batcher skips a cancelled job still queued and drops the answer of one in its batch; without the watch,
    requests whose clients had timed out were computed all the same, and 20 of them made the next real /ask
    wait 8 s instead of 1.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not watch.cancelled() and watch.exception() is None:
            raise ClientGone
        return await task  # done, or the watch failed: the work goes on unwatched
    finally:
        watch.cancel()
        task.cancel()  # a no-op once it is done; the client gone or the handler cancelled (a shutdown): stop it


async def _disconnect(receive: Receive) -> None:
    """Return once the ASGI channel says the client disconnected."""
    while (await receive())["type"] != "http.disconnect":
        pass


def add_routes(app: FastAPI, router: StoreRouter) -> None:
    """/ask, /rerank, /health (GET and HEAD), /stores and /metrics."""

    # max_body_size counts a chunked body (no Content-Length), which too_large cannot see, as it arrives.
    @app.post(ASK, summary="Answer a question (the JSON of `dilstore ask --json`)", max_body_size=MAX_BODY_BYTES,
              responses=query_responses(AskAnswer))
    async def ask(request: AskRequest, connection: Request) -> Response:
        return await router.answer(request, ASK, connection.receive)

    @app.post(RERANK, summary="Score documents of an EARL or Listformer store against a query, best first",
              max_body_size=MAX_BODY_BYTES, responses=query_responses(RerankAnswer))
    async def rerank(request: RerankRequest, connection: Request) -> Response:
        return await router.answer(request, RERANK, connection.receive)

    @app.get("/health", summary="200 once every store is loaded; 503 naming the stores that became unavailable",
             responses=HEALTH_RESPONSES)
    async def health() -> JSONResponse:
        # The checks run off the event loop, and /health waits for them at most HEALTH_CHECK_SECONDS: a store at a
        # URL reads its manifest again, and a silent storage server held every request, then every /health.
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.to_thread(router.check_stores)), HEALTH_CHECK_SECONDS)
        except TimeoutError:
            pass
        except RuntimeError as error:  # answered from the stores' last checks: the watch checks them again
            if not thread_refused(error):
                raise
            logger.warning("/health answers from the stores' last checks: %s", NO_THREAD)
        return router.health()

    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)  # for probes that use HEAD

    @app.get("/stores", summary="Each store's `dilstore info --json`, its endpoint and model",
             response_class=JSONResponse)
    async def list_stores() -> JSONResponse:
        return JSONResponse(router.descriptions())

    @app.get("/metrics", summary="Prometheus text exposition", response_class=PlainTextResponse,
             responses=METRICS_RESPONSES)
    async def metrics_text() -> Response:
        return Response(router.metrics.render(), media_type=CONTENT_TYPE)
