"""The token conventions every dilstore model shares: `[CLS] q [SEP]` questions and `p [SEP]` passage windows.

The question and the passage never go through the tokenizer's pair template,
because the passage is encoded offline without knowing any question:

    question  `[CLS] q [SEP]`  the tokenizer's own single-sequence template (`<s> q </s>` for RoBERTa)
    document  `[CLS] d [SEP]`  the same template (ranker documents), truncated to a max length
    windows   `[CLS] d_w [SEP]`  a document's word pieces in windows, each wrapped in [CLS] and [SEP] (EARL stores)
    passage   `p [SEP]`        the passage's word pieces (add_special_tokens=False), then tokenizer.sep_token_id

A ranker (EARL) reads each document alone as `[CLS] d [SEP]`, the question's
template. Online it is truncated to its first tokens (`encode_document`); a
store never truncates, so precompute splits a long document into windows
(`encode_document_windows`), of which the first is exactly the truncated one.

Every token carries the character span it came from in the original Python
string (code-point offsets from the fast tokenizer's offset mapping), so an
answer span comes back as text by slicing, without re-tokenizing. Special
tokens have the span (-1, -1). Special-token strings that occur in the text
itself (a literal "[SEP]" in a Wikipedia article) are tokenized as ordinary
text (`split_special_tokens=True`), so the only separator in a passage window
is the one appended here.

Byte-level BPE tokenizers (RoBERTa) can split one character into several
tokens (an emoji's UTF-8 bytes); those tokens all carry that character's span.
A bare whitespace token (RoBERTa's "Ġ" before a double space) gets an empty
span (s, s) because the tokenizer trims whitespace from offsets. A combining
mark that no token holds (an uncased tokenizer strips the accent of "e" +
U+0301, the decomposed "é") joins the span of the token it follows, so an
answer sliced from the spans keeps it ("Café", not "Cafe").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dilstore.reader.text.surrogates import lone_surrogate, require_unicode
from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The character span of [CLS], [SEP] and every other token that comes from no text.
SPECIAL_SPAN = (-1, -1)
# run_squad's doc_stride: the distance in word pieces between the starts of consecutive windows.
DEFAULT_STRIDE = 128
# Below this many characters a word, a text is tokenized whole without looking for where its first words end.
_CHARS_PER_WORD = 20
# What separates words for every tokenizer here (first_words), and a word.
_SPACE, _WORD = "[ \t\n\r]", "[^ \t\n\r]+"


@dataclass(frozen=True, eq=False)
class TokenizedText:
    """Token ids with the character span each token covers in the original text.

    `token_ids` is int32 (n,), `char_spans` int32 (n, 2) holding [start, end)
    Python string offsets; special tokens have (-1, -1). `truncated` is True
    when the text had more word pieces than fitted and the tail was dropped
    (only `encode_question` and `encode_document` truncate).
    """

    token_ids: np.ndarray  # (n,) int32
    char_spans: np.ndarray  # (n, 2) int32
    truncated: bool = False

    def __post_init__(self) -> None:
        token_ids = np.ascontiguousarray(self.token_ids, dtype=np.int32)
        char_spans = np.ascontiguousarray(self.char_spans, dtype=np.int32)
        if token_ids.ndim != 1 or char_spans.shape != (token_ids.shape[0], 2):
            raise DilstoreError(
                "TokenizedText needs token_ids (n,) and char_spans (n, 2); "
                f"got {token_ids.shape} and {char_spans.shape}"
            )
        object.__setattr__(self, "token_ids", token_ids)
        object.__setattr__(self, "char_spans", char_spans)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def is_text(self) -> np.ndarray:
        """(n,) bool: True for tokens that come from the text, False for special tokens."""
        return self.char_spans[:, 0] >= 0

    def char_range(self, start: int, end: int) -> tuple[int, int]:
        """The [start, end) character range covered by tokens start..end (inclusive), both from the text."""
        if not 0 <= start <= end < len(self):
            raise DilstoreError(f"token range {start}..{end} is not inside a text of {len(self)} tokens")
        if not (self.is_text[start] and self.is_text[end]):
            raise DilstoreError(f"token range {start}..{end} starts or ends on a special token")
        return int(self.char_spans[start, 0]), int(self.char_spans[end, 1])


def encode_question(tokenizer: PreTrainedTokenizerBase, question: str, max_length: int) -> TokenizedText:
    """`[CLS] q [SEP]` through the tokenizer's own single-sequence template, at most `max_length` tokens.

    An over-long question is not an error: the tokenizer's truncation drops
    word pieces from the end (its `truncation_side`, "right" for every shipped
    tokenizer) and keeps the template's final [SEP]; the result's `truncated`
    flag tells the caller. An empty or whitespace-only question, one holding a
    lone surrogate (not Unicode text) and one that has no word piece at all
    raise DilstoreError.
    """
    return _encode_single(tokenizer, question, max_length, "question")


def encode_query(tokenizer: PreTrainedTokenizerBase, query: str, max_length: int) -> TokenizedText:
    """`encode_question` of a ranker's query, with errors that call it a query."""
    return _encode_single(tokenizer, query, max_length, "query")


