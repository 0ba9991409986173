"""Open-domain QA over a store: BM25 top-p → stored layer-k states → online layers → answers (seed 002).

    question ─ BM25 (pyserini) ─→ top-p passage ids and s_bm25
    question ─ layers 1..k ─────→ question states            (once per question)
    ids ─ store.fetch ──────────→ layer-k passage states     (memory-mapped; int8 dequantized)
    (question, passage) pairs ──→ layers k+1..l + QA head    (length-bucketed batches)
    logits ─ best_spans ────────→ per passage n-best spans, s_r = (s_start + s_end) / 2
    aggregate(μ) ───────────────→ final score μ·s_r + (1 − μ)·s_bm25, best first

Reading (everything up to the per-passage n-best) is separate from
aggregation, so one reading serves any μ: evaluation scores μ = 1 and
μ = 0.5 from a single pass of the model.

**Aggregation is the seed's formula, unnormalised.** s_r is a mean of two
logits and s_bm25 a Lucene BM25 score; they live on different scales and
are combined as they are, exactly as the seed does (its μ = 0.5 was chosen
by cross-validation on those raw scales). μ = 1 leaves BM25 out. Passages
given as bare ids (no retrieval) get s_bm25 = 0, so fusion then only scales
the reader's scores and never reorders them.

**Bad input.** Every problem a request can cause (an empty question, a
question longer than `max_question_length` word pieces, ids missing from the
store, no index) raises DilstoreError before or instead of doing work, and
leaves the reader usable for the next request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, Self

import numpy as np
import torch
from transformers import AutoConfig

from dilstore.reader.batching import (
    DEFAULT_MAX_PAIRS_PER_BATCH,
    DEFAULT_PAIR_BATCH_TOKENS,
    BatchPolicy,
    length_batches,
    pad_id,
    pad_token_ids,
)
from dilstore.reader.data.qa_features import DEFAULT_MAX_QUESTION_LENGTH
from dilstore.reader.modeling.architectures import require_segment_limit
from dilstore.reader.modeling.checkpoints import read_metadata, require_checkpoint_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.modeling.load_errors import LOAD_ERRORS
from dilstore.reader.modeling.online_variants import load_online_variant
from dilstore.reader.offline.kinds import require_within_positions
from dilstore.reader.packaged.shipped import shipped_model_advice
from dilstore.reader.retrieval import Bm25Searcher, Hit, require_all_passages
from dilstore.reader.serving.answers import (
    DEFAULT_TOP_P,
    Answer,
    PassageLogits,
    Reading,
    Span,
    Timings,
    aggregate,
    check_mu,
    checked_top_p,
)
from dilstore.reader.serving.decode import DEFAULT_MAX_ANSWER_LENGTH, DEFAULT_N_BEST, best_spans
from dilstore.reader.serving.store_checks import checked_reader_index, reader_dir, require_reader_kind
from dilstore.reader.serving.stored_states import non_finite_cause, pad_stored_states
from dilstore.reader.text.tokenization import TokenizedText, encode_question, folded, spaced
from dilstore.storage.checks import as_list, require_at_least_one
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import check_fingerprint
from dilstore.storage.reader import Store, open_store
from dilstore.storage.records import StoredPassage

DEFAULT_MU = 0.5
# Characters per allowed word piece in the cheap pre-check that keeps a huge
# string away from the tokenizer; real text averages well under 10.
_CHARS_PER_PIECE_LIMIT = 20


@dataclass(frozen=True)
class OdqaSettings:
    """How the reader retrieves, batches and decodes.

    top_p: passages retrieved per question (the seed uses 29 and 100).
    mu: weight of the reader score in μ·s_r + (1 − μ)·s_bm25 (1 = reader only).
    n_best: spans kept per passage and returned per answer.
    max_answer_length: longest answer in word pieces.
    max_question_length: longest question in tokens, [CLS] and [SEP] included;
        a longer question is refused, not truncated.
    pair_batch_tokens, max_pairs_per_batch: limits of one interaction batch.
    """

    top_p: int = DEFAULT_TOP_P
    mu: float = DEFAULT_MU
    n_best: int = DEFAULT_N_BEST
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH
    max_question_length: int = DEFAULT_MAX_QUESTION_LENGTH
    pair_batch_tokens: int = DEFAULT_PAIR_BATCH_TOKENS
    max_pairs_per_batch: int = DEFAULT_MAX_PAIRS_PER_BATCH

    def __post_init__(self) -> None:
        object.__setattr__(self, "top_p", checked_top_p(self.top_p))  # a numpy int as an int, for JSON
        check_mu(self.mu)
        limits = ("n_best", "max_answer_length", "pair_batch_tokens", "max_pairs_per_batch")
        require_at_least_one({name: getattr(self, name) for name in limits}, dashed=False)
        if self.max_question_length < 3:
            raise DilstoreError(f"max_question_length must be at least 3, got {self.max_question_length}")


@dataclass(frozen=True)
class _Pair:
    """One (question, passage) pair of a reading call: indices into its question and passage lists."""

    question: int
    passage: int
    length: int


class PassageSource(Protocol):
    """What the reader needs of a store: the stored passages of some ids, in their order."""

    def fetch(self, passage_ids: Sequence[str]) -> list[StoredPassage]:
        """The stored passages of `passage_ids`, in their order (a Store, or a test's stand-in)."""
        ...


# The store a reader holds, for type checkers: a Store unless the reader was built over a stand-in, so that
# `reader.store.check_files = True` (README) type-checks on a reader from open_reader (types58 F2). Covariant: a reader
# of a Store is one of a PassageSource. The default needs typing_extensions, which only a type checker imports.
if TYPE_CHECKING:
    from typing_extensions import TypeVar

    StoreT = TypeVar("StoreT", bound=PassageSource, default=Store, covariant=True)
else:
    from typing import TypeVar

    StoreT = TypeVar("StoreT", bound=PassageSource, covariant=True)


def _question_list(questions: Iterable[str]) -> list[str]:
    """The questions as a list (any iterable but one string, which would be read as one question per character)."""
    return as_list(questions, "questions must be a list of strings (answer() takes a single one)")


class OpenDomainReader(Generic[StoreT]):
    """Answers questions from a store with a DilBert reader; one instance serves many requests.

    `model` must be the reader whose fingerprint the store carries
    (`open_reader` builds one with that check); `store` is any PassageSource
    (an opened Store, or a stand-in), kept as `reader.store`: a bare
    `OpenDomainReader` hint is a reader of a Store; `searcher` (`search(query, k) ->
    list[Hit]`) is needed only for questions without given candidates.
    """

    def __init__(
        self,
        model: DilBertReader,
        store: StoreT,
        searcher: Bm25Searcher | None = None,
        settings: OdqaSettings | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        self.model = model.eval()
        self.store = store
        self.searcher = searcher
        self.settings = settings or OdqaSettings()
        require_within_positions(self.settings.max_question_length, model, "question", "--max-question-length")
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self.device)
        self._pad_id = pad_id(model.tokenizer)

    def __reduce__(self) -> tuple[object, ...]:
        """Refused with what to do: handed to a spawn or forkserver process (a pool's arguments; macOS, and Linux's
        default from Python 3.14), a reader failed with "Can't pickle <function <lambda>>: attribute lookup <lambda>
        on dilstore.reader.modeling.architectures failed", naming nothing of the reader (port58 F6). Its BM25
        searcher lives in this process's JVM, which no other process can be given."""
        raise TypeError("an OpenDomainReader cannot be handed to another process (pickled): open one in each process "
                        "that answers, with dilstore.open_reader(store, ...) (a Store may be handed over)")

    def __enter__(self) -> Self:  # a reader of its own store, not of a Store (types58 F2)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store and the BM25 searcher (their files stay mapped until then); answering then raises.

        A store or searcher without `close` (a stand-in given by the caller) is left as it is.
        """
        for resource in (self.store, self.searcher):
            close = getattr(resource, "close", None)
            if close is not None:
                close()

    @property
    def read_with(self) -> dict[str, str | None]:
        """What the answers are read from: the store's encoding (fp16, 2bit, ...) and the packaged online layers
        swapped in for it (None: the model's own), as `ask --json`, serve's /ask and `evaluate-qa --json` name them.

        A 2bit store read with or without its online layers gives other answers, so each answer names both. A
        stand-in store without a fingerprint (a PassageSource has only `fetch`) reads as encoding "", as a
        QAEvaluation names an unknown one: `evaluate_qa` over one raised AttributeError once every question was read
        (types58 F1).
        """
        fingerprint = getattr(self.store, "fingerprint", None)
        encoding = fingerprint.encoding if fingerprint is not None else ""
        return {"encoding": encoding, "online_variant": self.model.online_variant}

    # ------------------------------------------------------------------ public API

    def answer(self, question: str, top_p: int | None = None, mu: float | None = None) -> Answer:
        """Retrieve, read and aggregate one question."""
        return self.answer_many([question], top_p=top_p, mu=mu)[0]

    def answer_many(
        self, questions: Iterable[str], top_p: int | None = None, mu: float | None = None
    ) -> list[Answer]:
        """Retrieve, read and aggregate several questions in one pass of the model."""
        mu = self.settings.mu if mu is None else mu
        check_mu(mu)
        return [aggregate(reading, mu, self.settings.n_best) for reading in self.retrieve_and_read(questions, top_p)]

    def retrieve_and_read(
        self, questions: Iterable[str], top_p: int | Sequence[int] | None = None
    ) -> list[Reading]:
        """BM25 top-p for each question (one top_p for all, or one per question), then `read` (questions are checked
        before any search)."""
        questions = _question_list(questions)
        top_p = self.settings.top_p if top_p is None else top_p
        per_question = isinstance(top_p, Sequence) and not isinstance(top_p, str)
        top_ps = list(top_p) if per_question else [top_p] * len(questions)
        if len(top_ps) != len(questions):
            raise DilstoreError(f"got {len(questions)} questions but {len(top_ps)} top_p values")
        top_ps = [checked_top_p(value) for value in top_ps]
        timings = Timings()
        tokenized = self._tokenize_questions(questions)
        if self.searcher is None:
            raise DilstoreError("this reader has no BM25 index; give candidate passages, or open it with an index")
        with timings.measure("retrieval"):
            hits = [self.searcher.search(folded(question), k) for question, k in zip(questions, top_ps, strict=True)]
        return self._read(questions, tokenized, hits, timings)

    def read(self, questions: Iterable[str], candidates: Iterable[Iterable[Hit | str]]) -> list[Reading]:
        """Read each question against its own candidates: BM25 hits, or bare passage ids (s_bm25 = 0). A passage
        given twice is read once, with its first hit (each span was found twice), as `rerank` scores an id once."""
        questions = _question_list(questions)
        what = "candidates must hold one list of passage ids (or hits) per question"
        candidates = [as_list(row, what) for row in as_list(candidates, what)]
        if len(questions) != len(candidates):
            raise DilstoreError(f"got {len(questions)} questions but {len(candidates)} candidate lists")
        wrong = next((item for row in candidates for item in row if not isinstance(item, Hit | str)), None)
        if wrong is not None:  # str() read 421 as the id "421" where `rerank` and `fetch` refuse it (left55 F5)
            raise DilstoreError(f"candidates must hold passage ids (strings) or hits, got {type(wrong).__name__} "
                                f"{wrong!r:.60}")  # fmt: skip
        tokenized = self._tokenize_questions(questions)
        hits = [_first_of_each(item if isinstance(item, Hit) else Hit(item, 0.0) for item in row)
                for row in candidates]  # fmt: skip
        return self._read(questions, tokenized, hits, Timings())

    def passage_logits(self, question: str, passage_ids: Iterable[str]) -> list[PassageLogits]:
        """Start/end logits of one question over each given stored passage (what decoding sees)."""
        tokenized = self._tokenize_questions([question])
        timings = Timings()
        passages = self._fetch(as_list(passage_ids, "passage_ids must be a list of passage ids"), timings)
        pairs = [_Pair(0, index, len(tokenized[0]) + len(p.token_ids)) for index, p in enumerate(passages)]
        question_states, question_mask = self._question_states(tokenized, timings)
        logits = self._interaction_logits(pairs, question_states, question_mask, passages, timings)
        return [PassageLogits(passages[pair.passage].id, *logits[index]) for index, pair in enumerate(pairs)]

    def tokenize_question(self, question: str) -> TokenizedText:
        """`[CLS] q [SEP]` of one question; an empty or over-long question raises DilstoreError."""
        limit = self.settings.max_question_length
        if not isinstance(question, str):
            raise DilstoreError(f"a question must be a string, got {type(question).__name__}")
        if not question.strip():
            raise DilstoreError("the question is empty")
        question = folded(question)  # full-width letters read as the passages spell them
        if len(question) > limit * _CHARS_PER_PIECE_LIMIT:
            question = spaced(question)  # read without its padding (serve46 F3, review46 L3)
        if (length := len(question)) > limit * _CHARS_PER_PIECE_LIMIT:
            raise DilstoreError(
                f"the question is {length} characters long; questions may have at most {limit} tokens"
            )
        tokens = encode_question(self.model.tokenizer, question, limit)
        if tokens.truncated:
            raise DilstoreError(
                f"the question ({len(question.split())} words) is longer than {limit} tokens; shorten it"
            )
        return tokens

    # ------------------------------------------------------------------ stages

    def _tokenize_questions(self, questions: Sequence[str]) -> list[TokenizedText]:
        """`tokenize_question` for each question; at least one is needed."""
        if not questions:
            raise DilstoreError("no question given")
        return [self.tokenize_question(question) for question in questions]

    def _read(
        self,
        questions: Sequence[str],
        tokenized: Sequence[TokenizedText],
        hits: Sequence[Sequence[Hit]],
        timings: Timings,
    ) -> list[Reading]:
        """Question layers once per question, one fetch of every distinct passage, all pairs, decode."""
        unique_ids = list(dict.fromkeys(hit.passage_id for row in hits for hit in row))
        passages = self._fetch(unique_ids, timings) if unique_ids else []
        position = {passage.id: index for index, passage in enumerate(passages)}
        pairs = [
            _Pair(q, position[hit.passage_id], len(tokenized[q]) + len(passages[position[hit.passage_id]].token_ids))
            for q, row in enumerate(hits)
            for hit in row
        ]
        question_states, question_mask = self._question_states(tokenized, timings)
        logits = self._interaction_logits(pairs, question_states, question_mask, passages, timings)
        spans: list[list[Span]] = [[] for _ in questions]
        with timings.measure("decode"):
            pair_index = 0
            for q, row in enumerate(hits):
                for hit in row:
                    passage = passages[pairs[pair_index].passage]
                    start, end = logits[pair_index]
                    spans[q].extend(self._decode(passage, hit, start, end))
                    pair_index += 1
        return [
            Reading(
                question=questions[q],
                hits=tuple(row),
                passages={hit.passage_id: passages[position[hit.passage_id]] for hit in row},
                spans=tuple(spans[q]),
                timings=timings,
            )
            for q, row in enumerate(hits)
        ]

    def _fetch(self, passage_ids: Sequence[str], timings: Timings) -> list[StoredPassage]:
        """The stored passages, in the order asked; a missing id raises the store's DilstoreError."""
        with timings.measure("store_read"):
            return list(self.store.fetch(passage_ids))

    def _question_states(
        self, tokenized: Sequence[TokenizedText], timings: Timings
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers 1..k over all questions at once: states (Q, nq, d) and mask (Q, nq)."""
        with timings.measure("question_layers"), torch.inference_mode():
            ids, mask = pad_token_ids([t.token_ids for t in tokenized], self._pad_id)  # (Q, nq), (Q, nq)
            ids, mask = ids.to(self.device), mask.to(self.device)
            return self.model.encode_questions(ids, mask), mask  # (Q, nq, d), (Q, nq)

    def _interaction_logits(
        self,
        pairs: Sequence[_Pair],
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
        passages: Sequence[StoredPassage],
        timings: Timings,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Layers k+1..l over every pair in length-bucketed batches; per pair (start, end) over its passage."""
        policy = BatchPolicy(self.settings.pair_batch_tokens, self.settings.max_pairs_per_batch)
        results: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0), np.empty(0))] * len(pairs)
        question_lengths = [int(length) for length in question_mask.sum(dim=1).tolist()]  # (Q,)
        with timings.measure("interaction_layers"), torch.inference_mode():
            for batch in length_batches([pair.length for pair in pairs], policy):
                members = [pairs[index] for index in batch]
                hidden, mask = self._joined(members, question_states, question_lengths, passages)  # (b, w, d), (b, w)
                start, end = self.model.read_joined(hidden, mask)  # each (b, w)
                start, end = start.float().cpu().numpy(), end.float().cpu().numpy()  # each (b, w)
                for row, (index, pair) in enumerate(zip(batch, members, strict=True)):
                    first = question_lengths[pair.question]
                    last = first + len(passages[pair.passage].token_ids)
                    results[index] = (start[row, first:last].copy(), end[row, first:last].copy())
        return results

    def _joined(
        self,
        members: Sequence[_Pair],
        question_states: torch.Tensor,
        question_lengths: Sequence[int],
        passages: Sequence[StoredPassage],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's question states, then its passage's, with no padding between, right-padded to the longest
        pair: hidden (b, w, d) and mask (b, w), as wide as `length_batches` counted the batch.

        Padded apart (the longest question, then the longest passage) a batch mixing a 3- and a 62-token question
        ran 63% more tokens than its pairs held and went over --pair-batch-tokens (ask50 F1).
        """
        dtype = self.model.model.dtype
        p_states, _ = pad_stored_states([passages[pair.passage] for pair in members], self.device, dtype)  # (b, np, d)
        width = max(pair.length for pair in members)
        hidden = torch.zeros((len(members), width, p_states.shape[-1]), dtype=dtype, device=self.device)  # (b, w, d)
        mask = torch.zeros((len(members), width), dtype=torch.long, device=self.device)  # (b, w)
        for row, pair in enumerate(members):
            nq, n = question_lengths[pair.question], pair.length
            hidden[row, :nq] = question_states[pair.question, :nq]
            hidden[row, nq:n] = p_states[row, : n - nq]
            mask[row, :n] = 1
        return hidden, mask

    def _decode(self, passage: StoredPassage, hit: Hit, start: np.ndarray, end: np.ndarray) -> list[Span]:
        """The passage's n-best spans as Spans with their text sliced from the stored passage.

        A passage none of whose logits is finite was read from states that are not (a damaged store): a
        DilstoreError naming it, where its spans were dropped and the question got an empty answer (hostile46 F7).
        """
        if start.size and not (np.isfinite(start).any() and np.isfinite(end).any()):
            raise DilstoreError(f"passage {passage.id!r}: its score is not finite, {non_finite_cause(passage)}")
        candidates = best_spans(
            start,
            end,
            passage.char_spans,
            n_best=self.settings.n_best,
            max_answer_length=self.settings.max_answer_length,
        )
        return [
            Span(
                passage_id=passage.id,
                text=passage.text[candidate.char_start : candidate.char_end],
                start_token=candidate.start,
                end_token=candidate.end,
                char_start=candidate.char_start,
                char_end=candidate.char_end,
                reader_score=candidate.score,
                bm25_score=hit.score,
            )
            for candidate in candidates
        ]


def load_store_model(
    store: Store, model_dir: str | Path | None = None, *, online_variant: bool = True
) -> DilBertReader:
    """The reader for a store: `model_dir` (default: the shipped checkpoint), checked against the store.

    k comes from the checkpoint's dilstore.json, or from the store when the
    checkpoint is a base model without one. The store's fingerprint must
    equal the model's (for the store's own encoding and max length), else
    FingerprintMismatchError shows both. Then, with `online_variant`, the
    checkpoint's online layers tuned for the store's encoding are swapped in
    where it has them (reader/modeling/online_variants.py).
    """
    fingerprint = store.fingerprint
    require_reader_kind(fingerprint.kind, store.url)
    directory = reader_dir(model_dir)
    layers = None if read_metadata(require_checkpoint_dir(directory)) is not None else fingerprint.layers
    model = DilBertReader.from_pretrained(directory, layers=layers)
    expected = model_fingerprint(model, DilBertReader.kind, fingerprint.encoding, fingerprint.max_length)
    advice = shipped_model_advice(store.manifest.creation, model_dir is None, store.manifest.appends)
    check_fingerprint(fingerprint, expected, f"store {store.url} (model {directory})", advice)
    if online_variant:
        load_online_variant(model, directory, fingerprint.encoding, expected.weights_sha256)
    return model


def require_question_fits(model_dir: str | Path | None, limit: int) -> None:
    """A DilstoreError when questions of `limit` tokens do not fit the positions of the reader at `model_dir`, read
    from its config before the model loads. `open_reader(max_question_length=100000)` was refused only once the model
    and the JVM had loaded, about 15 s (left55 F11). A folder whose config does not read is left to the model's
    loading, which says what is wrong with it."""
    directory = require_checkpoint_dir(reader_dir(model_dir))
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
    except LOAD_ERRORS:
        return
    require_segment_limit(config, limit, "question", "--max-question-length")


def open_reader(
    store_path: str | Path,
    model_dir: str | Path | None = None,
    *,
    index_dir: str | Path | None = None,
    with_index: bool = True,
    settings: OdqaSettings | None = None,
    device: str | None = None,
    online_variant: bool = True,
    reuse: OpenDomainReader | None = None,
) -> OpenDomainReader:
    """Open a store, load and check its model, and (with_index) its BM25 index, as one OpenDomainReader.

    The index is looked for before the model is loaded, and the fingerprint
    checked before the JVM starts, so a bad request fails fast.
    `online_variant`: as in `load_store_model`. `reuse`: a reader opened the
    same way (model_dir, online_variant) on an earlier build of this store;
    its model serves the new one when both builds carry the same fingerprint,
    so opening a changed store again holds one model in memory, not two.
    """
    store = open_store(store_path)
    # The kind before the index: an EARL store's user was first sent off to build one.
    require_reader_kind(store.fingerprint.kind, store.url)
    index = None
    if with_index:
        index = checked_reader_index(store.manifest, store_path, index_dir, store.location.local_root)
    if reuse is not None and reuse.store.fingerprint == store.fingerprint:
        model = reuse.model  # checked against an equal fingerprint when `reuse` opened
    else:
        require_question_fits(model_dir, (settings or OdqaSettings()).max_question_length)
        model = load_store_model(store, model_dir, online_variant=online_variant)
    searcher = Bm25Searcher(index) if index is not None else None
    if searcher is not None:
        require_all_passages(searcher, store.manifest, store_path)
    return OpenDomainReader(model, store, searcher, settings, device)


def _first_of_each(hits: Iterable[Hit]) -> list[Hit]:
    """`hits` in order, each passage's first only."""
    first: dict[str, Hit] = {}
    for hit in hits:
        first.setdefault(hit.passage_id, hit)
    return list(first.values())
