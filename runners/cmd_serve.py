"""`dilstore serve`: an HTTP query server (FastAPI on uvicorn) over mounted stores.

Every store is opened once at start-up, before the server answers (its port is taken first): its model
(checked against the store's fingerprint, so a store made by another model
stops the command with exit 2), its memory maps and, for a `dilbert` store, its
BM25 index (the JVM starts in this process; uvicorn runs one process and never
forks); once it changes on disk, it is opened again the same way (runners/serve_reopen.py).
The app, its services and its batching are in runners/serve_app.py,
serve_services.py and serve_batching.py.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.arg_types import positive_int
from dilstore.runners.collector import loading_for_good
from dilstore.runners.odqa_options import local_index_folder
from dilstore.runners.quiet import to_null_device
from dilstore.runners.reading_options import add_runtime_arguments, apply_threads
from dilstore.runners.serve_batching import (
    DEFAULT_MAX_BATCH_PAIRS,
    DEFAULT_MAX_TOP_P,
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_QUEUE_SIZE,
    TRIM_EVERY_SECONDS,
    ServeSettings,
)
from dilstore.runners.serve_batching import logger as serve_log
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import DILBERT  # the kind of store /ask reads; every other kind is reranked

if TYPE_CHECKING:  # imported lazily at run time, so that `dilstore --help` stays fast
    import uvicorn

    from dilstore.runners.serve_server import StopServer
    from dilstore.runners.serve_services import ServedStore, Service
    from dilstore.storage.reader import Store

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_SHUTDOWN_TIMEOUT = 30
DEFAULT_REQUEST_TIMEOUT = 60
LISTEN_BACKLOG = 2048  # uvicorn's default backlog


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="HTTP query server over mounted stores (/ask, /rerank, /health, /stores, /metrics, /docs)",
        description=(
            "Open each STORE (model checked against the store's fingerprint, memory maps, BM25 index) and "
            "answer over HTTP: POST /ask on dilbert stores (the JSON of `dilstore ask --json`), POST /rerank on "
            "earl-s1/earl-s2 and listformer stores, GET /health, /stores, /metrics (Prometheus) and /docs. "
            "Concurrent /ask requests share batches of the interaction layers. A store that changes on disk (an "
            "append, a compaction, a rebuilt BM25 index) is opened again and served as it is now, without a "
            "restart. Ctrl-C, SIGTERM or SIGHUP answers "
            "the requests in flight, then exits 0; a second one quits at once (the requests in flight get 503). "
            f"A store worker hands the memory its batches freed back to the OS when idle, and every "
            f"{TRIM_EVERY_SECONDS:g} s when busy."
        ),
    )
    parser.add_argument(
        "stores", nargs="+", metavar="STORE",
        help="store directory or fsspec URL (http://, s3://, ...), or NAME=STORE to name it in requests "
             "(default name: the last component of its path)",
    )  # fmt: skip
    parser.add_argument(
        "--index", action="append", metavar="NAME=DIR", default=[],
        help="local Lucene BM25 index of the store named NAME (default: STORE/bm25 of a local store); a dilbert "
             "store given as a URL needs one, since Lucene reads only local files",
    )  # fmt: skip
    parser.add_argument(
        "--model", type=Path, action="append",
        help="checkpoint that made the stores: once for all stores, or once per STORE in order "
             "(default: the shipped reader for dilbert stores, the shipped EARL ranker for earl stores, the shipped "
             "Listformer for listformer stores)",
    )  # fmt: skip
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--max-batch-pairs", type=positive_int, default=DEFAULT_MAX_BATCH_PAIRS,
        help="question-passage pairs of concurrent /ask requests run as one batch (each request counts its "
             f"top_p); 1 turns batching off (default {DEFAULT_MAX_BATCH_PAIRS})",
    )  # fmt: skip
    parser.add_argument(
        "--max-wait-ms", type=float, default=DEFAULT_MAX_WAIT_MS,
        help="under load, how long a batch waits for more requests; an idle server runs a request at once "
             f"(default {DEFAULT_MAX_WAIT_MS:g})",
    )  # fmt: skip
    parser.add_argument(
        "--queue-size", type=positive_int, default=DEFAULT_QUEUE_SIZE,
        help=f"requests that may wait per store; more get 503 with Retry-After (default {DEFAULT_QUEUE_SIZE})",
    )  # fmt: skip
    parser.add_argument(
        "--max-top-p", type=positive_int, default=DEFAULT_MAX_TOP_P,
        help=f"largest top_p, bm25_top_k or number of doc_ids per request (default {DEFAULT_MAX_TOP_P})",
    )  # fmt: skip
    parser.add_argument(
        "--shutdown-timeout", type=positive_int, default=DEFAULT_SHUTDOWN_TIMEOUT, metavar="S",
        help="on Ctrl-C, SIGTERM or SIGHUP, seconds to wait for requests in flight before cancelling them, so that a "
             f"client that stalls mid-request cannot hold the server up (default {DEFAULT_SHUTDOWN_TIMEOUT})",
    )  # fmt: skip
    parser.add_argument(
        "--request-timeout", type=positive_int, default=DEFAULT_REQUEST_TIMEOUT, metavar="S",
        help="seconds a client has to send a whole request (headers and body) once it connects or starts one; a "
             "connection still owing part of it is closed, so that stalled clients cannot use up the server's "
             f"connections (default {DEFAULT_REQUEST_TIMEOUT})",
    )  # fmt: skip
    parser.add_argument("--access-log", action="store_true",
                        help="log one line per request: client, method, path (no query string), status, seconds, "
                             "store")
    add_runtime_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Open the stores, then serve until Ctrl-C or SIGTERM; 0 after a graceful shutdown.

    The arguments are checked, and every store's manifest read, every --model folder found and every BM25 index
    checked, before the first model stack loads; the web server is imported last. So a mistyped path, even of
    the last store, fails in a moment, not after some 10 s of imports and the first stores' models.
    """
    settings = ServeSettings(
        max_batch_pairs=args.max_batch_pairs,
        max_wait=args.max_wait_ms / 1000,
        queue_size=args.queue_size,
        max_top_p=args.max_top_p,
        access_log=args.access_log,
    )
    if not 0 <= args.port <= 65535:
        raise DilstoreError(f"--port must be between 0 and 65535, got {args.port}")
    listeners = listening_sockets(args.host, args.port)
    try:
        return serve_on(listeners, args, settings)
    finally:
        for listener in listeners:
            listener.close()