def encode_document(tokenizer: PreTrainedTokenizerBase, document: str, max_length: int) -> TokenizedText:
    """`[CLS] d [SEP]`, the ranker's document convention (EARL), truncated to `max_length` tokens.

    The same single-sequence template and truncation rules as
    `encode_question`: rankers score a document by its first `max_length`
    tokens (BERT-FirstP), so a long document is cut, not windowed, and
    `truncated` says so.
    """
    return _encode_single(tokenizer, document, max_length, "document")


def encode_questions(
    tokenizer: PreTrainedTokenizerBase, questions: Sequence[str], max_length: int
) -> list[TokenizedText]:
    """`encode_question` of every question, with one batched tokenizer call for all of them.

    The Rust tokenizer encodes a batch in parallel and without a Python call
    per text: the start-up of a shared-normalisation run over SQuAD-train was
    spent mostly in per-question calls. A question the batch cannot answer
    alone (empty, over-long, no word piece) goes through `encode_question`,
    which truncates it or raises its error.
    """
    _require_fast(tokenizer)
    _require_room(tokenizer, max_length, "question")
    if not questions:
        return []
    for question in questions:
        require_unicode(question, "the question")
    encodings = _call(tokenizer, list(questions), add_special_tokens=True)
    encoded = []
    for index, question in enumerate(questions):
        single = _to_tokenized(_batch_item(encodings, index), question, truncated=False)
        fits = bool(question.strip()) and len(single) <= max_length and bool(single.is_text.any())
        encoded.append(single if fits else encode_question(tokenizer, question, max_length))
    return encoded


def _encode_single(tokenizer: PreTrainedTokenizerBase, text: str, max_length: int, what: str) -> TokenizedText:
    """The single-sequence template over `text`, truncated from the right; `what` names the text in errors."""
    _require_fast(tokenizer)
    if not text.strip():
        raise DilstoreError(f"the {what} is empty")
    require_unicode(text, f"the {what}")
    _require_room(tokenizer, max_length, what)
    head = first_words(text, max_length)
    encoding = _call(tokenizer, head, add_special_tokens=True)
    truncated = len(encoding["input_ids"]) > max_length
    if head is not text and not truncated:  # some words gave no word piece: the whole text decides
        head = text
        encoding = _call(tokenizer, text, add_special_tokens=True)
        truncated = len(encoding["input_ids"]) > max_length
    if truncated:
        encoding = _call(tokenizer, head, add_special_tokens=True, truncation=True, max_length=max_length)
    result = _to_tokenized(encoding, head, truncated=truncated)
    if not result.is_text.any():
        raise DilstoreError(f"the {what} {_preview(text)} has no word pieces after tokenization")
    return result


def folded(text: str) -> str:
    """A question or query with Unicode's compatibility forms folded (NFKC): full-width letters and digits (what a
    CJK input method types), ligatures, superscripts and the like read as the plain characters passages use.

    BERT's normalizer lowercases and strips accents but does not fold them: a full-width question was all [UNK]
    pieces and found no BM25 hit. The reader folds only questions and queries: a passage keeps its characters, whose
    offsets are its answers'. BM25 indexes passages by the same rule (storage.collection.searched_form, which storage
    defines for itself, as it imports no reader; a test holds the two to one rule).
    """
    return unicodedata.normalize("NFKC", text)


def spaced(text: str) -> str:
    """`text` with its ends stripped of BERT's separators (space, tab, line ends) and each run of them made one
    space: for a text over a length limit, what the limit should see and the tokenizer read (a form that pads a
    short question with spaces does not make it long, nor its tokenizing slow: review46 L3). BERT's word pieces
    are the same; a byte-level BPE (RoBERTa) reads spaces, so texts within the limit are read as they are."""
    return re.sub(f"{_SPACE}+", " ", text).strip(" ")


def first_words(text: str, count: int) -> str:
    """The shortest prefix of `text` that holds its first `count` words whole (all of it when it has fewer, or is
    short), words being separated by spaces, tabs or line ends.

    Words are tokenized one at a time and each gives one word piece or more, so the first `count` tokens of `text`
    are those of this prefix whenever it gives `count` or more: a 750 KB query was tokenized whole, twice, to keep
    its first 32 tokens (2.7 s of a server's worker). Only those four characters separate: BERT deletes others
    Python calls whitespace (VT, FF, NEL), joining the words around them.
    """
    if len(text) <= count * _CHARS_PER_WORD:
        return text
    found = re.match(rf"{_SPACE}*(?:{_WORD}{_SPACE}+){{{count}}}", text)
    return text if found is None else text[: found.end()]


