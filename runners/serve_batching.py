"""Cross-request batching for the query server: one bounded queue and one worker thread per store.

The event loop only enqueues and awaits; the worker thread owns the store's
model, so blocking model work never runs on the loop and one model is never
used by two threads at once (tokenizers and the JVM's searcher included).

**When a batch starts.** The worker takes the oldest request. If nothing else
is waiting, it runs it at once: an idle server adds no delay. If others are
waiting (the server is under load), it adds them in arrival order while their
pairs fit in `max_batch_pairs`, and waits up to `max_wait` seconds for more
until the batch is full. A request larger than `max_batch_pairs` runs alone;
`max_batch_pairs=1` turns batching off.

**Failures.** `run_batch(payloads)` returns one outcome per payload: a result,
or the exception that payload alone caused (a bad question). If it raises
instead, the shared work failed, so each payload is run again alone and only
the ones that fail alone get the exception.

**Overload.** At most `queue_size` requests wait; `submit` raises Overloaded
beyond that, which the app answers with 503 and Retry-After.

**Memory.** After a batch that leaves no request waiting, the worker hands the
memory freed so far back to the operating system (`return_freed_memory`).
glibc's malloc keeps it otherwise: batches of varying shapes grew a server's RSS
from 1.0 to 3.6 GB in 21 minutes of /ask traffic, still rising, though no
object was kept alive. A trim takes time (BENCHMARKS.md), so a busy worker
goes on to its next batch first, but trims all the same once TRIM_EVERY_SECONDS
passed since its last trim, so that a queue that is never empty does not grow.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dilstore.runners.serve_metrics import Metrics
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreChangedError, StoreReadError

logger = logging.getLogger("dilstore.serve")

# run_batch(payloads) -> one result or exception per payload.
BatchRunner = Callable[[Sequence[Any]], Sequence[Any]]

DEFAULT_MAX_BATCH_PAIRS = 256
DEFAULT_MAX_WAIT_MS = 10.0
MAX_WAIT_LIMIT_MS = 60_000.0  # a batch that waits longer helps no one; inf overflowed the batcher's clock
DEFAULT_QUEUE_SIZE = 256
DEFAULT_MAX_TOP_P = 100
# How often a worker whose queue never empties still trims: a trim took about 48 ms under load (soak39), so 1% of
# its time, while memory grows by a few MB at most in between.
TRIM_EVERY_SECONDS = 5.0


@dataclass(frozen=True)
class ServeSettings:
    """Batching and admission limits shared by every store.

    max_batch_pairs: pairs (each /ask request counts its top_p) run together
        in one batch of the interaction layers; 1 turns batching off.
    max_wait: seconds a batch under load waits for more requests.
    queue_size: requests that may wait per store before 503.
    max_top_p: the largest top_p, bm25_top_k or number of doc_ids one request may ask for.
    access_log: log one line per request (`--access-log`).
    """

    max_batch_pairs: int = DEFAULT_MAX_BATCH_PAIRS
    max_wait: float = DEFAULT_MAX_WAIT_MS / 1000
    queue_size: int = DEFAULT_QUEUE_SIZE
    max_top_p: int = DEFAULT_MAX_TOP_P
    access_log: bool = False

    def __post_init__(self) -> None:
        for name in ("max_batch_pairs", "queue_size", "max_top_p"):
            if getattr(self, name) < 1:
                raise DilstoreError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.max_wait <= MAX_WAIT_LIMIT_MS / 1000:  # NaN fails too: it made the batcher spin forever
            raise DilstoreError(f"max-wait-ms must be from 0 to {MAX_WAIT_LIMIT_MS:g}, got {self.max_wait * 1000:g}")


class Overloaded(Exception):
    """The store's queue is full; the client should retry later."""