def serve_on(listeners: list[socket.socket], args: argparse.Namespace, settings: ServeSettings) -> int:
    """Open the stores and serve them on `listeners` until a stop signal (see `run`)."""
    with loading_for_good():
        server = _opened_server(args, settings)
    from dilstore.runners.serve_server import cancelled_requests_unlogged, shutdown_timeout_reworded

    with signals_end_cleanly(), hangup_stops(server), cancelled_requests_unlogged(), \
            shutdown_timeout_reworded(args.shutdown_timeout):  # fmt: skip
        server.run(sockets=listeners)
    return 0


def _opened_server(args: argparse.Namespace, settings: ServeSettings) -> StopServer:
    """The stores opened, each with its model and index, and the server that will serve them, not started yet."""
    named = [parse_store_argument(argument) for argument in args.stores]
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise DilstoreError(f"store names must differ, got {names}; name them as NAME=STORE")
    models = per_store_models(args.model, len(named))
    indexes = per_store_indexes(args.index, names)
    infos = check_stores_and_models(named, models)
    check_store_files(named)
    check_default_top_p(settings.max_top_p, [info["kind"] for info in infos])
    found = [
        served_index(name, path, info["kind"], indexes.get(name))
        for (name, path), info in zip(named, infos, strict=True)
    ]
    if any(index is not None for index in found):  # before torch and the models, which only take room (left60 F4)
        from dilstore.reader.retrieval import require_jvm_room

        require_jvm_room()
    apply_threads(args.threads)  # imports torch (2 s): after the checks, which a mistyped store failed after (ci59 F6)
    served = []
    for (name, path), model, index, info in zip(named, models, found, infos, strict=True):
        served.append(open_served_store(name, path, model, args.device, indexes.get(name), checked=(index, info)))
        print(f"dilstore serve: {served[-1].summary()}", file=sys.stderr)
    import uvicorn

    from dilstore.runners.serve_app import create_app
    from dilstore.runners.serve_protocol import serve_protocol
    from dilstore.runners.serve_server import StopServer

    app = create_app(served, settings)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, access_log=False, log_level="info", lifespan="on",
        timeout_graceful_shutdown=args.shutdown_timeout, http=serve_protocol(args.request_timeout),
        use_colors=log_colors(os.environ),
    )
    log_as_uvicorn_does()
    return StopServer(config)


