"""Splitting documents into passages, the unit that is tokenized, encoded and stored.

Two strategies split (seed 002 uses both for OpenSQuAD), and one keeps documents whole:

- "words": windows of `window` words, each starting `stride` words after the
  previous one. Words are whitespace-separated tokens; a passage's text is its
  words joined by single spaces.
- "paragraphs": blocks of text separated by a blank line (a line holding at
  most whitespace; lines end at any break `str.splitlines` knows: \n, \r\n,
  a lone \r, U+2028 …) or by U+2029, the paragraph separator; whitespace
  inside a paragraph is collapsed to single spaces, and paragraphs shorter
  than `min_chars` characters are dropped.
- "none": the whole document is one passage whose id is the document id, for
  rankers whose first-stage runs name documents (MS MARCO pids in a TREC run).
  Whitespace is collapsed as for paragraphs; a passage longer than the model's
  maximum length is still windowed at encoding time (reader/offline/encoding.py).

Edge rules for "words":

- A document of at most `window` words gives exactly one passage.
- Windows start at 0, stride, 2·stride, …; the last window is the first one
  that reaches the end of the document and is cut there. So consecutive
  windows always overlap by exactly window − stride words, the last window
  holds more than window − stride words, and no window lies entirely inside
  the previous one (no tiny tail window that repeats content).

Passage ids of the splitting strategies are `{doc_id}#{n}` with n counting kept passages from 0 within the
document: a pure function of the document's id and text, so the same on every
run and every runner. Ids of different documents never collide, since the
part after the last `#` is always n. Passages keep their document's title.
A document whose text yields no passage (only short paragraphs) gives none.
"""

from __future__ import annotations

from dataclasses import dataclass

from dilstore.pipelines.documents import Document
from dilstore.storage.errors import DilstoreError
from dilstore.storage.passage_files import PASSAGE_NUMBER_SEPARATOR

DEFAULT_WINDOW = 100
DEFAULT_STRIDE = 50
DEFAULT_MIN_CHARS = 30
STRATEGIES = ("words", "paragraphs", "none")

_PARAGRAPH_SEPARATOR = "\u2029"


@dataclass(frozen=True)
class Passage:
    """One passage of a document: `id` is `{doc_id}#{n}`, or the document id under "none"."""

    id: str
    doc_id: str
    title: str
    text: str


def passage_id(doc_id: str, number: int) -> str:
    """The id of the passage numbered `number` (from 0) in document `doc_id`."""
    return f"{doc_id}{PASSAGE_NUMBER_SEPARATOR}{number}"


def window_bounds(
    word_count: int, window: int = DEFAULT_WINDOW, stride: int = DEFAULT_STRIDE
) -> list[tuple[int, int]]:
    """The `[start, end)` word ranges of the windows over `word_count` words (rules in the module docstring)."""
    check_window(window, stride)
    bounds = []
    start = 0
    while start < word_count:
        end = min(start + window, word_count)
        bounds.append((start, end))
        if end == word_count:
            break
        start += stride
    return bounds


def check_window(window: int, stride: int) -> None:
    """Raise DilstoreError unless 1 <= stride <= window: a larger stride would skip words."""
    if window < 1 or not 1 <= stride <= window:
        raise DilstoreError(f"passage windows need 1 <= stride <= window; got window {window}, stride {stride}")


def split_words(doc: Document, window: int = DEFAULT_WINDOW, stride: int = DEFAULT_STRIDE) -> list[Passage]:
    """Overlapping windows of `window` words every `stride` words."""
    words = doc.text.split()
    return [
        Passage(passage_id(doc.id, number), doc.id, doc.title, " ".join(words[start:end]))
        for number, (start, end) in enumerate(window_bounds(len(words), window, stride))
    ]


def _paragraphs(text: str) -> list[str]:
    """The text's paragraphs (module docstring), whitespace collapsed; blank ones left out."""
    paragraphs: list[str] = []
    lines: list[str] = []
    for line in [*text.replace(_PARAGRAPH_SEPARATOR, "\n\n").splitlines(), ""]:
        if line.strip():
            lines.append(line)
        elif lines:
            paragraphs.append(" ".join(" ".join(lines).split()))
            lines = []
    return paragraphs


def split_paragraphs(doc: Document, min_chars: int = DEFAULT_MIN_CHARS) -> list[Passage]:
    """The document's blank-line-separated paragraphs of at least `min_chars` characters."""
    kept = [paragraph for paragraph in _paragraphs(doc.text) if len(paragraph) >= min_chars]
    return [Passage(passage_id(doc.id, n), doc.id, doc.title, paragraph) for n, paragraph in enumerate(kept)]


def whole_document(doc: Document) -> list[Passage]:
    """The document as one passage under its own id, whitespace collapsed (none if it is blank)."""
    text = " ".join(doc.text.split())
    return [Passage(doc.id, doc.id, doc.title, text)] if text else []


def split_document(
    doc: Document,
    strategy: str,
    *,
    window: int = DEFAULT_WINDOW,
    stride: int = DEFAULT_STRIDE,
    min_chars: int = DEFAULT_MIN_CHARS,
) -> list[Passage]:
    """The passages of a document under the named strategy ("words", "paragraphs" or "none").

    Raises DilstoreError for an unknown strategy or invalid window settings.
    """
    if strategy == "words":
        return split_words(doc, window, stride)
    if strategy == "paragraphs":
        return split_paragraphs(doc, min_chars)
    if strategy == "none":
        return whole_document(doc)
    raise DilstoreError(f"unknown passage strategy {strategy!r}; expected one of: {', '.join(STRATEGIES)}")
