"""The shared token conventions: `[CLS] q [SEP]` questions, `p [SEP]` windows, character spans into the text.

Run against the packaged MiniLM WordPiece tokenizer and a tiny RoBERTa-style
byte-level BPE (tests/fixtures/tokenizer_fixtures.py).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.convert_slow_tokenizer import bytes_to_unicode

from dilstore.reader.text import tokenization
from dilstore.reader.text.tokenization import (
    TokenizedText,
    encode_document,
    encode_passage,
    encode_query,
    encode_question,
    encode_questions,
    passage_pieces,
    passage_pieces_many,
    window_starts,
)
from dilstore.storage.errors import DilstoreError
from tests.fixtures.tokenizer_fixtures import minilm_tokenizer, tiny_bpe_tokenizer

TOKENIZERS = {"wordpiece": minilm_tokenizer, "bpe": tiny_bpe_tokenizer}
# Arbitrary Unicode, plus the scripts and whitespace that split or merge characters in interesting ways.
TRICKY = list("日本語東京김치한국어😀🎉 ÉéüçЖ\t\n\u3000\u00a0\u0301.,'-€$") + ["[SEP]", "</s>", "e\u0301"]
TEXTS = st.lists(st.one_of(st.characters(codec="utf-8"), st.sampled_from(TRICKY)), max_size=60).map("".join)
# The tokenizer fixture hands out one cached tokenizer, so sharing it across examples is safe.
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(params=sorted(TOKENIZERS))
def tokenizer(request: pytest.FixtureRequest):
    return TOKENIZERS[request.param]()


def test_question_uses_the_tokenizers_single_sequence_template(tokenizer) -> None:
    question = "Who runs the Zürich tram network?"
    encoded = encode_question(tokenizer, question, max_length=64)
    assert encoded.token_ids.tolist() == tokenizer(question)["input_ids"]
    assert encoded.token_ids[0] == tokenizer.cls_token_id and encoded.token_ids[-1] == tokenizer.sep_token_id
    assert encoded.char_spans[0].tolist() == [-1, -1] and encoded.char_spans[-1].tolist() == [-1, -1]
    assert (encoded.char_spans[1:-1] >= 0).all()
    assert encoded.token_ids.dtype == np.int32 and encoded.char_spans.dtype == np.int32
    assert not encoded.truncated


def test_passage_window_is_word_pieces_then_separator(tokenizer) -> None:
    text = "The café on the corner sells crème brûlée for €4.50."
    (window,) = encode_passage(tokenizer, text, max_length=128)
    pieces = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert window.token_ids.tolist() == pieces + [tokenizer.sep_token_id]
    assert window.char_spans[-1].tolist() == [-1, -1]
    assert window.is_text.tolist() == [True] * len(pieces) + [False]


def test_special_token_strings_in_the_text_stay_text(tokenizer) -> None:
    """A literal "[SEP]" or "</s>" in a passage never becomes the separator: the only one is appended."""
    text = "Split [SEP] here </s> and <s> [CLS] there."
    (window,) = encode_passage(tokenizer, text, max_length=128)
    assert (window.token_ids == tokenizer.sep_token_id).sum() == 1
    assert not np.isin(window.token_ids[:-1], tokenizer.all_special_ids).any()


def test_an_over_long_question_is_truncated_and_says_so(tokenizer) -> None:
    question = " ".join(["Which"] * 10_000) + "?"
    encoded = encode_question(tokenizer, question, max_length=64)
    assert encoded.truncated
    assert len(encoded) == 64
    assert encoded.token_ids[0] == tokenizer.cls_token_id and encoded.token_ids[-1] == tokenizer.sep_token_id
    assert encoded.char_spans[-2, 1] < len(question) // 10


def test_document_uses_the_single_sequence_template_truncated_to_its_first_tokens(tokenizer) -> None:
    document = "Zürich trams run every seven minutes. " * 20
    full = tokenizer(document)["input_ids"]
    encoded = encode_document(tokenizer, document, max_length=16)
    assert encoded.truncated and encoded.token_ids.tolist() == full[:15] + [full[-1]]
    short = encode_document(tokenizer, "Zürich trams", max_length=16)
    assert not short.truncated and short.token_ids.tolist() == tokenizer("Zürich trams")["input_ids"]
    with pytest.raises(DilstoreError, match="the document is empty"):
        encode_document(tokenizer, " \n", max_length=16)


WORDS = st.lists(st.one_of(TEXTS, st.sampled_from(["\u200b", "\u0301", "", "a", "word"])), min_size=1, max_size=40)
SPACES = [" ", "  ", "\t", "\n", "\r", "\u3000", "\x0b", "\x0c", "\x85", "\x1c"]  # the last four: BERT deletes them


@PROPERTY
@given(words=WORDS, spaces=st.lists(st.sampled_from(SPACES), min_size=40, max_size=40),
       max_length=st.integers(3, 12))
def test_a_text_cut_after_its_first_words_tokenizes_as_the_whole(
    tokenizer, words: list[str], spaces: list[str], max_length: int
) -> None:
    """A long text is tokenized from the prefix that holds its first max_length words (a 750 KB query was tokenized
    whole, twice, to keep 32 tokens; rank38 M3): the tokens, spans and truncation are those of the whole text, words
    of no word piece (a zero-width space, a lone mark) included."""
    text = "".join(word + space for word, space in zip(words, spaces))
    with mock.patch.object(tokenization, "_CHARS_PER_WORD", 10**9):  # the whole text, always
        try:
            whole = encode_document(tokenizer, text, max_length)
        except DilstoreError as error:
            whole = str(error)
    with mock.patch.object(tokenization, "_CHARS_PER_WORD", 0):  # cut after its first words, always
        try:
            cut = encode_document(tokenizer, text, max_length)
        except DilstoreError as error:
            cut = str(error)
    if isinstance(whole, str):
        assert cut == whole
    else:
        assert not isinstance(cut, str), cut
        assert cut.token_ids.tolist() == whole.token_ids.tolist() and cut.truncated == whole.truncated
        assert cut.char_spans.tolist() == whole.char_spans.tolist()


def test_first_words_without_word_pieces_leave_the_whole_text_to_decide() -> None:
    """A cut whose words give no word piece (zero-width spaces, which BERT deletes) is not what the tokens come
    from: the whole text is, here truncated to its first words that have pieces (mut57a: held only by chance draws
    of the property test above)."""
    tokenizer = minilm_tokenizer()
    text = "\u200b " * 8 + "word " * 8
    with mock.patch.object(tokenization, "_CHARS_PER_WORD", 0):
        cut = encode_document(tokenizer, text, 4)
    assert cut.truncated and cut.token_ids.tolist() == tokenizer(text, truncation=True, max_length=4)["input_ids"]


@pytest.mark.parametrize(
    "text",
    ["news\x0bpaper rail\x0bway the city a pho\x0btograph" + " and more words" * 60, "ab\x0b" * 60, "a\x0cb " * 60],
)
def test_characters_bert_deletes_do_not_end_a_word(tokenizer, text: str) -> None:
    """Python's whitespace took VT and FF for word ends; BERT deletes them and joins the words around them, so the
    cut read "ph" where the whole text read "photograph" (review38 M1)."""
    with mock.patch.object(tokenization, "_CHARS_PER_WORD", 0):
        cut = encode_document(tokenizer, text, 8)
    whole = tokenizer(text, truncation=True, max_length=8)["input_ids"]
    assert cut.token_ids.tolist() == whole


def test_a_long_query_is_cut_before_it_is_tokenized(tokenizer) -> None:
    query = "flea " * 150_000
    assert tokenization.first_words(query, 32) == "flea " * 32
    encoded = encode_query(tokenizer, query, 32)
    assert encoded.truncated and len(encoded) == 32


@pytest.mark.parametrize("question", ["", "   ", "\t\n"])
def test_an_empty_question_is_refused(tokenizer, question: str) -> None:
    with pytest.raises(DilstoreError, match="question is empty"):
        encode_question(tokenizer, question, max_length=64)


@pytest.mark.parametrize("text", ["", "  \n ", "\x00\x00"])
def test_a_passage_without_word_pieces_is_refused(text: str) -> None:
    with pytest.raises(DilstoreError, match="no word pieces"):
        encode_passage(minilm_tokenizer(), text, max_length=64)


def test_a_question_without_word_pieces_is_refused() -> None:
    with pytest.raises(DilstoreError, match="no word pieces"):
        encode_question(minilm_tokenizer(), "\x00\u0301", max_length=64)


def test_lengths_too_small_for_the_template_are_refused(tokenizer) -> None:
    with pytest.raises(DilstoreError, match="no room"):
        encode_question(tokenizer, "why?", max_length=2)
    with pytest.raises(DilstoreError, match="at least 2"):
        encode_passage(tokenizer, "because", max_length=1)
    with pytest.raises(DilstoreError, match="stride"):
        encode_passage(tokenizer, "because", max_length=8, stride=0)


def test_a_tokenizer_without_offsets_is_refused() -> None:
    with pytest.raises(DilstoreError, match="not a fast tokenizer"):
        encode_passage(SimpleNamespace(is_fast=False), "text", max_length=8)


def test_tokenized_text_checks_its_shapes() -> None:
    with pytest.raises(DilstoreError, match=r"\(n, 2\)"):
        TokenizedText(np.zeros(3), np.zeros((2, 2)))
    text = TokenizedText([5, 6, 7], [[0, 2], [3, 4], [-1, -1]])
    assert text.token_ids.dtype == np.int32 and text.char_range(0, 1) == (0, 4)
    with pytest.raises(DilstoreError, match="special token"):
        text.char_range(1, 2)
    for start, end in ((0, 3), (2, 1), (-1, 0)):  # past the end, reversed, before the start (mut57a)
        with pytest.raises(DilstoreError, match="not inside a text of 3 tokens"):
            text.char_range(start, end)


@given(num_pieces=st.integers(1, 400), window=st.integers(1, 60), stride=st.integers(1, 80))
@settings(max_examples=300, deadline=None)
def test_windows_cover_every_piece_with_the_documented_overlap(num_pieces: int, window: int, stride: int) -> None:
    starts = window_starts(num_pieces, window, stride)
    assert starts[0] == 0
    assert all(b - a == min(stride, window) for a, b in itertools.pairwise(starts))
    assert starts[-1] + window >= num_pieces  # the last window reaches the final piece ...
    assert len(starts) == 1 or starts[-2] + window < num_pieces  # ... and is the first to do so
    covered = np.zeros(num_pieces, dtype=bool)
    for start in starts:
        covered[start : start + window] = True
    assert covered.all()


def test_long_passage_windows_follow_the_rule() -> None:
    tokenizer = minilm_tokenizer()
    text = " ".join(str(number) for number in range(100, 160))  # one word piece per number
    pieces = passage_pieces(tokenizer, text)
    windows = encode_passage(tokenizer, text, max_length=17, stride=5)
    assert len(pieces) == 60
    assert [len(window) for window in windows] == [17] * 9 + [16]  # starts 0, 5, ..., 45; the last holds 15 pieces
    for start, window in zip(range(0, 50, 5), windows, strict=True):
        assert window.token_ids[:-1].tolist() == pieces.token_ids[start : start + 16].tolist()
        assert window.char_spans[:-1].tolist() == pieces.char_spans[start : start + 16].tolist()
        assert window.token_ids[-1] == tokenizer.sep_token_id


@given(text=TEXTS, max_length=st.integers(2, 24), stride=st.integers(1, 30))
@PROPERTY
def test_every_window_is_within_max_length_and_ends_with_sep(
    tokenizer, text: str, max_length: int, stride: int
) -> None:
    try:
        windows = encode_passage(tokenizer, text, max_length=max_length, stride=stride)
    except DilstoreError:
        assert not tokenizer(text, add_special_tokens=False)["input_ids"]
        return
    for window in windows:
        assert 2 <= len(window) <= max_length
        assert window.token_ids[-1] == tokenizer.sep_token_id and not window.is_text[-1]
        assert window.is_text[:-1].all()


def ordered_pieces(tokenizer, text: str) -> TokenizedText | None:
    """`passage_pieces` of `text`, None when it has no word piece; its spans checked on the way.

    0 ≤ start ≤ end ≤ len(text), and both starts and ends never decrease along the tokens.
    """
    try:
        pieces = passage_pieces(tokenizer, text)
    except DilstoreError:
        return None
    spans = pieces.char_spans
    assert (spans[:, 0] >= 0).all() and (spans[:, 0] <= spans[:, 1]).all() and (spans[:, 1] <= len(text)).all()
    assert (np.diff(spans[:, 0]) >= 0).all() and (np.diff(spans[:, 1]) >= 0).all()
    return pieces


@given(text=TEXTS)
@PROPERTY
def test_wordpiece_spans_point_at_the_characters_of_each_token(text: str) -> None:
    """Each span slices the text that normalises (lowercase, accents stripped) to the token's characters.

    (The normaliser pads CJK characters with spaces, hence the strip.)

    Tokens with the same span are one character split into several pieces
    (a Hangul syllable becomes its jamo) and are compared together; spans of
    different characters never overlap.
    """
    tokenizer = minilm_tokenizer()
    pieces = ordered_pieces(tokenizer, text)
    if pieces is None:
        return
    spans = [tuple(span) for span in pieces.char_spans.tolist()]
    assert all(b == a or b[0] >= a[1] for a, b in itertools.pairwise(spans))
    normalizer = tokenizer.backend_tokenizer.normalizer
    tokens = tokenizer.convert_ids_to_tokens(pieces.token_ids.tolist())
    for (start, end), group in itertools.groupby(zip(spans, tokens, strict=True), key=lambda pair: pair[0]):
        group_tokens = [token for _, token in group]
        if tokenizer.unk_token not in group_tokens:
            expected = "".join(token.removeprefix("##") for token in group_tokens)
            assert normalizer.normalize_str(text[start:end]).strip() == expected


ACCENTED_WORDS = st.lists(
    st.text(alphabet="aeoncuéèüñçåøx\u0301\u0308", min_size=1, max_size=8), min_size=1, max_size=8
)


@given(words=ACCENTED_WORDS)
@PROPERTY
def test_decomposed_words_come_back_whole_from_their_spans(words: list[str]) -> None:
    """Each word of NFD text, sliced from its first token's start to its last token's end, is the whole word.

    The uncased tokenizer strips accents, so a combining mark after a word's
    last letter ("Cafe" + U+0301) is in no token; its span must still cover it.
    """
    words = [word for word in (unicodedata.normalize("NFD", word) for word in words) if word[0].isalpha()]
    if not words:
        return
    text = " ".join(words)
    pieces = passage_pieces(minilm_tokenizer(), text)
    starts, ends = pieces.char_spans[:, 0].tolist(), pieces.char_spans[:, 1].tolist()
    position = 0
    for word in words:
        first, last = starts.index(position), ends.index(position + len(word))
        assert text[starts[first] : ends[last]] == word
        position += len(word) + 1


@given(text=TEXTS)
@PROPERTY
def test_byte_level_bpe_spans_hold_each_tokens_bytes(text: str) -> None:
    """Each token's bytes (less a leading space) lie inside the UTF-8 of the text its span slices.

    A byte-level token can end inside one character and the next token start
    inside it, so neighbouring spans may overlap by that character; starts and
    ends still never decrease, and the tokens spell out the text exactly.
    """
    tokenizer = tiny_bpe_tokenizer()
    pieces = ordered_pieces(tokenizer, text)
    if pieces is None:
        return
    tokens = tokenizer.convert_ids_to_tokens(pieces.token_ids.tolist())
    assert tokenizer.convert_tokens_to_string(tokens) == text
    byte_of = {symbol: byte for byte, symbol in bytes_to_unicode().items()}
    for token, (start, end) in zip(tokens, pieces.char_spans.tolist(), strict=True):
        assert bytes(byte_of[symbol] for symbol in token).strip(b" ") in text[start:end].encode("utf-8")


@given(text=st.text(alphabet="aecoé日😀\u0301\u0308", min_size=1, max_size=20))
@PROPERTY
def test_byte_level_bpe_spans_are_the_characters_of_each_tokens_bytes(text: str) -> None:
    """Without spaces, a byte-level token's span is exactly the characters its bytes come from: a combining mark
    that starts a token of its own stays that token's, and the token before it does not reach over it
    (`_cover_following_marks` extends a span only over marks that start no token)."""
    tokenizer = tiny_bpe_tokenizer()
    pieces = passage_pieces(tokenizer, text)
    byte_of = {symbol: byte for byte, symbol in bytes_to_unicode().items()}
    char_at = [index for index, char in enumerate(text) for _ in char.encode("utf-8")]  # the character of each byte
    expected, position = [], 0
    for token in tokenizer.convert_ids_to_tokens(pieces.token_ids.tolist()):
        size = len(bytes(byte_of[symbol] for symbol in token))
        expected.append([char_at[position], char_at[position + size - 1] + 1])
        position += size
    assert position == len(text.encode("utf-8"))
    assert pieces.char_spans.tolist() == expected
    assert passage_pieces(tokenizer, "cafe\u0301").char_spans.tolist() == [[0, 1], [1, 3], [3, 4], [4, 5], [4, 5]]


def _same_tokens(left: TokenizedText, right: TokenizedText) -> bool:
    return (
        np.array_equal(left.token_ids, right.token_ids)
        and np.array_equal(left.char_spans, right.char_spans)
        and left.truncated == right.truncated
    )


def _outcome(encode, *args) -> TokenizedText | str:
    """The encoding, or the message of the DilstoreError raised instead."""
    try:
        return encode(*args)
    except DilstoreError as error:
        return str(error)


@given(texts=st.lists(TEXTS, max_size=8), max_length=st.integers(3, 24))
@PROPERTY
def test_batched_questions_encode_each_question_as_alone(tokenizer, texts: list[str], max_length: int) -> None:
    alone = [_outcome(encode_question, tokenizer, text, max_length) for text in texts]
    batched = _outcome(encode_questions, tokenizer, texts, max_length)
    first_error = next((outcome for outcome in alone if isinstance(outcome, str)), None)
    if first_error is not None:
        assert batched == first_error
    else:
        assert len(batched) == len(alone) and all(map(_same_tokens, batched, alone))


@given(texts=st.lists(TEXTS, max_size=8))
@PROPERTY
def test_batched_passages_give_each_passages_pieces_as_alone(tokenizer, texts: list[str]) -> None:
    alone = [_outcome(passage_pieces, tokenizer, text) for text in texts]
    batched = _outcome(passage_pieces_many, tokenizer, texts)
    first_error = next((outcome for outcome in alone if isinstance(outcome, str)), None)
    if first_error is not None:
        assert batched == first_error
    else:
        assert len(batched) == len(alone) and all(map(_same_tokens, batched, alone))


def test_batched_encodings_refuse_what_the_single_ones_refuse(tokenizer) -> None:
    with pytest.raises(DilstoreError, match="no room"):
        encode_questions(tokenizer, ["why?"], max_length=2)
    with pytest.raises(DilstoreError, match="question is empty"):
        encode_questions(tokenizer, ["why?", "  "], max_length=16)
    with pytest.raises(DilstoreError, match="not a fast tokenizer"):
        passage_pieces_many(SimpleNamespace(is_fast=False), ["text"])
    assert encode_questions(tokenizer, [], max_length=16) == [] and passage_pieces_many(tokenizer, []) == []



@given(before=TEXTS, surrogate=st.integers(0xD800, 0xDFFF), after=TEXTS)
@PROPERTY
def test_a_lone_surrogate_is_refused_by_name_and_place_not_raised_from_the_tokenizer(
    tokenizer, before: str, surrogate: int, after: str
) -> None:
    """JSON's "\\ud800" decodes to a string no tokenizer reads; every entry point says what and where instead."""
    text = before + chr(surrogate) + after
    place = re.escape(f"a lone surrogate U+{surrogate:04X} at character {len(before) + 1}, which is not Unicode text")
    with pytest.raises(DilstoreError, match=f"^the question holds {place}$"):
        encode_questions(tokenizer, ["why?", text], max_length=16)
    with pytest.raises(DilstoreError, match=f"^the question holds {place}$"):
        encode_question(tokenizer, text, max_length=16)
    with pytest.raises(DilstoreError, match=f"^the document holds {place}$"):
        encode_document(tokenizer, text, max_length=16)
    with pytest.raises(DilstoreError, match=f"^the passage .* holds {place}$"):
        passage_pieces_many(tokenizer, ["fine", text])