def log_as_uvicorn_does() -> None:
    """Send the server's own records (its modules' `dilstore.serve` logger) through uvicorn's handlers, once
    uvicorn.Config has set them up: a store going out of service reads `ERROR:    store ...`, as uvicorn's own
    lines are marked.

    Without a handler they went through logging's last resort, bare: a log monitor that watches for ERROR and
    WARNING missed the server's most important event (serve46 F1).

    `--access-log`'s lines (`dilstore.serve.access`) go to stdout, in uvicorn's format, as uvicorn's own access log
    wrote them: since obs57 F2 they went to stderr, and `serve --access-log > access.log` found its file empty,
    the lines mixed into the error log (read57 F4).
    """
    uvicorn_handlers = logging.getLogger("uvicorn").handlers
    serve_log.handlers[:] = uvicorn_handlers
    serve_log.setLevel(logging.INFO)
    serve_log.propagate = False
    access: logging.Handler = logging.NullHandler() if sys.stdout is None else AccessLines(sys.stdout)
    access.setFormatter(next((handler.formatter for handler in uvicorn_handlers if handler.formatter), None))
    access_log = logging.getLogger(f"{serve_log.name}.access")
    access_log.handlers[:] = [access]
    access_log.setLevel(logging.INFO)
    access_log.propagate = False


class AccessLines(logging.StreamHandler):
    """`--access-log`'s handler: one line per request on `stream` (stdout), until it cannot be written.

    An output that fails (a pipe whose reader went away, `serve --access-log | head`; a full disk under
    `> access.log`) is said once in the server's log, pointed at the null device so that what its buffer holds goes
    nowhere, and its lines are dropped from then on; the server goes on. logging's own handling printed a
    "--- Logging error ---" block of some 50 lines, a traceback, on stderr for every request after it (json61 F2).
    An output full for a moment (EAGAIN) loses only the lines it cannot take (tail61b F2).
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.lost = False
        self.skipped = False  # a line was dropped for an output that was momentarily full (`handleError`)
        # A refused write or flush may leave the start of a line in the stream's buffers: which part of what they
        # held was taken, the errors do not say reliably (a text stream's `characters_written` counts a whole chunk).
        self.cut = False

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record's line, unless the output was lost; after a refused write, on a line of its own, not glued
        to the line cut short (at worst after an empty line)."""
        if self.lost:
            return
        try:
            line = self.format(record) + self.terminator
            self.stream.write("\n" + line if self.cut else line)
            self.flush()
            self.cut = False
        except Exception as error:  # noqa: BLE001 (logging's own handler shows all but the output's errors)
            self.cut = self.cut or isinstance(error, BlockingIOError)
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A write or flush that failed: the output is lost for good when it is the operating system's error, but for
        one that is momentarily full (EAGAIN on a stdout another process set non-blocking; EINTR): that line is
        dropped, said once, and the next ones are written. All were given up for it before (tail61b F2)."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        if isinstance(error, (BlockingIOError, InterruptedError)):
            if not self.skipped:
                self.skipped = True
                serve_log.warning("--access-log: standard output is full for now (%s); the access lines it cannot "
                                  "take at once are dropped", error.strerror or error)  # fmt: skip
            return
        self.lost = True
        to_null_device(self.stream)
        serve_log.warning("--access-log: standard output cannot be written (%s); access lines are dropped from now on",
                          error.strerror or error)  # fmt: skip


