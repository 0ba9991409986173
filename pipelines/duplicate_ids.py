"""Duplicate document ids: keep one document per id and reject the others.

Passage ids are built from document ids, so two documents with one id would
collide in the store. Which one is kept must not depend on the runner or on
the order in which workers happen to hand records over: the first in
`keep_order` wins everywhere, the first in `document_order` of those the
split leaves a passage to store.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from dilstore.pipelines.documents import Document, Record, Rejected
from dilstore.pipelines.passages import split_document


def document_order(doc: Document) -> tuple[str, bool, int, str, str]:
    """Sort key: file, then line (documents without one last), then title and text.

    Within one line-based file that is file order; the title and text only break
    ties between documents that have no line (Wikipedia, SQuAD), so the order is
    total and the same on every runner.
    """
    return (doc.source, doc.line is None, doc.line or 0, doc.title, doc.text)


def keep_order(doc: Document, strategy: str) -> tuple[bool, tuple[str, bool, int, str, str]]:
    """Sort key of the copies of one id: those that `stores_a_passage` first, then `document_order`. A first copy
    that stores nothing (a stub, a text of only short paragraphs, or of zero-width spaces) shadowed a storable
    second one, which was dropped as a duplicate of it (pipe48 F8, review48 F2)."""
    return not stores_a_passage(doc, strategy), document_order(doc)


def stores_a_passage(doc: Document, strategy: str) -> bool:
    """Whether the `strategy` split leaves `doc` a passage with a character a word piece can come from: one BERT's
    tokenizer keeps, not whitespace, a control or format character (a zero-width space), the replacement character
    U+FFFD, or a nonspacing mark (which its accent stripping drops; a spacing mark, a Devanagari vowel sign, stays).
    Pure, so that it decides before the tokenizer is loaded; it only orders the copies (`keep_order`), and routing
    has the last word."""
    return any(_has_word_character(passage.text) for passage in split_document(doc, strategy))


def _has_word_character(text: str) -> bool:
    """Whether `text` holds a character the tokenizer keeps (`stores_a_passage`)."""
    return any(not character.isspace() and character != "\ufffd" and _kept_category(unicodedata.category(character))
               for character in text)  # fmt: skip


def _kept_category(category: str) -> bool:
    """Whether the tokenizer keeps characters of this Unicode category: not control or format (C*), nor a
    nonspacing mark (Mn)."""
    return not category.startswith("C") and category != "Mn"


def keep_first(documents: Iterable[Document], strategy: str) -> list[Document | Rejected]:
    """Given all documents that share one id (as GroupByKey hands them over), the first in `keep_order` followed
    by one `Rejected` for each other. Never more than one copy goes on: two of one id would store one passage id
    twice and fail the run (review48b B2, when the rule judged none storable and every copy went on).
    """
    documents = list(documents)
    if len(documents) < 2:
        return documents
    ordered = sorted(documents, key=lambda doc: keep_order(doc, strategy))
    kept = ordered[0]
    unlined = "the record first by title, then text, of those that leave a passage to store"
    return [kept, *(duplicate_of(kept, doc, unlined) for doc in ordered[1:])]


def drop_duplicate_ids(records: Iterable[Record], strategy: str) -> list[Record]:
    """The records with each id's documents reduced by `keep_first` (for the `strategy` split), as the pipeline
    reduces them.

    For single-process use (tests, benchmarks): it holds every document in
    memory. Rejected and Skipped records pass through unchanged, first; then
    each id's documents in the order their ids first appear.
    """
    passed: list[Record] = []
    by_id: dict[str, list[Document]] = {}
    for record in records:
        if isinstance(record, Document):
            by_id.setdefault(record.id, []).append(record)
        else:
            passed.append(record)
    return [*passed, *(record for documents in by_id.values() for record in keep_first(documents, strategy))]


def duplicate_of(kept: Document, duplicate: Document, unlined: str) -> Rejected:
    """The dead letter for `duplicate`, naming where the document that was kept came from (`unlined` says which
    it was where records have no line)."""
    where = f"line {kept.line}" if kept.line is not None else unlined
    if kept.source != duplicate.source:
        where = f"{where} of {kept.source}"
    position = duplicate.line if duplicate.line is not None else duplicate.id
    return Rejected(duplicate.source, position, f"duplicate id {duplicate.id!r} (kept {where})")