@dataclass
class _Job:
    payload: Any
    pairs: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    """A store's bounded request queue and the worker thread that runs its batches."""

    def __init__(
        self,
        name: str,
        run_batch: BatchRunner,
        *,
        max_batch_pairs: int,
        max_wait: float,
        queue_size: int,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.max_batch_pairs = max_batch_pairs
        self.max_wait = max_wait
        self.queue_size = queue_size
        self._run_batch = run_batch
        self._metrics = metrics
        self._queue: collections.deque[_Job] = collections.deque()
        self._chores: list[Callable[[], None]] = []  # run on the worker thread before its next batch
        self._condition = threading.Condition()
        self._stopping = False
        self._last_trim = time.monotonic()
        self._thread = threading.Thread(target=self._work, name=f"dilstore-serve-{name}", daemon=True)
        metrics.watch_queue(name, self.pending)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Run what is still queued, then end the worker thread (the server's drain on shutdown); whether it ended
        within `timeout` seconds (None: however long it takes)."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def abandon(self) -> int:
        """Drop what is queued and let the worker thread end once its batch in progress ends (a forced quit); how
        many requests were dropped. `join` waits for the thread."""
        with self._condition:
            dropped = len(self._queue)
            self._queue.clear()
            self._stopping = True
            self._condition.notify()
        return dropped

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the worker thread to end; whether it has.

        The thread must end before the interpreter does: one still inside
        torch when it exited aborted the process (SIGABRT), and one that
        finished its batch posted to a closed event loop.
        """
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def run_soon(self, chore: Callable[[], None]) -> None:
        """Run `chore` on the worker thread before its next batch, at once when it is idle: work that must not
        overlap a batch (a reopened store's swap, which closes the copy the batches read)."""
        with self._condition:
            self._chores.append(chore)
            self._condition.notify()

    def pending(self) -> int:
        """Requests waiting for a batch (not counting the batch that is running)."""
        with self._condition:
            return len(self._queue)

    async def submit(self, payload: Any, pairs: int) -> Any:
        """Queue one request of `pairs` pairs and wait for its result (or its exception, raised here)."""
        loop = asyncio.get_running_loop()
        job = _Job(payload, max(1, pairs), loop, loop.create_future())
        with self._condition:
            if self._stopping:
                raise Overloaded(f"store {self.name!r} is shutting down")
            if len(self._queue) >= self.queue_size:
                raise Overloaded(f"store {self.name!r} has {len(self._queue)} requests queued, its limit")
            self._queue.append(job)
            self._condition.notify()
        try:
            return await job.future
        except asyncio.CancelledError:  # its client left (or a shutdown's timeout): its queue slot is free again
            with self._condition, contextlib.suppress(ValueError):  # already taken by the worker
                self._queue.remove(job)
            raise

    # ------------------------------------------------------------------ worker thread

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._run_chores()
            batch = [job for job in batch if not job.future.cancelled()]  # its client is gone (a shutdown's timeout)
            if not batch:
                continue
            started = time.perf_counter()
            self._metrics.observe_batch(
                self.name, len(batch), sum(job.pairs for job in batch), [started - job.enqueued for job in batch]
            )
            for job, outcome in zip(batch, self._outcomes([job.payload for job in batch]), strict=True):
                with contextlib.suppress(RuntimeError):  # its loop closed: a forced quit left no one to answer
                    job.loop.call_soon_threadsafe(_settle, job.future, outcome)
            # Idle, no waiting request pays for the trim; busy, one does only every TRIM_EVERY_SECONDS.
            if not self.pending() or time.monotonic() - self._last_trim >= TRIM_EVERY_SECONDS:
                return_freed_memory()
                self._last_trim = time.monotonic()

    def _run_chores(self) -> None:
        """Run the chores given so far (`run_soon`); one that fails is logged, and the worker goes on."""
        with self._condition:
            chores, self._chores = self._chores, []
        for chore in chores:
            try:
                chore()
            except Exception:  # noqa: BLE001 (a chore's failure must not end the store's worker)
                logger.exception("store %r: a task between batches failed", self.name)

    def _next_batch(self) -> list[_Job] | None:
        """The next batch (see the module docstring); empty when woken only for chores; None once stopping with
        nothing queued."""
        with self._condition:
            while not self._queue and not self._stopping and not self._chores:
                self._condition.wait()
            if not self._queue:
                return [] if self._chores else None
            batch = [self._queue.popleft()]
            pairs = batch[0].pairs
            if not self._queue:
                return batch  # idle: no delay
            deadline = time.monotonic() + self.max_wait
            while True:
                while self._queue and pairs + self._queue[0].pairs <= self.max_batch_pairs:
                    batch.append(self._queue.popleft())
                    pairs += batch[-1].pairs
                remaining = deadline - time.monotonic()
                if self._queue or pairs >= self.max_batch_pairs or self._stopping or remaining <= 0:
                    return batch
                self._condition.wait(remaining)

    def _outcomes(self, payloads: list[Any]) -> list[Any]:
        """run_batch's outcomes; if the shared run raises, each payload's outcome when run alone, unless no payload
        alone would fare otherwise: the store changed, or a read failed in transit (already tried again). A read
        refused for good (a 403 on one shard's file, a local disk's I/O error) was tried once and may be one file's:
        the payloads that do not read it are answered alone (review52 F1)."""
        try:
            return list(self._run_batch(payloads))
        except StoreChangedError as error:  # the store changed under it: each alone would meet the same change
            return [error] * len(payloads)
        except Exception as error:  # noqa: BLE001 (any failure of the shared run is retried request by request)
            if len(payloads) == 1 or _failed_in_transit(error):
                return [error] * len(payloads)
            logger.warning("a batch of %d requests failed (%s: %s); running each alone", len(payloads),
                           type(error).__name__, error)  # fmt: skip
        outcomes: list[Any] = []
        for payload in payloads:
            try:
                outcomes.extend(self._run_batch([payload]))
            except Exception as error:  # noqa: BLE001 (the failure belongs to this payload alone)
                outcomes.append(error)
        return outcomes


def _failed_in_transit(error: Exception) -> bool:
    """Whether `error` is a remote read that failed in transit, READ_ATTEMPTS reads with their waits: each payload
    alone waited them again, 8 clients of a stalled server 149 s (remote52 F4); each is told at once to try again."""
    return isinstance(error, StoreReadError) and error.in_transit


def return_freed_memory() -> None:
    """Give the operating system back the free memory malloc holds (glibc's `malloc_trim`; elsewhere nothing)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (AttributeError, OSError):
        return None


_MALLOC_TRIM = _malloc_trim()


def _settle(future: asyncio.Future, outcome: Any) -> None:
    """Hand an outcome to its awaiting request, unless the request was cancelled meanwhile."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
