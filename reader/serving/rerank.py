"""Reranking a first-stage run over stored document representations: EARL (seed 004) or the Listformer (seed 003).

The store's kind picks the reranker (`open_reranker`): EarlReranker for
"earl-s1" and "earl-s2" stores, ListformerReranker for "listformer" stores.
Both share the lookup, the run handling and the statistics (StoreReranker).

**EARL** scores each (query, document) pair:

    query ─ query module (layers 1..N) ─→ query states               (once per query)
    doc ids ─ store.fetch ──────────────→ S1 (n, d) or S2 (n, M, 2, d)  (memory-mapped; int8 dequantized)
    (query, document) pairs ────────────→ M judger blocks, pooling, score head → scores
                                           (length-bucketed batches, cast to the model's dtype)

A store of kind "earl-s1" is judged through `EarlRanker.judge(doc_states=…)`,
which projects every judger block's keys and values online; one of kind
"earl-s2" through `judge(doc_key_values=…)`, which skips that projection.
Both give the scores of the unsplit `EarlRanker.forward` on the same text.
A ranker with the bi-encoder prior also takes each document's stored mean S1
vector (`passages/vectors`, which precompute writes for it on both kinds), so
its S1 and S2 stores give the same prior; a store without them is refused.
A document is looked up by its own id: for a document longer than the
store's max length that is its first window, the tokens `encode_document`
keeps, so it is scored by its first tokens (FirstP) as online.

**The Listformer** scores a query's whole candidate list in one pass:

    query ─ layers 1..k alone ───────────→ query states                 (once per query)
    doc ids ─ store.fetch ───────────────→ `d [SEP]` states after layer k (n, d) each
    query + every document of the list ──→ global-local layers k+1..l → separators → scores

which gives the scores of the unsplit `ListformerRanker.forward` on the same
text (its first `d [SEP]` window, as `tokenize_document` keeps). The batch
settings do not apply: the list is one batch. The "judge" stage time is the
global-local layers and the score head.

**Reranking a run (`rerank_run`).** Each query's documents are taken in
first-stage order (score descending, ties by docid descending, as trec_eval
ranks them) and the first `depth` are rescored by the model. The documents
below `depth` are kept, after the reranked ones and in their first-stage
order: they get the scores m − 1, m − 2, … where m is the lowest model score
of the query, or 0 when no top document was scored (their first-stage scores
live on another scale and are not kept). Only the top `depth` documents are
looked up in the store, so the tail may hold ids the store lacks.

**Missing documents.** A top-`depth` id that is not in the store raises
MissingPassagesError naming it; with `skip_missing=True` it is left out of
the result (and of the written run) and counted in `RerankStats.skipped`.

**Queries** are `[CLS] q [SEP]`, truncated to `max_query_length` tokens, as
rankers do; truncated queries are counted, not refused.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from dilstore.reader.batching import (
    DEFAULT_MAX_PAIRS_PER_BATCH,
    DEFAULT_PAIR_BATCH_TOKENS,
    BatchPolicy,
    length_batches,
)
from dilstore.reader.data.trec import Run, rank_documents, run_from_mapping
from dilstore.reader.modeling.earl import EarlRanker
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.modeling.listformer import ListformerRanker
from dilstore.reader.offline.kinds import require_within_positions
from dilstore.reader.packaged.shipped import shipped_model_advice
from dilstore.reader.serving.rerank_inputs import DEFAULT_DEPTH, checked_depth, require_topics
from dilstore.reader.serving.store_checks import (
    EARL_KINDS,
    EARL_S1,
    EARL_S2,
    LISTFORMER,
    ranker_dir,
    require_kind,
    require_rerank_kind,
)
from dilstore.reader.serving.stored_states import non_finite_cause, pad_stored_states, stored_finite
from dilstore.reader.serving.timing import StageTimer
from dilstore.reader.text.tokenization import TokenizedText, encode_query, folded
from dilstore.storage.checks import as_list, require_at_least_one
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import check_fingerprint
from dilstore.storage.messages import listed, other_form_hint
from dilstore.storage.reader import MissingPassagesError, Store, open_store
from dilstore.storage.records import StoredPassage

RUN_TAG = "dilstore-earl"
LISTFORMER_RUN_TAG = "dilstore-listformer"
SPLIT_HINT_PROBES = 5  # missing ids probed for the ID#0 a split store holds instead
STAGES = ("query_layers", "store_read", "judge")
# The ranker a StoreReranker subclass scores with.
RankerT = TypeVar("RankerT", EarlRanker, ListformerRanker)


@dataclass(frozen=True)
class RerankSettings:
    """How queries are cut and pairs batched.

    max_query_length: query tokens kept, [CLS] and [SEP] included (longer queries are truncated);
        None keeps the length the ranker was trained with (RankerBase.max_query_length).
    pair_batch_tokens, max_pairs_per_batch: limits of one judging batch, whose
        padded size is its number of pairs times (query + longest document) tokens.
    """

    max_query_length: int | None = None
    pair_batch_tokens: int = DEFAULT_PAIR_BATCH_TOKENS
    max_pairs_per_batch: int = DEFAULT_MAX_PAIRS_PER_BATCH

    def __post_init__(self) -> None:
        limits = ("pair_batch_tokens", "max_pairs_per_batch")
        require_at_least_one({name: getattr(self, name) for name in limits}, dashed=False)
        if self.max_query_length is not None and self.max_query_length < 3:
            raise DilstoreError(f"max_query_length must be at least 3, got {self.max_query_length}")


@dataclass
class RerankStats(StageTimer):
    """What reranking did, summed over the `rerank` calls that shared it (from several threads too: each call adds
    under a lock, `StageTimer.add`).

    queries: queries reranked; pairs: (query, document) pairs judged;
    skipped: documents left out because the store lacks them (skip_missing);
    emptied_queries: queries none of whose documents is in the store (skip_missing), so left out of the run;
    truncated_queries: queries cut to max_query_length; seconds: wall clock
    of the calls. Stage times: query_layers (tokenizing and the query
    module), store_read (fetching, int8 dequantization included) and judge
    (assembling padded batches, casting them to the model's dtype, the judger
    blocks and the score head).
    """

    queries: int = 0
    pairs: int = 0
    skipped: int = 0
    emptied_queries: list[str] = field(default_factory=list)
    truncated_queries: int = 0
    seconds: float = 0.0
    query_layers: float = 0.0
    store_read: float = 0.0
    judge: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Counts and seconds, with the stage times under "timings"."""
        values = asdict(self)
        return {
            **{name: value for name, value in values.items() if name not in STAGES},
            "timings": {stage: values[stage] for stage in STAGES},
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RerankStats:
        """The stats `to_dict` gave (an earlier run's, kept on disk)."""
        return cls(**{name: value for name, value in values.items() if name != "timings"}, **values["timings"])


def _checked_run(run: Run) -> Run:
    """A checked copy of a `{qid: {docid: score}}` run (a file path was read one qid per character) of one query or
    more, some query with a document to rerank. A query without any (a first stage that found nothing for it) is
    kept: `rerank_run` leaves it out and names it in `emptied_queries`, as one whose documents are all missing
    (rank48 F3: one such query refused the whole run)."""
    if not isinstance(run, Mapping):
        raise DilstoreError(f"the run must be a {{qid: {{docid: score}}}} mapping (a TREC run file is read by "
                            f"dilstore.reader.data.trec.read_run), got {type(run).__name__}")  # fmt: skip
    checked = run_from_mapping(run)
    if not checked:  # returned an empty run without a word, where `rerank` refuses a run file of no query (left55 F9)
        raise DilstoreError("the run holds no queries: there is nothing to rerank")
    if not any(checked.values()):
        raise DilstoreError(f"none of the run's {len(checked)} queries has documents to rerank: "
                            f"{listed(list(checked))}")  # fmt: skip
    return checked


def require_earl_store(store: Store) -> str:
    """The store's kind, "earl-s1" or "earl-s2"; any other kind raises DilstoreError."""
    return require_kind(
        store.kind,
        store.url,
        EARL_KINDS,
        f"the EARL reranker needs an {EARL_S1!r} or {EARL_S2!r} store (`dilstore precompute --kind earl-s1|earl-s2`)",
    )


class StoreReranker(ABC, Generic[RankerT]):
    """Scores stored documents against queries; one instance serves many requests.

    Subclasses say which stores their ranker reads (`_check_store`) and
    score (`_score`). `model` must be the ranker whose fingerprint the store
    carries (`open_reranker` builds one with that check). Every problem a
    request can cause raises DilstoreError and leaves the reranker usable.
    """

    run_tag: str

    def __init__(
        self,
        model: RankerT,
        store: Store,
        settings: RerankSettings | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        self._check_store(model, store)
        self.kind = store.kind
        self.model = model.eval()
        self.store = store
        self.settings = settings or RerankSettings()
        self.max_query_length = self.settings.max_query_length or model.max_query_length
        require_within_positions(self.max_query_length, model, "query", "--max-query-length")
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self.device)

    def __enter__(self) -> StoreReranker[RankerT]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store (its files stay mapped until then); reranking then raises."""
        self.store.close()

    def rerank(
        self,
        query: str,
        doc_ids: Iterable[str],
        *,
        skip_missing: bool = False,
        stats: RerankStats | None = None,
    ) -> dict[str, float]:
        """`{doc_id: score}` of one query against the stored documents (repeated ids are scored once).

        Ids the store lacks raise MissingPassagesError naming them, or with
        `skip_missing` are left out and counted in `stats.skipped`. Pass a
        RerankStats to collect counts and stage times.
        """
        stats = RerankStats() if stats is None else stats
        if not isinstance(stats, RerankStats):
            raise DilstoreError(f"stats must be a RerankStats or None, got {type(stats).__name__}")
        return self.rerank_tokenized(self._tokenize_timed(query, stats), doc_ids, skip_missing=skip_missing,
                                     stats=stats)  # fmt: skip

    def rerank_run(
        self,
        topics: Mapping[str, str],
        run: Run,
        depth: int = DEFAULT_DEPTH,
        *,
        skip_missing: bool = False,
        on_query: Callable[[str], None] | None = None,
        on_reranked: Callable[[str, dict[str, float] | None], None] | None = None,
        done: Collection[str] = (),
        stats: RerankStats | None = None,
    ) -> tuple[Run, RerankStats]:
        """Rerank each query's top-`depth` documents; the reranked run (tail kept below) and the stats.

        Queries keep the run's order (a run of none is an error); each must have a topic. Every topic, and
        without `skip_missing` every top-`depth` document, is checked before
        the first query is scored. `on_query(qid)` is called after each query, for progress reporting, and
        `on_reranked(qid, scores)` with its reranked scores (None for a query left with no document), to keep them.
        With `skip_missing`, a run none of whose top-`depth` documents is in the store is an error,
        not an empty run, and a query left with no document is not in the run
        returned but in `stats.emptied_queries`, as is a query the run gives no document (a run of only
        such queries is an error). `done`: queries an earlier run reranked (their scores kept
        by the caller), left out, and `stats`, that run's, added to (a stopped `dilstore rerank` goes on).
        """
        depth = checked_depth(depth)
        run = _checked_run(run)
        require_topics(topics, run)
        for name, callback in (("on_query", on_query), ("on_reranked", on_reranked)):
            if callback is not None and not callable(callback):
                raise DilstoreError(f"{name} must be a function or None, got {type(callback).__name__}")
        _check_skip_missing(skip_missing)
        done = _checked_done(done)
        stats = RerankStats() if stats is None else stats
        rankings = {qid: [docid for docid, _ in rank_documents(first_stage)] for qid, first_stage in run.items()
                    if qid not in done}  # fmt: skip
        # Every topic, and without skip_missing every top document, is checked before the first query is scored:
        # a bad one found when its query came up lost the work of the queries before it.
        queries = {qid: self._run_query(qid, topics[qid]) for qid in rankings}
        if not skip_missing:
            self._require_stored({qid: ranked[:depth] for qid, ranked in rankings.items()})
        reranked: Run = {}
        for qid, ranked in rankings.items():
            tokens, tokenizing = queries[qid]
            # Its tokenizing counted with the query it served, so that the stats kept after each query are that
            # query's and those before (a run stopped and gone on from counts each once).
            stats.add(query_layers=tokenizing.query_layers, seconds=tokenizing.seconds,
                      truncated_queries=tokenizing.truncated_queries)
            scores = self.rerank_tokenized(tokens, ranked[:depth], skip_missing=skip_missing, stats=stats)
            floor = min(scores.values(), default=0.0)
            tail = {docid: floor - rank for rank, docid in enumerate(ranked[depth:], start=1)}
            if scores or tail:
                reranked[qid] = {**scores, **tail}
            else:
                stats.emptied_queries.append(qid)
            if on_query is not None:
                on_query(qid)
            if on_reranked is not None:
                on_reranked(qid, reranked.get(qid))
        if stats.skipped and not stats.pairs:
            first = [docid for docid, _ in rank_documents(next(iter(run.values())))][:depth]  # looked up, all missing
            raise MissingPassagesError(
                f"none of the run's top-{depth} documents is in store {self.store.url}"
                f"{split_hint(self.store, first)}{other_form_hint(self.store, first)}: nothing was reranked", first
            )
        return reranked, stats

    # ------------------------------------------------------------------ stages

    def tokenize_query(self, query: str) -> TokenizedText:
        """`[CLS] q [SEP]`, truncated to max_query_length; a DilstoreError for a query that is not a string, is
        empty or has no word pieces (a zero-width space), which a server refuses before any work."""
        if not isinstance(query, str):
            raise DilstoreError(f"a query must be a string, got {type(query).__name__}")
        if not query.strip():
            raise DilstoreError("the query is empty")
        return encode_query(self.model.tokenizer, folded(query), self.max_query_length)

    def _tokenize_timed(self, query: str, stats: RerankStats) -> TokenizedText:
        """`tokenize_query`, its time and truncation counted in stats."""
        started = time.perf_counter()
        try:
            with stats.measure("query_layers"):
                tokens = self.tokenize_query(query)
        finally:
            stats.add(seconds=time.perf_counter() - started)
        stats.add(truncated_queries=int(tokens.truncated))
        return tokens

    def _run_query(self, qid: str, query: str) -> tuple[TokenizedText, RerankStats]:
        """A run's query tokenized, with its time and truncation; an error names its qid."""
        own = RerankStats()
        try:
            return self._tokenize_timed(query, own), own
        except DilstoreError as error:
            raise DilstoreError(f"the topic of query {qid!r:.60}: {error}") from None

    def _require_stored(self, tops: Mapping[str, list[str]]) -> None:
        """A MissingPassagesError naming the first query with documents the store lacks, and counting the rest."""
        missing = {qid: docids for qid, top in tops.items() if (docids := self.store.missing(top))}
        if not missing:
            return
        (qid, first), others = next(iter(missing.items())), list(missing)[1:]
        more = sum(len(missing[other]) for other in others)
        elsewhere = f"; {more} more in {len(others)} other query(ies)" if others else ""
        raise MissingPassagesError(
            f"query {qid!r}: {len(first)} of {len(tops[qid])} documents to rerank are not in store {self.store.url}: "
            f"{listed(first)}{split_hint(self.store, first)}{other_form_hint(self.store, first)}{elsewhere}; leave "
            "them out with skip_missing (--skip-missing)",
            [docid for docids in missing.values() for docid in docids],
        )

    def rerank_tokenized(
        self, tokens: TokenizedText, doc_ids: Iterable[str], *, skip_missing: bool = False,
        stats: RerankStats | None = None,
    ) -> dict[str, float]:
        """`rerank` of a query `tokenize_query` has tokenized: a server that checked the query up front, or a run
        that checked all its topics, does not tokenize it again."""
        doc_ids = as_list(doc_ids, "doc_ids must be a list of document ids")
        _check_skip_missing(skip_missing)
        wrong = next((doc_id for doc_id in doc_ids if not isinstance(doc_id, str)), None)
        if wrong is not None:  # a list or dict among them failed in dict.fromkeys with a bare TypeError
            raise DilstoreError(f"doc_ids must be strings, got {type(wrong).__name__} {wrong!r:.60}")
        stats = RerankStats() if stats is None else stats
        started = time.perf_counter()
        try:
            documents = self._fetch(list(dict.fromkeys(doc_ids)), skip_missing, stats)
            scores = self._score(tokens, documents, stats) if documents else []
        finally:
            stats.add(seconds=time.perf_counter() - started)
        # A query none of whose documents is stored was not reranked.
        stats.add(queries=int(bool(documents)), pairs=len(documents))
        unscored = next((document for document, score in zip(documents, scores, strict=True)
                         if not math.isfinite(score)), None)  # fmt: skip
        if unscored is not None:  # hostile46 F7: NaN came back as a score
            prior = bool(self.model.prior)  # a prior ranker reads each document's stored vector too
            broken = _damaged(documents, prior) or unscored
            raise DilstoreError(f"document {broken.id!r}: its score is not finite, {non_finite_cause(broken, prior)}")
        return {document.id: score for document, score in zip(documents, scores, strict=True)}

    def _fetch(self, doc_ids: list[str], skip_missing: bool, stats: RerankStats) -> list[StoredPassage]:
        """The stored documents in the order asked; missing ids raise, or are dropped with skip_missing."""
        with stats.measure("store_read"):
            try:
                return self.store.fetch(doc_ids)
            except MissingPassagesError as error:
                if not skip_missing:
                    raise MissingPassagesError(
                        f"{len(error.missing)} of {len(doc_ids)} documents to rerank are not in store "
                        f"{self.store.url}: {listed(error.missing)}{split_hint(self.store, error.missing)}"
                        f"{other_form_hint(self.store, error.missing)}; leave them out with skip_missing "
                        "(--skip-missing)",
                        error.missing,
                    ) from None
                missing = set(error.missing)
                stats.add(skipped=len(missing))
                present = [docid for docid in doc_ids if docid not in missing]
                return self.store.fetch(present) if present else []

    def _query_tensors(self, tokens: TokenizedText) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokenized query as ids (1, nq) and mask (1, nq) on the device."""
        query_ids = torch.from_numpy(tokens.token_ids.astype(np.int64))[None].to(self.device)  # (1, nq)
        return query_ids, torch.ones_like(query_ids)  # (1, nq), (1, nq)

    def _encode_query(self, tokens: TokenizedText) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokenized query through the ranker's query layers: its states (1, nq, d) and its mask (1, nq)."""
        query_ids, query_mask = self._query_tensors(tokens)  # (1, nq), (1, nq)
        return self.model.encode_queries(query_ids, query_mask), query_mask  # (1, nq, d), (1, nq)

    @abstractmethod
    def _check_store(self, model: RankerT, store: Store) -> None:
        """Raise DilstoreError unless `store` holds what this reranker reads with `model`."""

    @abstractmethod
    def _score(self, tokens: TokenizedText, documents: Sequence[StoredPassage], stats: RerankStats) -> list[float]:
        """Scores of the (non-empty) documents against the tokenized query, in their order."""


def _damaged(documents: Sequence[StoredPassage], vector: bool) -> StoredPassage | None:
    """The first of the documents scored together whose stored states (with `vector`, or passage vector) are not
    finite, or None: the one to name when a score comes back NaN. The Listformer reads a query's list in one pass,
    so one document's NaN reaches every score through the global tokens: the list's first document was named, its
    states finite, and the model's weights blamed for the store's damage (num58 F2)."""
    return next((document for document in documents if not stored_finite(document, vector)), None)


def _check_skip_missing(skip_missing: object) -> None:
    if not isinstance(skip_missing, bool):
        raise DilstoreError(f"skip_missing must be True or False, got {type(skip_missing).__name__}")


def _checked_done(done: object) -> set[str]:
    """`rerank_run`'s `done` as a set of qids: a string was searched for qids as substrings (`done="q1q2"` left q1
    and q2 out, not a word said), and an int qid matched none, so its query was scored again (api54 F2)."""
    qids = as_list(done, "done must be the qids an earlier run reranked (a list or set)")
    wrong = next((qid for qid in qids if not isinstance(qid, str)), None)
    if wrong is not None:
        raise DilstoreError(f"done must hold qids, strings, got {type(wrong).__name__} {wrong!r:.60}")
    return set(qids)


def split_hint(store: Store, doc_ids: Sequence[str]) -> str:
    """", ..." saying that the store cut its documents into passages, when it holds `ID#0` for one of the first
    few of `doc_ids`; else "". A rerank store must keep each document whole (--split none) to be found by its id."""
    found = next((f"{docid}#0" for docid in doc_ids[:SPLIT_HINT_PROBES] if f"{docid}#0" in store), None)
    if found is None:
        return ""
    return (f" (the store holds {found!r}: it was built with a --split that cuts documents into passages; rerank "
            "a store built with --split none, whose ids are the run's docids)")  # fmt: skip


class EarlReranker(StoreReranker[EarlRanker]):
    """Scores documents of an EARL store pair by pair: the query module once, the judger blocks per document."""

    run_tag = RUN_TAG

    def _check_store(self, model: EarlRanker, store: Store) -> None:
        """An "earl-s1" or "earl-s2" store, with passage vectors when the ranker has the bi-encoder prior."""
        require_earl_store(store)
        _require_prior_vectors(model.prior, store)

    def _score(self, tokens: TokenizedText, documents: Sequence[StoredPassage], stats: RerankStats) -> list[float]:
        """The query module once, then the judger blocks over every document in length-bucketed batches."""
        with stats.measure("query_layers"), torch.inference_mode():
            query_states, query_mask = self._encode_query(tokens)  # (1, nq, d), (1, nq)
            prior = {"query_vectors": self.model.query_vectors(query_states, query_mask)} if self.model.prior else {}
        policy = BatchPolicy(self.settings.pair_batch_tokens, self.settings.max_pairs_per_batch)
        lengths = [len(tokens) + len(document.token_ids) for document in documents]
        scores = [0.0] * len(documents)
        with stats.measure("judge"), torch.inference_mode():
            for batch in length_batches(lengths, policy):
                chosen = [documents[index] for index in batch]
                stored, doc_mask = pad_stored_states(chosen, self.device, self.model.dtype)
                argument = "doc_states" if self.kind == EARL_S1 else "doc_key_values"
                if prior:  # the stored mean S1 vectors (b, d), for S1 and S2 alike
                    prior["doc_vectors"] = torch.from_numpy(np.stack([d.vector for d in chosen])).to(self.device)
                # The (1, nq) query is broadcast over the b documents.
                batch_scores = self.model.judge(
                    query_states, query_mask, doc_mask, **{argument: stored}, **prior
                )  # (b,)
                for index, score in zip(batch, batch_scores.float().cpu().tolist(), strict=True):
                    scores[index] = score
        return scores


class ListformerReranker(StoreReranker[ListformerRanker]):
    """Scores the documents of a Listformer store as one list per query, in one pass over the list."""

    run_tag = LISTFORMER_RUN_TAG

    def _check_store(self, model: ListformerRanker, store: Store) -> None:
        """A "listformer" store, with passage vectors when the ranker has the bi-encoder prior."""
        require_kind(
            store.kind,
            store.url,
            (LISTFORMER,),
            f"the Listformer reranker needs a {LISTFORMER!r} store (`dilstore precompute --kind listformer`)",
        )
        _require_prior_vectors(model.prior, store)

    def _score(self, tokens: TokenizedText, documents: Sequence[StoredPassage], stats: RerankStats) -> list[float]:
        """The query's layers 1..k once (and the prior encoder), then layers k+1..l over the query and every
        stored document together (plus each document's stored prior vector)."""
        with stats.measure("query_layers"), torch.inference_mode():
            query_ids, query_mask = self._query_tensors(tokens)  # (1, nq), (1, nq)
            query_states = self.model.encode_queries(query_ids, query_mask)  # (1, nq, d)
            prior = {}
            if self.model.prior:
                prior["query_vectors"] = self.model.query_vectors(query_ids, query_mask)  # (1, d)
        with stats.measure("judge"), torch.inference_mode():
            stored, doc_mask = pad_stored_states(documents, self.device, self.model.dtype)  # (D, n, d), (D, n)
            if prior:
                vectors = np.stack([document.vector for document in documents])  # (D, d)
                prior["doc_vectors"] = torch.from_numpy(vectors)[None].to(self.device)  # (1, D, d)
            scores = self.model.score_lists(query_states, query_mask, stored[None], doc_mask[None], **prior)  # (1, D)
        return scores[0].float().cpu().tolist()


def load_store_ranker(store: Store, model_dir: str | Path, *, shipped: bool = False) -> EarlRanker | ListformerRanker:
    """The ranker at `model_dir` for the store's kind, checked against its fingerprint (kind, encoding, max length).

    A store no reranker reads is refused before the model is loaded; a
    checkpoint of another ranker kind is refused from its dilstore.json; a
    model that did not make the store raises FingerprintMismatchError
    showing both fingerprints.
    """
    kind = require_rerank_kind(store.kind, store.url)
    model = ListformerRanker.from_pretrained(model_dir) if kind == LISTFORMER else EarlRanker.from_pretrained(model_dir)
    found = store.fingerprint
    expected = model_fingerprint(model, kind, found.encoding, found.max_length)
    # shipped: the packaged ranker, no --model given
    advice = shipped_model_advice(store.manifest.creation, shipped, store.manifest.appends)
    check_fingerprint(found, expected, f"store {store.url} (model {model_dir})", advice)
    return model


def open_reranker(
    store_path: str | Path,
    model_dir: str | Path | None = None,
    *,
    settings: RerankSettings | None = None,
    device: str | None = None,
    reuse: StoreReranker | None = None,
) -> StoreReranker:
    """Open a store, load and check its ranker, and return the reranker its kind calls for.

    Without `model_dir`, EARL stores use the packaged EARL ranker and
    Listformer stores the packaged Listformer. `reuse`: a reranker opened
    with the same model_dir on an earlier build of this store; its ranker
    serves the new one when both builds carry the same fingerprint, so
    opening a changed store again holds one model in memory, not two.
    """
    store = open_store(store_path)
    kind = require_rerank_kind(store.kind, store.url)
    if reuse is not None and reuse.store.fingerprint == store.fingerprint:
        model: EarlRanker | ListformerRanker = reuse.model  # checked against an equal fingerprint when it opened
    elif model_dir is not None:
        model = load_store_ranker(store, model_dir)
    else:  # the packaged ranker of the store's kind
        model = load_store_ranker(store, ranker_dir(kind, None), shipped=True)
    if kind == LISTFORMER:
        assert isinstance(model, ListformerRanker)  # load_store_ranker loads by the store's kind
        return ListformerReranker(model, store, settings, device)
    assert isinstance(model, EarlRanker)  # load_store_ranker loads by the store's kind
    return EarlReranker(model, store, settings, device)


def _require_prior_vectors(prior: bool, store: Store) -> None:
    """Refuse a store without passage vectors for a ranker with the bi-encoder prior, which reads them."""
    if prior and store.vector_size is None:
        raise DilstoreError(
            f"store {store.url} has no passage vectors, which this ranker's bi-encoder prior needs; "
            "precompute the store again with this ranker"
        )


