"""Sliding-window QA features: labels inside windows, the hard cases, real SQuAD round trips, and batching."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.batching import pad_token_ids
from dilstore.reader.data.qa_batches import NO_ANSWER_TARGET, collate_features
from dilstore.reader.data.qa_features import (
    QAFeature,
    answer_text,
    answer_token_range,
    build_features,
    question_features,
)
from dilstore.reader.data.squad import SquadAnswer, SquadExample, load_squad
from dilstore.reader.evaluation.squad_metric import normalize_answer
from dilstore.reader.text.tokenization import encode_passage, encode_question, passage_pieces, window_starts
from dilstore.storage.errors import DilstoreError
from tests.fixtures.tokenizer_fixtures import minilm_tokenizer, tiny_bpe_tokenizer

QUESTION = "Which numbers?"
# Numbers 100..199 are one WordPiece each in the MiniLM vocabulary, so piece i of this context is "10i"-ish.
NUMBERS = " ".join(str(number) for number in range(100, 200))
UNICODE_CONTEXT = (
    "Die Zürcher Straßenbahn 😀 fährt seit 1882. 東京は日本の首都です。 "
    "Crème brûlée costs €4.50 🎉 at the café, says Ἀριστοτέλης in naïve Ελληνικά."
)
UNICODE_ANSWERS = ["Zürcher Straßenbahn", "1882", "東京", "日本", "Crème brûlée", "€4.50", "café", "Ἀριστοτέλης", "😀"]


def numbers_answer(first: int, length: int) -> SquadAnswer:
    """The answer made of pieces first..first+length-1 of NUMBERS."""
    text = " ".join(str(100 + i) for i in range(first, first + length))
    return SquadAnswer(text=text, answer_start=NUMBERS.index(text))


def features_with_window(
    tokenizer, context: str, answer: SquadAnswer, window_pieces: int, stride: int
) -> list[QAFeature]:
    """Features whose windows hold exactly `window_pieces` word pieces (max_seq_length chosen to match)."""
    question_length = len(encode_question(tokenizer, QUESTION, 64))
    return question_features(
        tokenizer,
        "q",
        QUESTION,
        context,
        answer,
        max_seq_length=question_length + window_pieces + 1,
        doc_stride=stride,
        max_question_length=question_length,
    )


def test_numbers_context_has_one_piece_per_number() -> None:
    assert len(passage_pieces(minilm_tokenizer(), NUMBERS)) == 100


def test_an_answer_cut_by_a_window_edge_is_labelled_only_in_windows_that_hold_it() -> None:
    """Windows of 10 pieces every 4: pieces 8..10 straddle window 0's end, lie inside windows 1 and 2."""
    features = features_with_window(minilm_tokenizer(), NUMBERS, numbers_answer(8, 3), window_pieces=10, stride=4)
    labels = [(f.start_position, f.end_position) for f in features[:4]]
    assert labels == [(None, None), (4, 6), (0, 2), (None, None)]
    assert all(f.start_position is None for f in features[3:])
    for feature in features[1:3]:
        assert answer_text(NUMBERS, feature.passage, feature.start_position, feature.end_position) == "108 109 110"


def test_an_answer_at_the_very_start_and_end_of_the_passage() -> None:
    tokenizer = minilm_tokenizer()
    first = features_with_window(tokenizer, NUMBERS, numbers_answer(0, 2), window_pieces=10, stride=4)
    assert [f.window_index for f in first if f.has_answer] == [0]
    last = features_with_window(tokenizer, NUMBERS, numbers_answer(97, 3), window_pieces=10, stride=4)
    labelled = [f for f in last if f.has_answer]
    assert labelled[-1] is last[-1] and last[-1].end_position == len(last[-1].passage) - 2  # just before [SEP]
    assert {answer_text(NUMBERS, f.passage, f.start_position, f.end_position) for f in labelled} == {"197 198 199"}


