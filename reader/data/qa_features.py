"""run_squad-style sliding-window features for the delayed-interaction reader.

A SQuAD question becomes one feature per passage window. The question is
encoded once (`[CLS] q [SEP]`, at most `max_question_length` tokens) and the
paragraph is split by `encode_passage`'s rule with
max_length = max_seq_length − len(question) and stride = doc_stride, so that
question plus window never exceed max_seq_length; the seed's run_squad
defaults are 384 and 128.

Labels are token indices *within the passage window*. The answer's tokens are
the word pieces whose character span overlaps the answer's characters
[answer_start, answer_start + len(text)); a window is labelled only when it
holds all of them, otherwise (no answer, or an answer cut by the window's
edge) its labels are None. An answer that lies wholly inside several
overlapping windows is labelled in each. For training, the first reference
answer is used, as run_squad does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dilstore.reader.data.squad import SquadAnswer, SquadExample
from dilstore.reader.text.tokenization import (
    DEFAULT_STRIDE,
    TokenizedText,
    encode_question,
    passage_pieces,
    passage_window,
    window_starts,
)
from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_MAX_SEQ_LENGTH = 384
DEFAULT_MAX_QUESTION_LENGTH = 64


@dataclass(frozen=True, eq=False)
class QAFeature:
    """One (question, passage window) pair with its answer labels.

    `start_position` and `end_position` are inclusive token indices into
    `passage.token_ids`, or both None when this window does not hold the whole
    answer. `context` is the paragraph the window's character spans point
    into (shared, not copied, between the windows of a paragraph).
    """

    example_id: str
    window_index: int
    context: str
    question: TokenizedText
    passage: TokenizedText
    start_position: int | None
    end_position: int | None

    @property
    def has_answer(self) -> bool:
        """True when this window holds the whole labelled answer."""
        return self.start_position is not None


def answer_token_range(pieces: TokenizedText, char_start: int, char_end: int) -> tuple[int, int] | None:
    """The first and last token (inclusive) whose non-empty span overlaps characters [char_start, char_end).

    None when no token does (an answer made only of characters the tokenizer
    drops). Special tokens never overlap, since their span is (-1, -1).
    """
    starts, ends = pieces.char_spans[:, 0], pieces.char_spans[:, 1]  # (n,), (n,)
    overlapping = np.flatnonzero((starts < ends) & (starts < char_end) & (ends > char_start))
    if overlapping.size == 0:
        return None
    return int(overlapping[0]), int(overlapping[-1])


def answer_text(context: str, window: TokenizedText, start: int, end: int) -> str:
    """The text of window tokens start..end (inclusive): the context between their character spans."""
    char_start, char_end = window.char_range(start, end)
    return context[char_start:char_end]


def question_features(
    tokenizer: PreTrainedTokenizerBase,
    example_id: str,
    question: str,
    context: str,
    answer: SquadAnswer | None,
    *,
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH,
    doc_stride: int = DEFAULT_STRIDE,
    max_question_length: int = DEFAULT_MAX_QUESTION_LENGTH,
    pieces: TokenizedText | None = None,
    encoded_question: TokenizedText | None = None,
) -> list[QAFeature]:
    """All window features of one question; `answer` None gives unlabelled (inference) features.

    `pieces` may pass the context's word pieces (`passage_pieces`) when many
    questions share a paragraph, and `encoded_question` the question's
    `encode_question` when it is read against many paragraphs; they are
    computed here otherwise.
    """
    check_window_lengths(max_seq_length, doc_stride, max_question_length)
    if encoded_question is None:
        encoded_question = encode_question(tokenizer, question, max_question_length)
    if pieces is None:
        pieces = passage_pieces(tokenizer, context)
    window_pieces = max_seq_length - len(encoded_question) - 1
    answer_tokens = None
    if answer is not None:
        answer_tokens = answer_token_range(pieces, answer.answer_start, answer.answer_end)
    features = []
    for index, first in enumerate(window_starts(len(pieces), window_pieces, doc_stride)):
        stop = min(first + window_pieces, len(pieces))
        start_position = end_position = None
        if answer_tokens is not None and first <= answer_tokens[0] and answer_tokens[1] < stop:
            start_position, end_position = answer_tokens[0] - first, answer_tokens[1] - first
        features.append(
            QAFeature(
                example_id=example_id,
                window_index=index,
                context=context,
                question=encoded_question,
                passage=passage_window(tokenizer, pieces, first, stop),
                start_position=start_position,
                end_position=end_position,
            )
        )
    return features


def build_features(
    tokenizer: PreTrainedTokenizerBase,
    examples: Iterable[SquadExample],
    *,
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH,
    doc_stride: int = DEFAULT_STRIDE,
    max_question_length: int = DEFAULT_MAX_QUESTION_LENGTH,
    labelled: bool = True,
) -> Iterator[QAFeature]:
    """Window features for SQuAD examples in order, labelled with each example's first answer.

    With `labelled` False (or for an example without answers) every window is
    unlabelled. A paragraph is tokenized once for all its consecutive
    questions. Errors name the question id.
    """
    check_window_lengths(max_seq_length, doc_stride, max_question_length)
    context, pieces = None, None
    for example in examples:
        try:
            if example.context != context:
                context, pieces = example.context, passage_pieces(tokenizer, example.context)
            answer = example.answers[0] if labelled and example.answers else None
            yield from question_features(
                tokenizer,
                example.id,
                example.question,
                example.context,
                answer,
                max_seq_length=max_seq_length,
                doc_stride=doc_stride,
                max_question_length=max_question_length,
                pieces=pieces,
            )
        except DilstoreError as error:
            raise DilstoreError(f"question {example.id!r}: {error}") from None


class Windowing(Protocol):
    """How questions and paragraphs are cut into windows: ReadingSettings and the QA TrainingConfig both say it."""

    max_seq_length: int
    doc_stride: int
    max_question_length: int


def window_features(
    tokenizer: PreTrainedTokenizerBase,
    examples: Iterable[SquadExample],
    windowing: Windowing,
    *,
    labelled: bool = True,
) -> list[QAFeature]:
    """`build_features` with the window sizes of `windowing`, as a list."""
    return list(
        build_features(
            tokenizer,
            examples,
            max_seq_length=windowing.max_seq_length,
            doc_stride=windowing.doc_stride,
            max_question_length=windowing.max_question_length,
            labelled=labelled,
        )
    )


def check_window_lengths(max_seq_length: int, doc_stride: int, max_question_length: int) -> None:
    """Question plus a window of at least one word piece and its [SEP] must fit in max_seq_length. `evaluate-rc` and
    `train qa` check their options with it before torch loads: they were refused at the first window, after the
    model's load, 5-8 s (left61 F7)."""
    if max_question_length < 1 or doc_stride < 1:
        raise DilstoreError(
            f"max-question-length and doc-stride must be at least 1, got {max_question_length} and {doc_stride}"
        )
    if max_seq_length < max_question_length + 2:
        raise DilstoreError(
            f"max-seq-length ({max_seq_length}) must exceed max-question-length ({max_question_length}) by at least 2, "
            "to leave room for a passage word piece and its [SEP]"
        )


def require_stride_within_window(doc_stride: int, max_seq_length: int) -> None:
    """A DilstoreError when the stride from one training window's start to the next is not below the window's
    length (TrainingConfig; `train qa` checks its options with it before torch loads, left61 F7)."""
    if doc_stride >= max_seq_length:
        raise DilstoreError(f"doc-stride ({doc_stride}) must be smaller than max-seq-length ({max_seq_length})")
