"""Pure steps between reading a corpus and writing a store: read, key, split, route.

The pipeline groups everything once, by a `GroupKey`:

- ("shard", s): the tokenized passages (and windows of long passages) of
  shard s, plus one `None` seed per shard, so every shard has a group even
  when the hash gives it nothing;
- ("rejected", r): dead letters, written as `rejected/part-r.jsonl`;
- ("counts", c): `RunStats` of documents accepted and records skipped, summed
  per group so that no single key collects one element per document.

All keys come from stable hashes (`pipelines.sharding`), so the grouping is the
same on every runner and every re-run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dilstore.pipelines.corpora import Document, ReadTask, Record, Rejected, Skipped, read_corpus
from dilstore.pipelines.passages import split_document
from dilstore.pipelines.run_stats import RunStats
from dilstore.pipelines.sharding import shard_of, stable_hash
from dilstore.reader.offline.encoding import TokenizedPassage, tokenize_passage
from dilstore.storage.errors import DilstoreError
from dilstore.storage.passage_files import WINDOW_ID_SEPARATOR

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SHARD, REJECTED, COUNTS = "shard", "rejected", "counts"
GroupKey = tuple[str, int]


def read_task(task: ReadTask) -> Iterator[Record]:
    """Every record of one input file (documents, dead letters, skipped records)."""
    yield from read_corpus(task.path, task.format)


def document_key(record: Record) -> Iterator[tuple[str, Document]]:
    """(id, document) for a Document, nothing for other records: the key duplicates share."""
    if isinstance(record, Document):
        yield record.id, record


def is_not_document(record: Record) -> bool:
    """True for dead letters and skipped records, which bypass the duplicate check."""
    return not isinstance(record, Document)


@dataclass(frozen=True)
class RouteSettings:
    """How documents become stored units: the split strategy, the shard count, the token limit and the store kind.

    The kind picks the token convention (`p [SEP]` for dilbert, `d [SEP]` for
    listformer, `[CLS] d [SEP]` for the EARL kinds; see reader.offline.kinds).
    """

    strategy: str
    num_shards: int
    max_length: int
    kind: str


# A document id that a window id could equal under --split none: anything, the separator, a window number.
_WINDOW_ID = re.compile(rf".+{re.escape(WINDOW_ID_SEPARATOR)}[1-9][0-9]*")


def route(
    record: Document | Rejected | Skipped, settings: RouteSettings, tokenizer: PreTrainedTokenizerBase
) -> Iterator[tuple[GroupKey, object]]:
    """Where one record goes: a document's tokenized passages to their shards, anything else to its group.

    A document is split into passages and each passage tokenized in the
    kind's convention (long ones into windows, see reader.offline.encoding); each
    window goes to the shard of its
    own id. A passage with no word piece (one dead letter naming the passage),
    and a document whose split yields no passage at all, become dead letters,
    so nothing disappears without a trace. A document none of whose passages
    is stored counts as one rejected record however many of its passages are
    dead letters (pipe48 F2: 5 records read were counted as 2 documents and 5
    rejected). Under the "none" split
    a document id of the form `{id}~{w}` is a dead letter too: it could be the
    id of window w of the long document `{id}`, and stored ids must be unique.
    """
    shards = settings.num_shards
    if isinstance(record, Rejected):
        yield (REJECTED, rejected_part(record, shards)), record
        return
    if isinstance(record, Skipped):
        yield (COUNTS, source_part(record.source, record.line_or_id, shards)), RunStats(skipped=1)
        return
    position = record.line if record.line is not None else record.id
    if settings.strategy == "none" and _WINDOW_ID.fullmatch(record.id):
        reason = (
            f"id {record.id!r} has the form of a window id ({{id}}{WINDOW_ID_SEPARATOR}{{w}}), which --split none "
            "gives to the windows of long documents; rename the document"
        )
        dead = Rejected(record.source, position, reason)
        yield (REJECTED, rejected_part(dead, shards)), dead
        return
    stored = 0
    rejected = 0
    long_passages = 0
    for passage in split_document(record, settings.strategy):
        try:
            pieces = tokenize_passage(tokenizer, passage, settings.max_length, settings.kind)
        except DilstoreError as error:
            dead = Rejected(record.source, position, f"passage {passage.id!r}: {error}", passage.id)  # line, as README
            yield (REJECTED, rejected_part(dead, shards)), dead
            rejected += 1
            continue
        long_passages += len(pieces) > 1
        stored += len(pieces)
        for piece in pieces:
            yield (SHARD, shard_of(piece.id, shards)), piece
    if stored == 0 and rejected:
        yield (COUNTS, shard_of(record.id, shards)), RunStats(rejected=1)
        return
    if stored == 0:
        dead = Rejected(record.source, position, f"no passage: the {settings.strategy} split left nothing to store")
        yield (REJECTED, rejected_part(dead, shards)), dead
        return
    yield (COUNTS, shard_of(record.id, shards)), RunStats(documents=1, long_passages=long_passages)


def rejected_part(record: Rejected, num_shards: int) -> int:
    """The dead-letter file a rejected record goes to (a stable hash of where it came from)."""
    return source_part(record.source, record.line_or_id, num_shards)


def source_part(source: str, line_or_id: int | str, num_shards: int) -> int:
    """The part a record that stores nothing is counted in or written to: a stable hash of where it came from
    (its file, and its line or id), so dead letters and skips spread over the parts alike in every run."""
    return stable_hash(f"{source}\0{line_or_id}") % num_shards


def shard_seeds(num_shards: int) -> list[tuple[GroupKey, None]]:
    """One empty element per shard, so that every shard index gets a group and a marker."""
    return [((SHARD, shard), None) for shard in range(num_shards)]


def pieces_of(values: Iterable[TokenizedPassage | None]) -> list[TokenizedPassage]:
    """The stored units of a shard group sorted by id (the seed dropped); ids must be unique."""
    pieces = sorted((value for value in values if value is not None), key=lambda piece: piece.id)
    for previous, current in zip(pieces, pieces[1:]):
        if previous.id == current.id:
            raise DilstoreError(f"passage id {current.id!r} occurs twice in one shard")
    return pieces