@given(
    first=st.integers(0, 99),
    length=st.integers(1, 12),
    window_pieces=st.integers(1, 30),
    stride=st.integers(1, 30),
)
@settings(max_examples=150, deadline=None)
def test_labels_appear_in_exactly_the_windows_that_hold_the_whole_answer(
    first: int, length: int, window_pieces: int, stride: int
) -> None:
    length = min(length, 100 - first)
    answer = numbers_answer(first, length)
    features = features_with_window(minilm_tokenizer(), NUMBERS, answer, window_pieces, stride)
    starts = window_starts(100, window_pieces, stride)
    assert len(features) == len(starts)
    for feature, start in zip(features, starts, strict=True):
        holds = start <= first and first + length <= start + window_pieces
        assert feature.has_answer == holds
        if holds:
            assert (feature.start_position, feature.end_position) == (first - start, first + length - 1 - start)
            assert answer_text(NUMBERS, feature.passage, feature.start_position, feature.end_position) == answer.text
    if length <= window_pieces - min(stride, window_pieces) + 1:  # the overlap guarantees a window that holds it
        assert any(feature.has_answer for feature in features)


@pytest.mark.parametrize("answer", UNICODE_ANSWERS)
@pytest.mark.parametrize("window_pieces", [24, 200])  # 24: several windows, each able to hold any answer
def test_unicode_answers_come_back_from_python_string_offsets(answer: str, window_pieces: int) -> None:
    """Accents, ß, CJK, polytonic Greek and emoji: offsets are Python str indices into the original text."""
    gold = SquadAnswer(text=answer, answer_start=UNICODE_CONTEXT.index(answer))
    wordpiece = features_with_window(minilm_tokenizer(), UNICODE_CONTEXT, gold, window_pieces, stride=3)
    labelled = [f for f in wordpiece if f.has_answer]
    assert labelled
    assert {answer_text(UNICODE_CONTEXT, f.passage, f.start_position, f.end_position) for f in labelled} == {answer}
    # A byte-level token may also hold bytes of a neighbouring character, so BPE spans can only grow.
    bpe = features_with_window(tiny_bpe_tokenizer(), UNICODE_CONTEXT, gold, window_pieces, stride=3)
    labelled = [f for f in bpe if f.has_answer]
    assert labelled
    for feature in labelled:
        char_start, char_end = feature.passage.char_range(feature.start_position, feature.end_position)
        assert char_start <= gold.answer_start and gold.answer_end <= char_end
        assert answer in answer_text(UNICODE_CONTEXT, feature.passage, feature.start_position, feature.end_position)


@pytest.mark.parametrize("make_tokenizer", [minilm_tokenizer, tiny_bpe_tokenizer])
def test_feature_windows_are_encode_passage_windows(make_tokenizer) -> None:
    """Windows are exactly encode_passage(context, max_seq_length − len(question), doc_stride); pairs fit."""
    tokenizer = make_tokenizer()
    answer = SquadAnswer("café", UNICODE_CONTEXT.index("café"))
    example = SquadExample("T", UNICODE_CONTEXT, "q", "Who says so? " * 30, (answer,))
    features = list(build_features(tokenizer, [example], max_seq_length=40, doc_stride=5, max_question_length=16))
    question = features[0].question
    assert question.truncated and len(question) == 16
    windows = encode_passage(tokenizer, UNICODE_CONTEXT, max_length=40 - 16, stride=5)
    assert len(features) == len(windows) > 1
    for feature, window in zip(features, windows, strict=True):
        assert feature.question is question
        assert feature.passage.token_ids.tolist() == window.token_ids.tolist()
        assert feature.passage.char_spans.tolist() == window.char_spans.tolist()
        assert len(feature.question) + len(feature.passage) <= 40


def test_unlabelled_features_and_examples_without_answers() -> None:
    tokenizer = minilm_tokenizer()
    answered = SquadExample("T", NUMBERS, "a", QUESTION, (numbers_answer(3, 2),))
    unanswered = SquadExample("T", NUMBERS, "b", QUESTION, ())
    small = dict(max_seq_length=32, doc_stride=8, max_question_length=16)
    labelled = list(build_features(tokenizer, [answered, unanswered], **small))
    assert any(f.has_answer for f in labelled if f.example_id == "a")
    assert not any(f.has_answer for f in labelled if f.example_id == "b")
    assert not any(f.has_answer for f in build_features(tokenizer, [answered], **small, labelled=False))


