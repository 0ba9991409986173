"""What corpus readers produce: documents, dead letters, and pages skipped on purpose.

A reader yields one record per input record, in file order: a `Document`, a
`Rejected` (a malformed record, for the dead-letter output), or a `Skipped`
(a record that is fine but not wanted, such as a Wikipedia redirect). Keeping
all three in one stream lets a pipeline count each kind without losing any.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass

from dilstore.reader.text.surrogates import lone_surrogate

# Documents larger than this (UTF-8 bytes of their text) are rejected, not split:
# a single record that size is almost always a broken export, and it would pin one
# worker's memory while every other worker waits.
DEFAULT_MAX_DOCUMENT_BYTES = 1_000_000
# The longest document id taken (UTF-8 bytes): ids are keys, not text, and Lucene refuses an id term over 32,766.
MAX_ID_BYTES = 1024
# The longest title taken (UTF-8 bytes), as for ids: every passage and window of a document stores its title, so a
# 2 MB title made a 117 MB store of one record (pipe48 F4). Wikipedia's own limit is 255 bytes; the longest title of
# the shared SQuAD, MS MARCO and Wikipedia data is 59.
MAX_TITLE_BYTES = 1024
# Characters no id may hold: control characters (Unicode category Cc: a tab, a newline, NUL) and line or paragraph
# separators (Zl, Zp), which end or split a line of a TREC run, a TSV or JSONL file; and the invisible format
# characters that make an id print as another ("7\u200b" as "7"): the zero-width space, the word joiner, the
# byte-order mark (inside a file, the start of a second file joined to the first) and the bidirectional
# embeddings, overrides and isolates. Other format characters are kept: the zero-width non-joiner and joiner and
# the direction marks spell ordinary Persian, Arabic, Sinhala or Malayalam titles, which SQuAD ids hold.
_ID_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})
_BYTE_ORDER_MARK = "\ufeff"
_ID_REFUSED_FORMATS = frozenset("\u200b\u2060" + _BYTE_ORDER_MARK + "".join(map(chr, range(0x202A, 0x202F)))
                                + "".join(map(chr, range(0x2066, 0x206A))))  # fmt: skip


@dataclass(frozen=True)
class Document:
    """One document of a corpus.

    `source` is the file it came from. `line` is its 1-based line in that file
    for line-based formats (JSONL, TSV) and None otherwise; it orders duplicates
    and names the line in a dead-letter record.
    """

    id: str
    title: str
    text: str
    source: str
    line: int | None = None


@dataclass(frozen=True)
class Rejected:
    """A malformed input record, written to the dead-letter output.

    `line_or_id` is the 1-based line for line-based formats and the record's
    id otherwise. A problem with the file as a whole (bad JSON in a SQuAD file,
    broken XML in a dump) names the line where parsing stopped, or says where
    reading stopped when no line is known (a truncated .bz2). `passage`: the
    id of the one passage of the record left out (a passage with no word
    piece), None when the dead letter is the whole record. Counts tell the two
    apart, so that documents + rejected + skipped add up to the records read.
    """

    source: str
    line_or_id: int | str
    reason: str
    passage: str | None = None

    def to_json(self) -> str:
        """One dead-letter line: `{"source", "line_or_id", "reason"}` as JSON, and `"passage"` for a passage's."""
        letter: dict[str, int | str] = {"source": self.source, "line_or_id": self.line_or_id, "reason": self.reason}
        if self.passage is not None:
            letter["passage"] = self.passage
        return json.dumps(letter, ensure_ascii=False)


@dataclass(frozen=True)
class Skipped:
    """A well-formed record left out on purpose (a redirect, a non-article page).

    Not an error and not a dead letter; readers yield it so that it can be counted. `document_id`: the id of the
    document the record stands for, when it has one (a Wikipedia page's id): an `--append --replace` retires that
    document's stored passages, as a page a newer dump made a redirect or a disambiguation page is no article now.
    """

    source: str
    line_or_id: int | str
    reason: str
    document_id: str | None = None


Record = Document | Rejected | Skipped


def _refused_in_ids(char: str) -> bool:
    """Whether an id may not hold `char` (_ID_REFUSED_CATEGORIES, _ID_REFUSED_FORMATS)."""
    return char in _ID_REFUSED_FORMATS or unicodedata.category(char) in _ID_REFUSED_CATEGORIES


def id_problem(doc_id: str) -> str | None:
    """Why `doc_id` cannot be a passage id, or None: whitespace around it (" 7 " would be another document than
    "7"), a control, separator or invisible format character (_ID_REFUSED_CATEGORIES), or more than MAX_ID_BYTES
    of UTF-8. Spaces inside an id are kept: a SQuAD-format corpus's titles may hold them, and ask and evaluate-qa
    name such passages, though a TREC run cannot."""
    if doc_id != doc_id.strip():
        return "it begins or ends with whitespace"
    refused = next((char for char in doc_id if _refused_in_ids(char)), None)
    if refused is not None:
        name = unicodedata.name(refused, "") or "a control character"
        joined = "; are two files joined?" if refused == _BYTE_ORDER_MARK else ""
        return f"it holds U+{ord(refused):04X} ({name.lower()}{joined})"
    size = len(doc_id.encode("utf-8"))
    if size > MAX_ID_BYTES:
        return f"{size:,} bytes of UTF-8 (limit {MAX_ID_BYTES:,})"
    return None


def make_document(
    source: str,
    position: int | str,
    doc_id: object,
    title: str,
    text: str,
    max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
) -> Document | Rejected:
    """A `Document`, or the `Rejected` that says why these fields do not make one.

    `position` is the 1-based line for line-based formats (kept on the
    document), or the record's id otherwise. The id may be a string or an
    integer (MS MARCO pids); it is rejected when missing or blank, of another
    type (a float or a list is named as such, not as missing), or for an
    `id_problem`. A title over MAX_TITLE_BYTES of UTF-8 is rejected. Text that is
    empty or only whitespace is rejected, and so is text over `max_bytes` of UTF-8.
    A field holding a lone surrogate (JSON's "\\ud800") is not Unicode text
    that any later step could write, so it is rejected here too.
    """
    if doc_id is None or (isinstance(doc_id, str) and not doc_id.strip()):
        return Rejected(source, position, "missing id")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        kind = "a boolean" if isinstance(doc_id, bool) else f"a {type(doc_id).__name__}"
        return Rejected(source, position, f"bad record: 'id' is {kind}, not a string or an integer")
    for field, value in (("id", str(doc_id)), ("title", title), ("text", text)):
        surrogate = lone_surrogate(value)
        if surrogate is not None:
            return Rejected(source, position, f"invalid text: {field} holds {surrogate}")
    problem = id_problem(str(doc_id))
    if problem is not None:
        return Rejected(source, position, f"bad id {str(doc_id)[:40]!r}: {problem}")
    title_size = len(title.encode("utf-8"))
    if title_size > MAX_TITLE_BYTES:
        reason = f"title too large: {title_size:,} bytes of UTF-8 (limit {MAX_TITLE_BYTES:,}), beginning {title[:40]!r}"
        return Rejected(source, position, reason)
    if not text.strip():
        return Rejected(source, position, "empty text")
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        reason = f"document too large: text of {size:,} bytes (limit {max_bytes:,} bytes)"
        return Rejected(source, position, reason)
    line = position if isinstance(position, int) else None
    return Document(id=str(doc_id), title=title, text=text, source=source, line=line)
