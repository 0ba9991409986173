"""The services behind `dilstore serve`'s query endpoints, one per mounted store, run on its Batcher worker
thread (runners/serve_batching.py): AskService answers /ask over a `dilbert` store, RerankService scores /rerank
over an EARL or Listformer store; ServedStore is a mounted store with its service and state.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dilstore.reader.data.trec import rank_documents
from dilstore.reader.retrieval import Bm25Searcher, TooManyTermsError
from dilstore.reader.serving.odqa import OpenDomainReader, aggregate
from dilstore.reader.serving.rerank import StoreReranker
from dilstore.reader.text.tokenization import folded, spaced
from dilstore.runners.serve_reopen import Reopener
from dilstore.runners.serve_requests import ASK, RERANK, AskRequest, ClientError, RerankRequest
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreChangedError
from dilstore.storage.messages import listed, other_form_hint
from dilstore.storage.reader import MissingPassagesError, Store
from dilstore.storage.secrets import scrubbed

logger = logging.getLogger("dilstore.serve")
# A /rerank query may be this many characters per token its ranker reads (BERT reads a word of more than 100 as
# one [UNK]); longer ones are refused before they are tokenized.
_QUERY_CHARS_PER_TOKEN = 100


class AskService:
    """/ask over a `dilbert` store: several requests' pairs go through one reading call."""

    endpoint = ASK

    def __init__(self, odqa: OpenDomainReader) -> None:
        if odqa.searcher is None:
            raise DilstoreError("/ask needs a reader with a BM25 index")
        self.odqa = odqa

    def pairs(self, request: AskRequest) -> int:
        """Question–passage pairs the request adds to a batch: its top_p."""
        return self._top_p(request)

    def run_batch(self, requests: Sequence[AskRequest]) -> list[dict[str, Any] | Exception]:
        """Each request's `ask --json` document, or the ClientError of a bad question.

        Questions are checked one by one first, so a bad one is refused alone;
        the others are retrieved and then read together: question layers over
        all their questions, interaction layers over all their pairs. The
        answers' timings are those of the shared call.
        """
        outcomes: list[dict[str, Any] | Exception | None] = [None] * len(requests)
        good: list[int] = []
        for index, request in enumerate(requests):
            try:
                self.odqa.tokenize_question(request.question)
                good.append(index)
            except DilstoreError as error:
                outcomes[index] = ClientError(422, str(error))
        if good:
            asked = [requests[index] for index in good]
            readings = self.odqa.retrieve_and_read([request.question for request in asked],
                                                   [self._top_p(request) for request in asked])  # fmt: skip
            for index, request, reading in zip(good, asked, readings, strict=True):
                mu = self.odqa.settings.mu if request.mu is None else request.mu
                outcomes[index] = {**aggregate(reading, mu, self.odqa.settings.n_best).to_dict(), **self.odqa.read_with}
        return outcomes  # type: ignore[return-value]

    def _top_p(self, request: AskRequest) -> int:
        return self.odqa.settings.top_p if request.top_p is None else request.top_p

    @property
    def store(self) -> Store:
        """The store the answers are read from."""
        return self.odqa.store

    def close(self) -> None:
        """Close the store and the BM25 searcher: this service answers no more."""
        self.odqa.close()


class RerankService:
    """/rerank over an EARL or Listformer store, one request at a time; `searcher` serves bm25_top_k requests."""

    endpoint = RERANK

    def __init__(self, reranker: StoreReranker, searcher: Bm25Searcher | None = None) -> None:
        self.reranker = reranker
        self.searcher = searcher

    @property
    def store(self) -> Store:
        """The store the documents' states are read from."""
        return self.reranker.store

    def close(self) -> None:
        """Close the store and the BM25 searcher, if any: this service answers no more."""
        self.reranker.close()
        if self.searcher is not None:
            self.searcher.close()

    def pairs(self, request: RerankRequest) -> int:
        """Query–document pairs the request judges."""
        return len(request.doc_ids) if request.doc_ids is not None else int(request.bm25_top_k or 0)

    def run_batch(self, requests: Sequence[RerankRequest]) -> list[dict[str, Any] | Exception]:
        """Each request's ranked results; errors of one request are its own outcome."""
        outcomes: list[dict[str, Any] | Exception] = []
        for request in requests:
            try:
                outcomes.append(self.rerank(request))
            except Exception as error:  # noqa: BLE001 (handed to that request's handler)
                outcomes.append(error)
        return outcomes

    def rerank(self, request: RerankRequest) -> dict[str, Any]:
        """`{"query", "query_truncated", "results": [{"doc_id", "score", "bm25_score"?}, ...], "encoding"}`, best
        first; `encoding` names what the documents' states were read from (fp16, 2bit, ...).

        Ties are broken by doc_id, descending, as `dilstore rerank` writes them and `evaluate-rank` scores them
        (reader/data/trec.rank_documents), whatever order the ids came in. Unknown doc_ids are the
        client's error (422); a BM25 hit the store lacks is the server's.
        query_truncated: the ranker read only the query's first max_query_length
        tokens (as `dilstore rerank` counts in truncated_queries). A query of
        more than _QUERY_CHARS_PER_TOKEN characters a token it reads is refused
        (422): tokenizing 750 KB of text held the store's worker for seconds.
        A query over it for its padding is read without the padding (spaced).
        """
        longest = self.reranker.max_query_length * _QUERY_CHARS_PER_TOKEN
        text = spaced(request.query) if len(request.query) > longest else request.query
        if (length := len(text)) > longest:
            raise ClientError(422, f"the query is {length} characters long; /rerank takes at most "
                                   f"{longest} (the ranker reads its first {self.reranker.max_query_length} tokens)")
        try:
            query = self.reranker.tokenize_query(text)
        except DilstoreError as error:  # empty, or no word pieces at all (a zero-width space, a NUL)
            raise ClientError(422, str(error)) from None
        if request.doc_ids is not None:
            bm25: dict[str, float] = {}
            ids = request.doc_ids
            try:
                scores = self.reranker.rerank_tokenized(query, ids)
            except MissingPassagesError as error:  # the library's message suggests skip_missing, which /rerank lacks
                raise ClientError(422, f"{len(error.missing)} of {len(set(ids))} doc_ids are not in this store: "
                                       f"{listed(error.missing)}"
                                       f"{other_form_hint(self.reranker.store, error.missing)}") from None  # fmt: skip
        else:
            if self.searcher is None:
                raise ClientError(400, "this store has no BM25 index (`dilstore index STORE`); give doc_ids")
            try:
                hits = self.searcher.search(folded(text), int(request.bm25_top_k or 0))
            except TooManyTermsError as error:
                raise ClientError(422, str(error)) from None
            bm25 = {hit.passage_id: hit.score for hit in hits}
            ids = list(bm25)
            scores = self.reranker.rerank_tokenized(query, ids) if ids else {}
        ranked = rank_documents(scores)
        results = [
            {"doc_id": doc_id, "score": score, **({"bm25_score": bm25[doc_id]} if bm25 else {})}
            for doc_id, score in ranked
        ]
        encoding = self.reranker.store.fingerprint.encoding
        return {"query": request.query, "query_truncated": query.truncated, "results": results, "encoding": encoding}