def _require_room(tokenizer: PreTrainedTokenizerBase, max_length: int, what: str) -> None:
    """`max_length` must leave at least one token beside the single-sequence template."""
    template_tokens = tokenizer.num_special_tokens_to_add(pair=False)
    if max_length < template_tokens + 1:
        raise DilstoreError(
            f"max_length {max_length} leaves no room for the {what}: the template alone takes {template_tokens}"
        )


def passage_pieces_many(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[TokenizedText]:
    """`passage_pieces` of every text, with one batched (parallel) tokenizer call; the same errors."""
    _require_fast(tokenizer)
    if not texts:
        return []
    bad = next((text for text in texts if lone_surrogate(text) is not None), None)
    if bad is not None:
        require_unicode(bad, f"the passage {_preview(bad)}")
    encodings = _call(tokenizer, list(texts), add_special_tokens=False)
    pieces = [_to_tokenized(_batch_item(encodings, index), text, truncated=False) for index, text in enumerate(texts)]
    for text, text_pieces in zip(texts, pieces):
        if len(text_pieces) == 0:
            raise DilstoreError(f"the passage {_preview(text)} has no word pieces after tokenization")
    return pieces


def passage_pieces(tokenizer: PreTrainedTokenizerBase, text: str) -> TokenizedText:
    """All word pieces of a passage (no special tokens), each with its character span.

    Raises DilstoreError when the text has no word piece (empty, whitespace
    or only characters the tokenizer drops) or holds a lone surrogate.
    """
    return passage_pieces_many(tokenizer, [text])[0]


def window_starts(num_pieces: int, window_pieces: int, stride: int = DEFAULT_STRIDE) -> list[int]:
    """The first piece of every window over `num_pieces` word pieces (the sliding-window rule).

    Windows hold at most `window_pieces` pieces and start at 0, s, 2s, ...
    with s = min(stride, window_pieces), so consecutive windows overlap by
    window_pieces - s pieces and no piece is skipped; the last window is the
    first one that reaches the final piece. This is run_squad's doc_stride
    rule: the stride is the step between window starts, not the overlap.
    """
    if window_pieces < 1:
        raise DilstoreError(f"a passage window must hold at least one word piece, got {window_pieces}")
    if stride < 1:
        raise DilstoreError(f"the window stride must be at least 1, got {stride}")
    step = min(stride, window_pieces)
    starts = [0]
    while starts[-1] + window_pieces < num_pieces:
        starts.append(starts[-1] + step)
    return starts


def passage_window(tokenizer: PreTrainedTokenizerBase, pieces: TokenizedText, start: int, stop: int) -> TokenizedText:
    """Pieces [start, stop) followed by the tokenizer's [SEP] (span (-1, -1)): one `p [SEP]` window."""
    sep = tokenizer.sep_token_id
    if sep is None:
        raise DilstoreError(f"{type(tokenizer).__name__} has no separator token, which the passage convention needs")
    token_ids = np.append(pieces.token_ids[start:stop], np.int32(sep))  # (w + 1,)
    char_spans = np.concatenate([pieces.char_spans[start:stop], np.array([SPECIAL_SPAN], dtype=np.int32)])  # (w + 1, 2)
    return TokenizedText(token_ids, char_spans)


def first_passage_window(tokenizer: PreTrainedTokenizerBase, text: str, max_pieces: int) -> TokenizedText:
    """The text's first `max_pieces` word pieces and [SEP]: the first window `encode_passage` cuts of it."""
    return passage_window(tokenizer, passage_pieces(tokenizer, text), 0, max_pieces)


def encode_passage(
    tokenizer: PreTrainedTokenizerBase, text: str, max_length: int, stride: int = DEFAULT_STRIDE
) -> list[TokenizedText]:
    """The passage as `p_window [SEP]` windows of at most `max_length` tokens each.

    A passage of up to max_length - 1 word pieces is one window. A longer one
    is split by `window_starts` with window_pieces = max_length - 1: windows
    start every `stride` pieces (at most max_length - 1), overlap by the rest,
    and the last one ends on the passage's final piece.
    """
    if max_length < 2:
        raise DilstoreError(
            f"a passage window needs max_length of at least 2 (a word piece and [SEP]), got {max_length}"
        )
    return _windows(tokenizer, text, max_length - 1, stride, passage_window)


def document_window(tokenizer: PreTrainedTokenizerBase, pieces: TokenizedText, start: int, stop: int) -> TokenizedText:
    """[CLS], pieces [start, stop), [SEP] (special spans (-1, -1)): one `[CLS] d_window [SEP]` window."""
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls is None or sep is None:
        raise DilstoreError(
            f"{type(tokenizer).__name__} lacks a [CLS] or [SEP] token, which the document convention needs"
        )
    token_ids = np.concatenate([[np.int32(cls)], pieces.token_ids[start:stop], [np.int32(sep)]])  # (w + 2,)
    special = np.array([SPECIAL_SPAN], dtype=np.int32)  # (1, 2)
    char_spans = np.concatenate([special, pieces.char_spans[start:stop], special])  # (w + 2, 2)
    return TokenizedText(token_ids, char_spans)


def encode_document_windows(
    tokenizer: PreTrainedTokenizerBase, text: str, max_length: int, stride: int = DEFAULT_STRIDE
) -> list[TokenizedText]:
    """The document as `[CLS] d_window [SEP]` windows of at most `max_length` tokens each (nothing dropped).

    The same rule as `encode_passage`, with window_pieces = max_length - 2:
    a document of up to max_length - 2 word pieces is one window, equal to
    `encode_document`'s tokens; a longer one gets overlapping windows that
    start every `stride` pieces, each wrapped in [CLS] and [SEP]. Window 0
    holds the same tokens as `encode_document` truncated to `max_length`.
    """
    if max_length < 3:
        raise DilstoreError(
            f"a document window needs max_length of at least 3 ([CLS], a word piece and [SEP]), got {max_length}"
        )
    return _windows(tokenizer, text, max_length - 2, stride, document_window)


def _windows(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    window_pieces: int,
    stride: int,
    wrap: Callable[[PreTrainedTokenizerBase, TokenizedText, int, int], TokenizedText],
) -> list[TokenizedText]:
    """The word pieces of `text` cut by `window_starts` into runs of `window_pieces`, each wrapped by `wrap`.

    `wrap` adds a convention's special tokens around pieces [start, stop)
    (`passage_window`, `document_window`).
    """
    pieces = passage_pieces(tokenizer, text)
    return [
        wrap(tokenizer, pieces, start, start + window_pieces)
        for start in window_starts(len(pieces), window_pieces, stride)
    ]


def _require_fast(tokenizer: PreTrainedTokenizerBase) -> None:
    """Character offsets come only from Hugging Face's Rust-backed ("fast") tokenizers."""
    if not getattr(tokenizer, "is_fast", False):
        raise DilstoreError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; dilstore needs character offsets, "
            "which only tokenizers backed by the `tokenizers` library provide (a tokenizer.json in the checkpoint)"
        )


