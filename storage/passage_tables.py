"""A store's Parquet passage tables, `passages/part-s.parquet` (storage/passage_files names them): id, doc_id,
title and text of each stored unit of a shard.

Precompute writes one per shard (pipelines/shard_sink.py); an append with
--replace reads the doc_id and id columns back to find the stored rows that a
new version of a document supersedes (pipelines/append.py), and compact carries
the doc_ids over. Neither may trust them unchecked: a forged doc_id made one
replaced document supersede unrelated passages (hostile47 F8), so
`passage_table_problems` checks a table against its shard, and `verify`,
`compact` and `append --replace` run it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dilstore.storage.format import StoreFormatError, StoreReadError, append_dir
from dilstore.storage.manifest import ShardEntry
from dilstore.storage.passage_files import PASSAGES_DIR, PassageRow, derives_from, parquet_path
from dilstore.storage.read_failures import process_shortage

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


def shard_table(store: Path, entry: ShardEntry) -> Path:
    """The passage table of a shard: in the store's folder, or in the folder of the append that wrote it."""
    folder = store if entry.generation is None else store / append_dir(entry.generation)
    return parquet_path(folder, entry.index)


def has_tables(store: Path, entry: ShardEntry) -> bool:
    """Whether the run that wrote the shard wrote passage tables (a store written through the storage API alone,
    or an append to one, has no `passages/` folder)."""
    return shard_table(store, entry).parent.is_dir()


def passage_column(table: Path, name: str) -> list[str]:
    """One column (id, doc_id, title or text) of a passage table, in row order; StoreFormatError naming the file
    when it cannot be read (cut short, not Parquet, no such column), not pyarrow's traceback."""
    try:
        with table.open("rb") as handle:  # pyarrow takes no path that is not UTF-8 (unicode56 F8)
            return pq.read_table(handle, columns=[name]).column(name).to_pylist()
    except (pa.ArrowException, OSError) as error:
        _refuse_shortage(table, error)
        raise StoreFormatError(f"{table}: {_unreadable(error)}") from error


def passage_table_problems(
    table: Path, ids: Sequence[str], titles: Sequence[str] | None = None, texts: Sequence[str] | None = None
) -> list[str]:
    """Why the passage table at `table` does not describe its shard, whose rows hold `ids` (and `titles` and
    `texts`, when given); each problem a phrase to follow the table's name, none when it does.

    The table must be readable Parquet of PASSAGE_SCHEMA, list the shard's ids in row order, and give each row a
    doc_id its id derives from (passage_files.derives_from).
    """
    read = _read(table)
    return [read] if isinstance(read, str) else _problems(read, ids, titles, texts)


def checked_document_ids(table: Path, ids: Sequence[str]) -> list[str]:
    """The doc_id of each row of the passage table at `table`, once it is found to describe its shard, whose rows
    hold `ids`; else a StoreFormatError naming the file and what is wrong."""
    read = _read(table)
    if isinstance(read, str):
        raise StoreFormatError(f"{table}: {read}")
    problems = _problems(read, ids, None, None)
    if problems:
        raise StoreFormatError(f"{table}: {'; '.join(problems)}")
    return read.column("doc_id").to_pylist()


def _read(table: Path) -> pa.Table | str:
    """The whole passage table, or why it cannot be read (missing, or not Parquet)."""
    if not table.is_file():
        return "missing, though its folder holds the passage tables of its run"
    try:
        with table.open("rb") as handle:  # a path: pyarrow encodes it as UTF-8, which a name of other bytes is not
            return pq.read_table(handle)
    except (pa.ArrowException, OSError) as error:
        _refuse_shortage(table, error)
        return _unreadable(error)


def _refuse_shortage(table: Path, error: BaseException) -> None:
    """A StoreReadError when reading `table` failed because this process ran short (open files, memory under a
    limit: read_failures.process_shortage), which says nothing of the table: `compact` called it "cannot be read as
    a Parquet passage table" and said to run `dilstore verify`, which would have reported the same (limits59 F6)."""
    shortage = process_shortage(error)
    if shortage is not None:
        raise StoreReadError(f"reading {table} failed: {shortage}; raise the limit and run it again") from error


def _unreadable(error: Exception) -> str:
    """A pyarrow or OS error reading a passage table, in one line."""
    return f"cannot be read as a Parquet passage table ({type(error).__name__}: {str(error).splitlines()[0]:.200})"


def _problems(
    table: pa.Table, ids: Sequence[str], titles: Sequence[str] | None, texts: Sequence[str] | None
) -> list[str]:
    """What `passage_table_problems` finds in a table that could be read."""
    if not table.schema.equals(PASSAGE_SCHEMA, check_metadata=False):
        return [f"has the columns ({_fields(table.schema)}), not a passage table's ({_fields(PASSAGE_SCHEMA)})"]
    if table.num_rows != len(ids):
        return [f"has {table.num_rows} rows for the {len(ids)} rows of its shard"]
    found = table.column("id").to_pylist()
    wrong = _first_difference(found, ids)
    if wrong is not None:
        return [f"row {wrong} is passage {found[wrong]!r:.80}, but row {wrong} of its shard is {ids[wrong]!r:.80}"]
    problems = []
    documents = table.column("doc_id").to_pylist()
    foreign = [row for row, (passage_id, document) in enumerate(zip(ids, documents, strict=True))
               if not derives_from(passage_id, document)]  # fmt: skip
    if foreign:
        first = foreign[0]
        problems.append(f"{len(foreign)} rows name a document their passage id does not come from (first: row "
                        f"{first}, passage {ids[first]!r:.80}, doc_id {documents[first]!r:.80})")  # fmt: skip
    for name, stored in (("title", titles), ("text", texts)):
        column = table.column(name).to_pylist()
        wrong = None if stored is None else _first_difference(column, stored)
        if wrong is not None:
            problems.append(f"the {name} of row {wrong} ({ids[wrong]!r:.80}) differs from its shard's")
    return problems


def _fields(schema: pa.Schema) -> str:
    """A schema's columns in a line: `id: string not null, ...`."""
    return ", ".join(f"{field.name}: {field.type}{'' if field.nullable else ' not null'}" for field in schema)


def _first_difference(found: Sequence[str], expected: Sequence[str]) -> int | None:
    """The first row at which two equally long columns differ, or None."""
    return next((row for row, (a, b) in enumerate(zip(found, expected, strict=True)) if a != b), None)