def log_colors(environment: Mapping[str, str]) -> bool | None:
    """uvicorn's `use_colors`: none when NO_COLOR is set to anything (https://no-color.org), else its own choice
    (colours on a terminal)."""
    return False if environment.get("NO_COLOR") else None


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """The sockets the server will answer on, one per address `host` names (localhost: ::1 and 127.0.0.1), bound
    and listening before any store is opened; a DilstoreError naming --host/--port when one cannot be.

    Opening large stores takes a while. Found only after that, a port in use (or a host that does not resolve)
    was uvicorn's exit 3 with its own log lines; a port checked and let go first could be taken meanwhile, with the
    same end. Held from the start, it is the server's: a connection made while the stores load waits in its
    backlog until the server answers. Bound as uvicorn's asyncio binds (SO_REUSEADDR, IPv6 sockets IPv6 only);
    with port 0 every address gets the port the first one was given.
    """
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise DilstoreError(f"--host {host}: cannot resolve it ({error.strerror})") from None
    listeners: list[socket.socket] = []
    try:
        for family, kind, protocol, address in dict.fromkeys((f, k, p, a) for f, k, p, _, a in found):
            listener = socket.socket(family, kind, protocol)
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            chosen = listeners[0].getsockname()[1] if len(listeners) > 1 else address[1]
            listener.bind((address[0], chosen, *address[2:]))
            listener.listen(LISTEN_BACKLOG)
    except OSError as error:
        for listener in listeners:
            listener.close()
        raise DilstoreError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return listeners


def check_stores_and_models(named: Sequence[tuple[str, str]], models: Sequence[Path | None]) -> list[dict[str, Any]]:
    """Every store's info (its manifest read) and every given --model folder checked, in the order given."""
    from dilstore.reader.modeling.checkpoints import require_checkpoint_dir
    from dilstore.storage.info import store_info

    infos = [store_info(path) for _, path in named]
    for model in models:
        if model is not None:
            require_checkpoint_dir(model)
    return infos


def check_store_files(named: Sequence[tuple[str, str]]) -> None:
    """A DilstoreError when a local store's files are not as its manifest records (damage already on disk: the
    first request to meet it took the store out of service, and a restart brought it back to fail again), or
    when the stores' mapped files would not fit this process's open-file limit (reads failed part-way through)."""
    from dilstore.runners.open_files import raise_open_file_limit
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest
    from dilstore.storage.mapped import OTHER_OPEN_FILES, mapped_files
    from dilstore.storage.verify import size_problems

    mapped = 0
    for name, path in named:
        location = StoreLocation.parse(path)
        if location.local_root is None:  # read through zarr over HTTP: nothing mapped, sizes checked at each read
            continue
        manifest = read_manifest(location)
        problems = size_problems(location, manifest)
        if problems:
            more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
            raise DilstoreError(f"store {name!r} is damaged: {'; '.join(problems[:3])}{more}; `dilstore verify "
                                f"{path}` checks it, a new precompute mends it")  # fmt: skip
        mapped += mapped_files(manifest)
    limit = raise_open_file_limit()
    if mapped + OTHER_OPEN_FILES > limit:
        raise DilstoreError(
            f"the stores map up to {mapped} files, each holding an open file while the server runs, and this process "
            f"may open only {limit} files in all; raise the limit to at least {mapped + OTHER_OPEN_FILES} (ulimit -n, "
            "or LimitNOFILE= for a systemd service)"
        )


def check_default_top_p(max_top_p: int, kinds: Sequence[str]) -> None:
    """A DilstoreError when a dilbert store is served and --max-top-p is below /ask's default top_p: every request
    that leaves top_p out would be refused, with a count its client never sent."""
    from dilstore.reader.serving.answers import DEFAULT_TOP_P

    if DILBERT in kinds and max_top_p < DEFAULT_TOP_P:
        raise DilstoreError(f"--max-top-p {max_top_p} is below /ask's default top_p {DEFAULT_TOP_P}, so every /ask "
                            f"without top_p would be refused; give --max-top-p {DEFAULT_TOP_P} or more")  # fmt: skip


