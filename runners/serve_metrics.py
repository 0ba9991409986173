"""Prometheus text exposition (format 0.0.4) of the query server's counters and histograms.

Written here rather than taken from prometheus_client: the server needs four
metric families, and a small thread-safe registry keeps the serving install
free of another dependency. Worker threads observe batch sizes and queue
times while the event loop observes request latencies, so every update
holds the registry's lock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# nginx's "client closed request": the client went away after its headers, before its whole body came (it
# disconnected, or --request-timeout closed its connection). Nobody reads the answer; errors_total counts it as
# client_gone. A connection closed before its headers came reaches no endpoint: it is only logged.
CLIENT_GONE = 499

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    """A label value escaped as the exposition format asks (backslash, quote, newline), after a store name's lone
    surrogates (the bytes of a folder name that is not UTF-8) are written as Python escapes (`\\udcff`): the
    exposition is UTF-8, and /metrics was a 500 for good once such a store was served (unicode56 F9)."""
    text = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}"


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


@dataclass
class _Histogram:
    """Cumulative bucket counts, sum and count for one label set."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1


class Metrics:
    """The server's metric families; `render()` gives the /metrics body.

    Families: dilstore_requests_total (counter by endpoint and status code),
    dilstore_store_requests_total (counter of /ask and /rerank requests by the store they were sent to and status
    code),
    dilstore_errors_total (counter by endpoint and kind: bad_request, client_gone,
    overloaded, unavailable, store_read, internal), dilstore_request_seconds (latency histogram by
    endpoint), dilstore_queue_seconds (time a request waited for its batch,
    by store), dilstore_batch_requests and dilstore_batch_pairs (batch sizes,
    by store; pairs as the batcher counts them, asked for, not found),
    dilstore_requests_in_flight and dilstore_queue_depth (gauges).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = {"requests_total": {}, "store_requests_total": {},
                                                          "errors_total": {}}  # fmt: skip
        self._histograms: dict[str, dict[Labels, _Histogram]] = {
            "request_seconds": {},
            "queue_seconds": {},
            "batch_requests": {},
            "batch_pairs": {},
        }
        self._bounds = {
            "request_seconds": LATENCY_BUCKETS,
            "queue_seconds": LATENCY_BUCKETS,
            "batch_requests": BATCH_BUCKETS,
            "batch_pairs": BATCH_BUCKETS,
        }
        self._in_flight: dict[Labels, int] = {}
        self._queue_depths: dict[str, Callable[[], int]] = {}

    # ------------------------------------------------------------------ updates

    def count_request(self, endpoint: str, status: int, seconds: float, *, retry_later: bool = False,
                      store: str | None = None) -> None:
        """One finished request: its status and latency; 4xx and 5xx also count as errors.

        `retry_later`: the response asked the client to retry (Retry-After), which
        tells a 503 of a full queue from one of an unavailable store. `store`: the store a query request was sent
        to, None when it named none served here (or was refused before).
        """
        with self._lock:
            self._add("requests_total", (("endpoint", endpoint), ("code", str(status))), 1)
            if store is not None:
                self._add("store_requests_total", (("store", store), ("code", str(status))), 1)
            self._observe("request_seconds", (("endpoint", endpoint),), seconds)
            kind = _error_kind(status, retry_later)
            if kind is not None:
                self._add("errors_total", (("endpoint", endpoint), ("kind", kind)), 1)

    def observe_batch(self, store: str, requests: int, pairs: int, queue_seconds: Sequence[float]) -> None:
        """One batch run by a store's worker: its size, and how long each of its requests waited."""
        labels = (("store", store),)
        with self._lock:
            self._observe("batch_requests", labels, requests)
            self._observe("batch_pairs", labels, pairs)
            for seconds in queue_seconds:
                self._observe("queue_seconds", labels, seconds)

    def in_flight(self, endpoint: str, change: int) -> None:
        """Add `change` to the requests of `endpoint` being answered now."""
        labels = (("endpoint", endpoint),)
        with self._lock:
            self._in_flight[labels] = self._in_flight.get(labels, 0) + change

    def watch_queue(self, store: str, depth: Callable[[], int]) -> None:
        """Report `depth()` as the store's queue depth at each scrape."""
        with self._lock:
            self._queue_depths[store] = depth

    def _add(self, name: str, labels: Labels, value: float) -> None:
        family = self._counters[name]
        family[labels] = family.get(labels, 0) + value

    def _observe(self, name: str, labels: Labels, value: float) -> None:
        family = self._histograms[name]
        if labels not in family:
            family[labels] = _Histogram(self._bounds[name])
        family[labels].observe(value)

    # ------------------------------------------------------------------ exposition

    def render(self) -> str:
        """All families in the Prometheus text format, one HELP and TYPE line each."""
        lines: list[str] = []
        with self._lock:
            for name, kind, help_text in _FAMILIES:
                lines.append(f"# HELP dilstore_{name} {help_text}")
                lines.append(f"# TYPE dilstore_{name} {kind}")
                if kind == "counter":
                    lines += self._counter_lines(name)
                elif kind == "histogram":
                    lines += self._histogram_lines(name)
                elif name == "requests_in_flight":
                    lines += [f"dilstore_{name}{_format_labels(labels)} {n}" for labels, n in self._in_flight.items()]
                else:
                    lines += [
                        f'dilstore_{name}{{store="{_escape(store)}"}} {depth()}'
                        for store, depth in self._queue_depths.items()
                    ]
        return "\n".join(lines) + "\n"

    def _counter_lines(self, name: str) -> list[str]:
        return [
            f"dilstore_{name}{_format_labels(labels)} {_format_value(value)}"
            for labels, value in sorted(self._counters[name].items())
        ]

    def _histogram_lines(self, name: str) -> list[str]:
        lines = []
        for labels, histogram in sorted(self._histograms[name].items()):
            for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
                le = (*labels, ("le", _format_value(bound)))
                lines.append(f"dilstore_{name}_bucket{_format_labels(le)} {count}")
            lines.append(f"dilstore_{name}_bucket{_format_labels((*labels, ('le', '+Inf')))} {histogram.count}")
            lines.append(f"dilstore_{name}_sum{_format_labels(labels)} {_format_value(histogram.total)}")
            lines.append(f"dilstore_{name}_count{_format_labels(labels)} {histogram.count}")
        return lines