Service = AskService | RerankService


@dataclass
class ServedStore:
    """One mounted store: its name in requests, its service, and what /stores says about it.

    `problem` says why the store became unavailable (None while it serves). `reopener` opens it again once it
    changed on disk (runners/serve_reopen.py; None: it is served as opened until a restart). A reopened store's
    service waits in `pending` until the store's worker thread swaps it in between two batches (`swap`): the
    service it replaces is closed there, when no batch reads it any more.
    """

    name: str
    service: Service
    description: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    reopener: Reopener | None = None
    files_changed: bool = False  # the problem is files changed under the store, which putting them back mends
    unreadable: str | None = None  # the problem is this file's permission, which making it readable mends
    pending: Service | None = None
    checking: threading.Lock = field(default_factory=threading.Lock, repr=False)  # held by the store's check
    _swap: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def latest(self) -> Service:
        """The service the next batch runs: the reopened one still pending, else the one serving."""
        with self._swap:
            return self.pending if self.pending is not None else self.service

    def run_batch(self, requests: Sequence[Any]) -> list[dict[str, Any] | Exception]:
        """The serving service's outcomes for a batch, on the store's worker thread."""
        return self.service.run_batch(requests)

    def swap(self) -> None:
        """Serve the pending service, if any, and close the one it replaces; on the store's worker thread between
        two batches (Batcher.run_soon), so no batch reads the closed one. The replaced copy's memory maps (of
        files a compaction deleted: disk space) and its model, unless the new copy kept it, are let go at once:
        they sit in reference cycles that only a full collection frees, which an idle server might not run for
        hours (review47 F1)."""
        with self._swap:
            if self.pending is None:
                return
            stale, self.service, self.pending = self.service, self.pending, None
        stale.close()
        del stale
        gc.collect()

    def take(self, fresh: ServedStore) -> None:
        """Serve `fresh` (the same store opened again) once `swap` runs; what /stores says and the store's
        availability are its own from now. A reopened copy still pending is closed: no batch ever read it."""
        with self._swap:
            stale, self.pending = self.pending, fresh.service
        if stale is not None:
            stale.close()
        self.description, self.problem, self.unreadable = fresh.description, None, None

    def summary(self) -> str:
        """What `serve` says about the store it opened: its kind, encoding, size, where it is and its model."""
        info, described = self.description["info"], self.description
        layers = f", online layers {described['online_variant']}" if described.get("online_variant") else ""
        return (f"store {self.name!r} ({info['kind']}, {info['encoding']}, {info['passages']:,} passages) from "
                f"{described['path']}, model {described['model']}{layers}")

    def fail(self, error: Exception, service: Service | None = None) -> bool:
        """Mark the store unavailable: its files changed under the server (`error` says how), until it is reopened
        (for good without a reopener). The first problem found is kept and logged; the requests in flight that
        meet it too are not logged again. With `service`, the one that met `error`: nothing is marked when a
        reopened copy replaced it meanwhile (the old copy's files are the ones that changed). True when marked."""
        if service is not None and service is not self.latest:
            return False
        if self.problem is None:
            self.problem = scrubbed(str(error))  # /health, /stores and every 503 show it, to any client
            self.files_changed = isinstance(error, StoreChangedError)
            self.unreadable = getattr(error, "unreadable", None)
            until = "until its files change and it can be opened again" if self.reopener is not None else "from now on"
            if self.unreadable is not None:
                until = f"until {self.unreadable} can be read by this user, or {until.removeprefix('until ')}"
            logger.error("store %r is unavailable %s: %s", self.name, until, self.problem)
        return True

    def unavailable(self) -> ClientError:
        """The 503 each request to this store gets once it has a problem."""
        remedy = ("it is opened again once its files change (a new build, its BM25 index rebuilt)"
                  if self.reopener is not None else "restart the server to serve the store as it is on disk now")
        if self.unreadable is not None:
            remedy = f"it is served again once {self.unreadable} can be read by the server's user, or {remedy}"
        return ClientError(503, f"store {self.name!r} is unavailable: {self.problem}; {remedy}")
