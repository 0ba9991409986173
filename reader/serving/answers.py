"""What the open-domain reader returns: spans, a question's reading, its aggregated answer, and stage timings.

The reader (reader/serving/odqa.py) produces a Reading per question;
`aggregate` ranks its spans by μ·s_r + (1 − μ)·s_bm25 into an Answer.
Open-domain evaluation scores Readings under several μ without reading twice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from dilstore.reader.retrieval import Hit
from dilstore.reader.serving.timing import StageTimer
from dilstore.storage.checks import finite_float, positive_int
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import shown
from dilstore.storage.records import StoredPassage

STAGES = ("retrieval", "store_read", "question_layers", "interaction_layers", "decode")
DEFAULT_TOP_P = 29  # passages retrieved per question when a caller gives none (the seed uses 29 and 100)


def checked_top_p(top_p: int) -> int:
    """top_p as an int; a DilstoreError unless it is a positive integer (a numpy one is taken)."""
    return positive_int("top_p", top_p)


def check_mu(mu: float) -> None:
    """Raise DilstoreError unless μ is a number with 0 ≤ μ ≤ 1 (an int past float's range was an OverflowError
    traceback, num58 F1)."""
    value = finite_float(mu)
    if value is None or not 0.0 <= value <= 1.0:
        raise DilstoreError(f"mu must be between 0 and 1, got {shown(mu)}")


@dataclass
class Timings(StageTimer):
    """Seconds spent per stage (wall clock); a batch of questions shares one Timings.

    interaction_layers covers assembling each padded batch (copying stored
    states into it and casting them to the model's dtype) plus layers
    k+1..l and the QA head; store_read covers fetching, including int8
    dequantization.
    """

    retrieval: float = 0.0
    store_read: float = 0.0
    question_layers: float = 0.0
    interaction_layers: float = 0.0
    decode: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, stage) for stage in STAGES)

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class Span:
    """One candidate answer in one passage: s_r from the reader, s_bm25 from retrieval.

    start_token/end_token are inclusive indices into the stored passage's
    tokens; char_start/char_end its [start, end) range in the passage text.
    """

    passage_id: str
    text: str
    start_token: int
    end_token: int
    char_start: int
    char_end: int
    reader_score: float
    bm25_score: float

    def score(self, mu: float) -> float:
        """The seed's final score μ·s_r + (1 − μ)·s_bm25."""
        return mu * self.reader_score + (1.0 - mu) * self.bm25_score

    def to_dict(self, mu: float) -> dict[str, Any]:
        """The span as one entry of `ask --json`'s `nbest`: its text, its final score under `mu`, the passage it is
        in, the reader's and BM25's scores, and its [char_start, char_end) code-point range in the passage text."""
        return {
            "text": self.text,
            "score": self.score(mu),
            "passage_id": self.passage_id,
            "reader_score": self.reader_score,
            "bm25_score": self.bm25_score,
            "char_start": self.char_start,
            "char_end": self.char_end,
        }


@dataclass(frozen=True)
class PassageLogits:
    """Start and end logits over one stored passage's tokens (its [SEP] included), each (n,)."""

    passage_id: str
    start: np.ndarray  # (n,) float32
    end: np.ndarray  # (n,) float32


@dataclass(frozen=True)
class Reading:
    """One question read against its candidate passages, before aggregation.

    hits: the candidates in retrieval order; passages: the stored passages
    by id; spans: each passage's n-best spans (all passages together);
    timings: of the call that read it (shared with the questions read with it).
    """

    question: str
    hits: tuple[Hit, ...]
    passages: dict[str, StoredPassage]
    spans: tuple[Span, ...]
    timings: Timings


@dataclass(frozen=True)
class Answer:
    """The aggregated answer to one question: the best span under μ, and the n-best list.

    passages: the passages read for it, by id, with their titles, texts, token ids and offsets but not their states
    (`states` is empty, `vector` None; `reader.store.fetch` gives them): a kept answer held every read passage's
    states, 3.3 MB an answer over a 2bit store, and kept a mapped store's files open after its reader closed
    (api54 F4).
    """

    question: str
    mu: float
    nbest: tuple[Span, ...]
    timings: Timings
    passages: dict[str, StoredPassage] = field(repr=False)

    @property
    def best(self) -> Span | None:
        """The span of the highest final score under the answer's μ (the first of `nbest`), or None when no passage
        gave a valid span."""
        return self.nbest[0] if self.nbest else None

    @property
    def text(self) -> str:
        """The best span's text, or "" when no passage gave a valid span."""
        return self.best.text if self.best else ""

    def to_dict(self) -> dict[str, Any]:
        """The `ask --json` document; the score fields are null when there is no answer.

        Each span's passage gives its title, and `passages` holds the title and text of every passage the n-best
        comes from: a client can then check the spans' offsets and show their context (`serve` has no passage
        endpoint). Offsets count code points (Python string indices) into the passage's text, without its title.
        """
        best = self.best
        titled = [{**span.to_dict(self.mu), "title": self.passages[span.passage_id].title} for span in self.nbest]
        shown = dict.fromkeys(span.passage_id for span in self.nbest)
        return {
            "question": self.question,
            "answer": self.text,
            "score": best.score(self.mu) if best else None,
            "passage_id": best.passage_id if best else None,
            "title": titled[0]["title"] if titled else None,
            "reader_score": best.reader_score if best else None,
            "bm25_score": best.bm25_score if best else None,
            "mu": self.mu,
            "nbest": titled,
            "passages": {key: {"title": self.passages[key].title, "text": self.passages[key].text} for key in shown},
            "timings": self.timings.to_dict(),
        }


def aggregate(reading: Reading, mu: float, n_best: int) -> Answer:
    """Rank a reading's spans by μ·s_r + (1 − μ)·s_bm25 (ties: retrieval order, then reader order).

    Every passage contributes its own n-best, and within a passage s_bm25 is
    constant, so the overall n-best under any μ is among them.
    """
    check_mu(mu)
    ranked = sorted(enumerate(reading.spans), key=lambda item: (-item[1].score(mu), item[0]))
    return Answer(
        question=reading.question,
        mu=float(mu),
        nbest=tuple(span for _, span in ranked[:n_best]),
        timings=reading.timings,
        passages={passage_id: _without_states(passage) for passage_id, passage in reading.passages.items()},
    )


def _without_states(passage: StoredPassage) -> StoredPassage:
    """`passage` with empty states (0, *state_shape) and no vector, its token ids and offsets copied out of the
    store's files (on the mapped path they are views that keep the shard files open)."""
    return replace(passage, token_ids=np.array(passage.token_ids), char_spans=np.array(passage.char_spans),
                   states=np.empty((0, *passage.states.shape[1:]), passage.states.dtype), vector=None)  # fmt: skip