def parse_store_argument(argument: str) -> tuple[str, str]:
    """`NAME=STORE` or `STORE` (named by the last component of its path) as (name, store path or URL).

    The store stays a string: a URL such as http://host/store is no local path. A folder here whose name holds "="
    (`k=3`) is that folder when the STORE of a NAME=STORE reading (`3`) is not there: it was "no store at 3"
    (port58 F7).
    """
    name, separator, store = argument.partition("=")
    whole_folder = os.path.isdir(argument) and not os.path.exists(store)
    if separator and name and "/" not in name and not whole_folder:
        return name, store
    if "://" in argument:
        return argument.rstrip("/").rsplit("/", 1)[-1], argument
    # As given, not resolved: a store served through a link (`current` -> `store-v7`, a deployment's switch) was named
    # by the link's target, so requests for "current" were for an unknown store (port58 F9).
    return Path(os.path.abspath(argument)).name, argument


def per_store_indexes(indexes: Sequence[str], names: Sequence[str]) -> dict[str, Path]:
    """`--index NAME=DIR` options as {store name: index folder}; a NAME that names no store is an error.

    NAME is what stands before the first "=" that ends a served store's name: a store served as the folder `k=3`
    (named `k=3`) could not be given an index, `--index k=3=DIR` naming the store "k" (left58b F4).
    """
    chosen = {}
    for option in indexes:
        ends = [end for end, character in enumerate(option) if character == "=" and option[:end] in names]
        name, separator, directory = (option[: ends[0]], "=", option[ends[0] + 1 :]) if ends else option.partition("=")
        if not separator or not directory:
            raise DilstoreError(f"--index takes NAME=DIR, got {option!r}")
        if name not in names:
            raise DilstoreError(f"--index {option}: no store is named {name!r} (stores: {', '.join(names)})")
        chosen[name] = local_index_folder(directory, f"--index {name}=")
    return chosen


def per_store_models(models: Sequence[Path] | None, stores: int) -> list[Path | None]:
    """--model given never (defaults), once (every store) or once per store."""
    if not models:
        return [None] * stores
    if len(models) == 1:
        return list(models) * stores
    if len(models) != stores:
        raise DilstoreError(f"give --model once, or once per store: got {len(models)} for {stores} stores")
    return list(models)


def open_served_store(
    name: str,
    path: str,
    model: Path | None,
    device: str | None,
    index: Path | None = None,
    *,
    checked: tuple[Path | None, dict[str, Any]] | None = None,
    reuse: Service | None = None,
) -> ServedStore:
    """Open one store with its checked model as an AskService (dilbert) or RerankService (earl-s1/earl-s2/listformer),
    with a Reopener that opens it again this way once it changed on disk.

    index: the BM25 index `--index` gave (default STORE/bm25); a rerank store
    needs none, and gets retrieval only where one exists. checked: the index
    `served_index` found and checked, and the store's `store_info`, when `run`
    has done that with every store's files (`check_store_files`); without it,
    all three are done here. reuse: the service of the copy served now, when
    the Reopener opens the store again; its model is kept if the store's
    fingerprint did not change (an append, a compaction, a rebuilt index).
    """
    from dilstore.storage.info import store_info
    from dilstore.storage.location import StoreLocation, redacted

    if checked is None:  # first: a path without a store is named before the model stack loads
        info = store_info(path)
        found = served_index(name, path, info["kind"], index)
        check_store_files([(name, path)])
    else:
        found, info = checked
    from dilstore.reader.retrieval import Bm25Searcher, bm25_index_dir, require_all_passages
    from dilstore.reader.serving.odqa import open_reader
    from dilstore.reader.serving.rerank import open_reranker
    from dilstore.reader.serving.store_checks import RERANK_KINDS
    from dilstore.runners.serve_reopen import Reopener, files_stamp
    from dilstore.runners.serve_services import AskService, RerankService, ServedStore

    watched = index if index is not None or StoreLocation.parse(path).local_root is None else bm25_index_dir(path)
    stamp = functools.partial(files_stamp, path, watched)
    opened = stamp()  # before the store is read: a change while it opens is seen at the next check
    variant = None  # the online layers tuned for the store's encoding, when the reader swapped them in
    if info["kind"] in RERANK_KINDS:
        reranker = open_reranker(path, model, device=device,
                                 reuse=reuse.reranker if isinstance(reuse, RerankService) else None)
        searcher = Bm25Searcher(found) if found is not None else None
        if searcher is not None:
            require_all_passages(searcher, reranker.store.manifest, path)
        service: AskService | RerankService = RerankService(reranker, searcher)
        reranker.store.check_files = True  # a file cut under the server's maps would kill it (storage/mapped.py)
    else:
        odqa = open_reader(path, model, index_dir=found, device=device,
                           reuse=reuse.odqa if isinstance(reuse, AskService) else None)
        service = AskService(odqa)
        odqa.store.check_files = True
        variant = odqa.model.online_variant
    check_reads(name, service.store)
    description = {"path": redacted(path),  # /stores is open to any client: never the storage password
                   "model": str(model) if model is not None else "default", "online_variant": variant, "info": info}

    def reopen(served: Service) -> ServedStore:
        """The store opened again as now, keeping `served`'s model where the fingerprint did not change."""
        return open_served_store(name, path, model, device, index, reuse=served)

    reopener = Reopener(reopen, stamp, opened)
    return ServedStore(name, service, description, reopener=reopener)