def test_an_example_of_several_answers_is_labelled_with_its_first() -> None:
    """SQuAD dev questions list several answers; training labels the first (run_squad's rule, the docstring's), so
    every labelled window gives back the first answer's text, never a later one's."""
    tokenizer = minilm_tokenizer()
    first, later = numbers_answer(3, 2), numbers_answer(60, 1)
    example = SquadExample("T", NUMBERS, "several", QUESTION, (first, later))
    features = list(build_features(tokenizer, [example], max_seq_length=32, doc_stride=8, max_question_length=16))
    labelled = [feature for feature in features if feature.has_answer]
    assert labelled
    for feature in labelled:
        assert answer_text(feature.context, feature.passage, feature.start_position, feature.end_position) == "103 104"


def test_an_answer_of_dropped_characters_has_no_tokens() -> None:
    pieces = passage_pieces(minilm_tokenizer(), "abc \x00\x00 def")
    assert answer_token_range(pieces, 4, 6) is None
    assert answer_token_range(pieces, 2, 9) == (0, 1)


def test_a_bare_whitespace_token_s_empty_span_never_starts_an_answer() -> None:
    """RoBERTa's "Ġ" before a double space has the empty span (8, 8): an answer from the first of the two spaces
    starts at "Ġs", not at the empty token inside its characters (mut58: the empty-span filter was untested)."""
    pieces = passage_pieces(tiny_bpe_tokenizer(), "the cat  sat on the mat")
    assert tuple(pieces.char_spans[4]) == (8, 8)  # the bare "Ġ"
    assert answer_token_range(pieces, 7, 12) == (5, 7)


def test_bad_settings_and_bad_questions_are_user_errors() -> None:
    tokenizer = minilm_tokenizer()
    example = SquadExample("T", NUMBERS, "q-empty", "   ", ())
    with pytest.raises(DilstoreError, match="question 'q-empty': the question is empty"):
        list(build_features(tokenizer, [example]))
    with pytest.raises(DilstoreError, match="max-seq-length .* must exceed max-question-length"):
        list(build_features(tokenizer, [example], max_seq_length=64, max_question_length=64))
    with pytest.raises(DilstoreError, match="must be at least 1"):
        list(build_features(tokenizer, [example], doc_stride=0))


def test_max_seq_length_must_leave_a_question_of_max_length_one_piece_and_its_sep() -> None:
    """At max-question-length + 1 a question of full length left windows of no word piece (mut58: the bound was
    tested only at max-question-length itself); at + 2 each window is one piece and [SEP]."""
    tokenizer = minilm_tokenizer()
    long_question = SquadExample("T", "100 101 102", "q-long", NUMBERS, ())  # a question of over 64 pieces
    with pytest.raises(DilstoreError, match="max-seq-length .* must exceed max-question-length"):
        list(build_features(tokenizer, [long_question], max_seq_length=65, max_question_length=64))
    features = list(build_features(tokenizer, [long_question], max_seq_length=66, max_question_length=64))
    assert [(len(feature.question), len(feature.passage)) for feature in features] == [(64, 2)] * 3


@pytest.fixture(scope="module")
def train_sample(shared_data: Path) -> list[SquadExample]:
    """500 SQuAD v1.1 train questions drawn with a fixed seed."""
    examples = load_squad(shared_data / "squad" / "train-v1.1.json")
    return random.Random(5).sample(examples, 500)