_FAMILIES = (
    ("requests_total", "counter", "Requests answered, by endpoint and HTTP status code."),
    ("store_requests_total", "counter", "Query requests (/ask, /rerank) answered, by the store they were sent to "
     "and HTTP status code."),
    ("errors_total", "counter", "Requests answered with a 4xx or 5xx, by endpoint and kind."),
    ("request_seconds", "histogram", "Request latency in seconds, from arrival to response, by endpoint."),
    ("queue_seconds", "histogram", "Seconds a request waited in its store's queue before its batch started."),
    ("batch_requests", "histogram", "Requests per batch run by a store's worker."),
    ("batch_pairs", "histogram", "Question-passage (or query-document) pairs asked for per batch run by a store's "
     "worker: each /ask's top_p, each /rerank's doc_ids or bm25_top_k (the batcher's measure; retrieval may find "
     "fewer)."),
    ("requests_in_flight", "gauge", "Requests being answered now, by endpoint."),
    ("queue_depth", "gauge", "Requests waiting in a store's queue."),
)


def _error_kind(status: int, retry_later: bool) -> str | None:
    if status == 503:
        return "overloaded" if retry_later else "unavailable"
    if status == 502:
        return "store_read"
    if status >= 500:
        return "internal"
    if status == CLIENT_GONE:
        return "client_gone"
    if status >= 400:
        return "bad_request"
    return None