def _call(tokenizer: PreTrainedTokenizerBase, text: str | list[str], **options: Any) -> Any:
    """One tokenizer call (one text, or a batch) with offsets and the special-token mask; special-token strings in
    text stay text."""
    return tokenizer(
        text,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        split_special_tokens=True,
        verbose=False,
        **options,
    )


def _batch_item(encodings: Any, index: int) -> dict[str, Any]:
    """Text `index` of a batched `_call`, in the form `_to_tokenized` reads."""
    return {key: encodings[key][index] for key in ("input_ids", "offset_mapping", "special_tokens_mask")}


def _to_tokenized(encoding: Any, text: str, *, truncated: bool) -> TokenizedText:
    """A tokenizer encoding of `text` → TokenizedText, special tokens' spans set to (-1, -1)."""
    token_ids = np.asarray(encoding["input_ids"], dtype=np.int32)  # (n,)
    char_spans = np.asarray(encoding["offset_mapping"], dtype=np.int32).reshape(-1, 2)  # (n, 2)
    special = np.asarray(encoding["special_tokens_mask"], dtype=bool)  # (n,)
    char_spans[special] = SPECIAL_SPAN
    _cover_following_marks(text, char_spans)
    return TokenizedText(token_ids, char_spans, truncated=truncated)


def _cover_following_marks(text: str, char_spans: np.ndarray) -> None:
    """Extend each non-empty span over the combining marks right after it that start no token (in place).

    An uncased tokenizer strips accents, so in decomposed text the mark after
    a word's last letter belongs to no token and slicing by spans dropped it.
    A mark that starts a token of its own (byte-level BPE) is left to it.
    """
    if text.isascii():
        return
    starts = set(char_spans[:, 0].tolist())
    for row in np.flatnonzero(char_spans[:, 0] < char_spans[:, 1]):
        end = int(char_spans[row, 1])
        while end < len(text) and end not in starts and unicodedata.category(text[end]).startswith("M"):
            end += 1
        char_spans[row, 1] = end


def _preview(text: str, limit: int = 60) -> str:
    """A short quoted excerpt of a text for an error message."""
    return repr(text if len(text) <= limit else text[:limit] + "…")