@pytest.mark.shared_data
@pytest.mark.parametrize(("max_seq_length", "doc_stride"), [(384, 128), (96, 32)])
def test_real_squad_labels_map_back_to_the_gold_answer(
    train_sample: list[SquadExample], max_seq_length: int, doc_stride: int
) -> None:
    """Every labelled window of 500 train questions gives back the normalised gold answer.

    The only exceptions are answers that start or end inside a word piece
    (the data's answer_start is the answer text's first occurrence, which can
    fall inside a longer word: "3" inside "32"); the label then covers the
    whole piece, so the gold answer is a strict part of the labelled text.
    """
    tokenizer = minilm_tokenizer()
    gold = {example.id: example.answers[0] for example in train_sample}
    features = list(build_features(tokenizer, train_sample, max_seq_length=max_seq_length, doc_stride=doc_stride))
    labelled = [feature for feature in features if feature.has_answer]
    assert {feature.example_id for feature in labelled} == set(gold)
    exact = 0
    for feature in labelled:
        answer = gold[feature.example_id]
        text = answer_text(feature.context, feature.passage, feature.start_position, feature.end_position)
        if normalize_answer(text) == normalize_answer(answer.text):
            exact += 1
            continue
        char_start, char_end = feature.passage.char_range(feature.start_position, feature.end_position)
        assert (char_start, char_end) != (answer.answer_start, answer.answer_end)
        assert char_start <= answer.answer_start and answer.answer_end <= char_end
    assert exact / len(labelled) >= 0.99


def test_collate_pads_and_targets_the_concatenation() -> None:
    tokenizer = minilm_tokenizer()
    short = question_features(
        tokenizer, "s", "Which?", NUMBERS, numbers_answer(2, 2), max_seq_length=24, doc_stride=6, max_question_length=8
    )
    long = question_features(
        tokenizer,
        "l",
        "Which numbers come after one hundred and four?",
        NUMBERS,
        numbers_answer(5, 1),
        max_seq_length=40,
        max_question_length=20,
    )
    batch_features = [short[0], short[-1], long[0]]
    batch = collate_features(batch_features, tokenizer.pad_token_id)
    question_width = max(len(f.question) for f in batch_features)
    passage_width = max(len(f.passage) for f in batch_features)
    assert batch.question_ids.shape == batch.question_mask.shape == (3, question_width)
    assert batch.passage_ids.shape == batch.passage_mask.shape == (3, passage_width)
    assert batch.question_mask.sum(1).tolist() == [len(f.question) for f in batch_features]
    assert batch.passage_mask.sum(1).tolist() == [len(f.passage) for f in batch_features]
    assert (batch.question_ids[batch.question_mask == 0] == tokenizer.pad_token_id).all()
    assert (batch.passage_ids[batch.passage_mask == 0] == tokenizer.pad_token_id).all()
    assert batch.start_targets.tolist() == [question_width + 2, NO_ANSWER_TARGET, question_width + 5]
    assert batch.end_targets.tolist() == [question_width + 3, NO_ANSWER_TARGET, question_width + 5]
    pairs = torch.cat([batch.question_ids, batch.passage_ids], dim=1)  # (b, nq + np)
    assert pairs[0, batch.start_targets[0]] == short[0].passage.token_ids[2]
    assert pairs[1, 0] == tokenizer.cls_token_id
    moved = batch.to("cpu")
    assert moved.start_targets.dtype == torch.long and torch.equal(moved.passage_ids, batch.passage_ids)


def test_a_batch_goes_to_a_gpu_through_pinned_memory_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy from pageable memory would make the host wait for the GPU's queue; here no GPU is needed to see
    that every tensor is pinned first and copied with non_blocking (the calls are recorded, not run)."""
    tokenizer = minilm_tokenizer()
    features = question_features(
        tokenizer, "s", "Which?", NUMBERS, numbers_answer(2, 2), max_seq_length=24, doc_stride=6, max_question_length=8
    )
    batch = collate_features(features, tokenizer.pad_token_id)
    calls: list[tuple[str, object]] = []

    def pin(tensor: torch.Tensor) -> torch.Tensor:
        calls.append(("pin", tensor.data_ptr()))
        return tensor

    def to(tensor: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
        calls.append(("to", (str(device), non_blocking)))
        return tensor

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    batch.to("cuda:0")
    tensors = len(dataclasses.fields(batch))
    assert [name for name, _ in calls].count("pin") == tensors
    assert [value for name, value in calls if name == "to"] == [("cuda:0", True)] * tensors


def test_pad_token_ids_refuses_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="empty"):
        pad_token_ids([], 0)
