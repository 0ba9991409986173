"""A store's Parquet passage tables, `passages/part-s.parquet` (storage/passage_files names them): id, doc_id,
title and text of each stored unit of a shard.

Precompute writes one per shard (pipelines/shard_sink.py); an append with
--replace reads the doc_id and id columns back to find the stored rows that a
new version of a document supersedes (pipelines/append.py).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dilstore.storage.passage_files import PASSAGES_DIR, PassageRow

PASSAGE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
    ]
)


def passage_table_bytes(rows: Sequence[PassageRow]) -> bytes:
    """A shard's Parquet passage table (zstd), its rows in the order given."""
    table = pa.table(
        {
            "id": [row.id for row in rows],
            "doc_id": [row.doc_id for row in rows],
            "title": [row.title for row in rows],
            "text": [row.text for row in rows],
        },
        schema=PASSAGE_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def passage_tables(folder: Path) -> list[Path]:
    """The per-shard passage tables a run wrote into `folder` (a store, or one of its appends' folders)."""
    return sorted((folder / PASSAGES_DIR).glob("part-*.parquet"))


def passage_column(table: Path, name: str) -> list[str]:
    """One column (id, doc_id, title or text) of a passage table, in row order."""
    return pq.read_table(table, columns=[name]).column(name).to_pylist()
