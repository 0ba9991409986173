"""Where a store's per-shard passage files live: `passages/part-s.parquet`, its JSONL twin, its commit marker;
and what one row of them holds.

storage/passage_tables.py writes and reads the Parquet tables, storage/collection.py the JSONL parts
(`dilstore index` reads them without importing torch, Beam or pyarrow); pipelines/shard_sink.py writes both
for each shard.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

PASSAGES_DIR = "passages"
JSONL_DIR = f"{PASSAGES_DIR}/jsonl"
META_DIR = f"{PASSAGES_DIR}/meta"
REJECTED_DIR = "rejected"
# How a stored id derives from its document's id: `{doc_id}#{n}` for the n-th passage a split keeps
# (pipelines/passages.py; the document id itself under --split none), then `~{w}` for window w >= 1 of a passage
# longer than the model's maximum length (reader/offline/encoding.py). Both import these.
PASSAGE_NUMBER_SEPARATOR = "#"
WINDOW_ID_SEPARATOR = "~"
_DERIVED_SUFFIX = re.compile(
    rf"({re.escape(PASSAGE_NUMBER_SEPARATOR)}(0|[1-9][0-9]*))?({re.escape(WINDOW_ID_SEPARATOR)}[1-9][0-9]*)?"
)


class PassageRow(Protocol):
    """One stored unit as the passage files hold it, and what precompute needs of a passage (pipelines' Passage and
    reader.offline.encoding.TokenizedPassage are ones)."""

    @property
    def id(self) -> str: ...

    @property
    def doc_id(self) -> str: ...

    @property
    def title(self) -> str: ...

    @property
    def text(self) -> str: ...


def derives_from(passage_id: str, doc_id: str) -> bool:
    """Whether a split of document `doc_id` can give the stored id `passage_id` (the rule above): `--replace`
    supersedes the stored rows by the doc_id of the passage tables, so a false one would retire other passages."""
    return passage_id.startswith(doc_id) and _DERIVED_SUFFIX.fullmatch(passage_id, len(doc_id)) is not None


def part_name(index: int) -> str:
    """`part-NNNNN`, the base name of every per-shard file for shard (or dead-letter part) `index`."""
    return f"part-{index:05d}"


def parquet_path(store: Path, shard: int) -> Path:
    """Shard `shard`'s passage table in Parquet: id, doc_id, title and text of each stored unit."""
    return store / PASSAGES_DIR / f"{part_name(shard)}.parquet"


def jsonl_path(store: Path, shard: int) -> Path:
    """Shard `shard`'s passages as Anserini JsonCollection lines, which `dilstore index` reads."""
    return store / JSONL_DIR / f"{part_name(shard)}.jsonl"


def meta_path(store: Path, shard: int) -> Path:
    """Shard `shard`'s counts, written last: its commit marker (pipelines/shard_sink.py)."""
    return store / META_DIR / f"{part_name(shard)}.json"


def rejected_path(store: Path, part: int) -> Path:
    """Dead-letter part `part`: one JSON line per rejected record, naming its file, line or id and why."""
    return store / REJECTED_DIR / f"{part_name(part)}.jsonl"