def check_reads(name: str, store: Store) -> None:
    """A DilstoreError when a store at a URL cannot be read as requests read it: one passage is fetched.

    Opening a store reads whole files (the manifest, the id index); requests read byte ranges. A web server that
    answers a range with the whole file (`python -m http.server`) started a server whose /health said 200 while every
    request to that store got 502 (multi53 F2). A local store is memory-mapped and its files checked already.
    """
    if store.location.local_root is not None:
        return
    first = next((entry for entry in store.manifest.shards if entry.passages), None)
    if first is None:
        return
    try:
        store.fetch([store.shard(first.index).id_at(0)])
    except DilstoreError as error:
        raise DilstoreError(f"store {name!r} cannot be read: {error}") from None


def served_index(name: str, path: str, kind: str, given: Path | None) -> Path | None:
    """The BM25 index a store is served with, checked to cover the store as it is: `--index`, else STORE/bm25.

    A dilbert store needs one (/ask retrieves); a rerank store searches it for bm25_top_k only, so without one
    (none given, none at STORE/bm25, or a store at a URL) it gets None and requests must give doc_ids.
    """
    from dilstore.reader.retrieval import bm25_index_dir, check_index_covers, holds_lucene_index, require_index_files
    from dilstore.storage.location import StoreLocation, redacted
    from dilstore.storage.manifest import read_manifest

    if given is not None:
        index: Path | None = given
    elif StoreLocation.parse(path).local_root is not None:
        default = bm25_index_dir(path)
        index = default if kind == DILBERT or holds_lucene_index(default) else None
    elif kind == DILBERT:
        raise DilstoreError(f"store {redacted(path)} is not on the local filesystem, and its BM25 index must be "
                            "(Lucene reads only local files): give a local copy of the store's bm25/ folder with "
                            f"--index {name}=DIR")
    else:
        index = None
    if index is None:
        return None
    require_index_files(index, path, given=given is not None, local_root=StoreLocation.parse(path).local_root)
    check_index_covers(index, read_manifest(StoreLocation.parse(path)), path)
    return index


@contextlib.contextmanager
def hangup_stops(server: uvicorn.Server) -> Iterator[None]:
    """SIGHUP stops the server gracefully, as SIGTERM does, instead of killing it mid-request (its default).

    A server started from a terminal or an ssh session gets SIGHUP when that
    session goes away; uvicorn handles only SIGINT and SIGTERM. Under `nohup`
    (SIGHUP ignored) it is left ignored: the server must outlive the session.
    """
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGHUP, lambda _, frame: server.handle_exit(signal.SIGTERM, frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


@contextlib.contextmanager
def signals_end_cleanly() -> Iterator[None]:
    """Make SIGINT and SIGTERM no-ops outside uvicorn's own handling, restoring them afterwards.

    uvicorn shuts down gracefully on either signal and then raises the signal
    again for the handler that was installed before it: that would be the
    KeyboardInterrupt of Ctrl-C (exit 130) or termination by SIGTERM. A
    drained server has ended normally, so the re-raised signal is dropped.
    """
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
