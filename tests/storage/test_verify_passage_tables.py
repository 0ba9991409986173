"""`verify` and `compact` check each shard's Parquet passage table against the shard (hostile47 F8).

Before, verify read only the JSONL parts: a table with forged doc_ids, cut short, without a column, with int ids,
its rows reversed or listing other ids verified OK (after the manifest was signed again, which needs no secret),
and `compact` crashed on the cut and column-less ones with pyarrow tracebacks. The tables here are written as
precompute writes them, before finalize, so the manifest covers them; each damage is signed in again.
"""

from __future__ import annotations

import errno
import hashlib
import io
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dilstore.runners.cli import main
from dilstore.storage.compact import compact_store
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.format import StoreFormatError, StoreReadError
from dilstore.storage.passage_files import parquet_path
from dilstore.storage.passage_tables import PASSAGE_SCHEMA, passage_column, passage_table_bytes
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from dilstore.storage.writer import write_shard
from tests.fixtures.store_fixtures import fingerprint_for, passage
from tests.storage.test_store_append import resigned

TABLE = "passages/part-00000.parquet"
# (passage id, doc_id) of shard 0, in the order precompute stores a shard (sorted by id); windows and --split none
ROWS = [("Teacher#0", "Teacher"), ("Teacher#1", "Teacher"), ("Teacher#1~1", "Teacher"), ("Warsaw", "Warsaw")]


@dataclass(frozen=True)
class Row:
    """One passage table row (storage.passage_files.PassageRow)."""

    id: str
    doc_id: str
    title: str
    text: str


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finalized fp32 store of one shard with its passage table, written before finalize as precompute does."""
    root = tmp_path_factory.mktemp("tables") / "store"
    rng = np.random.default_rng(0)
    records = [passage(passage_id, 3, (4,), rng) for passage_id, _ in ROWS]
    write_shard(root, 0, records, kind="dilbert", encoding="fp32", durable=False)
    table = parquet_path(root, 0)
    table.parent.mkdir(parents=True)
    table.write_bytes(passage_table_bytes([Row(record.id, doc, record.title, record.text)
                                           for record, (_, doc) in zip(records, ROWS, strict=True)]))  # fmt: skip
    finalize(root, fingerprint_for("dilbert", "fp32"), {"command": "test"})
    return root


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "store"))


def replaced(store: Path, data: bytes | None) -> Path:
    """The store with its table's bytes replaced by `data` (None: removed), the manifest signed again."""
    path = store / TABLE
    if data is None:
        path.unlink()
    else:
        path.write_bytes(data)

    def change(manifest: dict) -> None:
        if data is None:
            del manifest["files"][TABLE]
        else:
            manifest["files"][TABLE] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    resigned(store, change)
    return store


def columns(store: Path) -> dict[str, list[str]]:
    return {name: passage_column(store / TABLE, name) for name in PASSAGE_SCHEMA.names}


def forged(store: Path, edit: Callable[[dict[str, list]], dict[str, list]]) -> bytes:
    """The store's table with `edit` applied to its columns, as Parquet: with the passage schema where the columns
    still fit it, else with the types pyarrow infers (as someone replacing a table might write it)."""
    edited = edit(columns(store))
    fits = list(edited) == PASSAGE_SCHEMA.names and all(isinstance(value, str) for value in edited["id"])
    sink = io.BytesIO()
    pq.write_table(pa.table(edited, schema=PASSAGE_SCHEMA if fits else None), sink)
    return sink.getvalue()


def test_a_sound_table_verifies(store: Path) -> None:
    report = verify_store(store)
    assert report.ok, report.problems


# How a table was damaged (an edit of its columns), and the start of the problem verify names it by.
DAMAGE = {
    "docid_swap": (lambda c: {**c, "doc_id": ["Warsaw"] * len(c["id"])},
                   "3 rows name a document their passage id does not come from (first: row 0, passage 'Teacher#0', "
                   "doc_id 'Warsaw')"),
    "reversed": (lambda c: {name: values[::-1] for name, values in c.items()},
                 "row 0 is passage 'Warsaw', but row 0 of its shard is 'Teacher#0'"),
    "other_ids": (lambda c: {**c, "id": [f"x{value}" for value in c["id"]], "doc_id": [f"x{v}" for v in c["doc_id"]]},
                  "row 0 is passage 'xTeacher#0', but row 0 of its shard is 'Teacher#0'"),
    "fewer_rows": (lambda c: {name: values[:-1] for name, values in c.items()},
                   "has 3 rows for the 4 rows of its shard"),
    "more_rows": (lambda c: {name: [*values, values[-1]] for name, values in c.items()},
                  "has 5 rows for the 4 rows of its shard"),
    "no_doc_id": (lambda c: {name: values for name, values in c.items() if name != "doc_id"},
                  "has the columns (id: string, title: string, text: string), not a passage table's (id: string not "
                  "null, doc_id: string not null, title: string not null, text: string not null)"),
    "int_ids": (lambda c: {**c, "id": list(range(len(c["id"])))}, "has the columns (id: int64, doc_id: string"),
    "other_text": (lambda c: {**c, "text": ["?", *c["text"][1:]]},
                   "the text of row 0 ('Teacher#0') differs from its shard's"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_table_that_does_not_describe_its_shard_is_a_problem_naming_the_file(store: Path, damage: str) -> None:
    edit, expected = DAMAGE[damage]
    problems = verify_store(replaced(store, forged(store, edit))).problems
    assert len(problems) == 1 and problems[0].startswith(f"{TABLE}: {expected}"), problems
    assert problems[0].endswith("(the passage table of shard-00000)")


def test_a_cut_or_missing_table_is_a_problem(store: Path) -> None:
    whole = (store / TABLE).read_bytes()
    problems = verify_store(replaced(store, whole[: len(whole) // 2])).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{TABLE}: cannot be read as a Parquet passage table (ArrowInvalid: "), problems
    problems = verify_store(replaced(store, None)).problems
    assert problems == [f"{TABLE}: missing, though its folder holds the passage tables of its run (the passage "
                        "table of shard-00000)"]  # fmt: skip


def test_a_table_changed_without_signing_is_named_once_by_its_checksum(store: Path) -> None:
    (store / TABLE).write_bytes(forged(store, DAMAGE["docid_swap"][0]))
    problems = verify_store(store).problems
    assert len(problems) == 1 and problems[0].startswith(f"{TABLE}: ") and "the manifest recorded" in problems[0]


@pytest.mark.parametrize("damage", ["cut", "no_doc_id", "docid_swap"])
def test_compact_refuses_such_a_table_in_one_line_naming_it(store: Path, tmp_path: Path, damage: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """compact gave a 38-line pyarrow traceback for a cut table and one without doc_id, and carried forged doc_ids
    into the compacted store."""
    whole = (store / TABLE).read_bytes()
    replaced(store, whole[:100] if damage == "cut" else forged(store, DAMAGE[damage][0]))
    refusal = f"^{re.escape(str(store / TABLE))}: .*shard-00000.*verify"
    with open_store(store) as opened, pytest.raises(StoreFormatError, match=refusal):
        compact_store(opened, tmp_path / "out", lambda passage_id: 0, generation="0" * 16)
    capsys.readouterr()
    assert main(["compact", str(store), "--output", str(tmp_path / "cli"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(store / TABLE) in error and "Traceback" not in error, error


def test_passage_column_names_the_file_it_cannot_read(store: Path) -> None:
    (store / TABLE).write_bytes(b"not parquet")
    with pytest.raises(StoreFormatError, match=f"^{re.escape(str(store / TABLE))}: cannot be read as a Parquet"):
        passage_column(store / TABLE, "doc_id")


def test_a_table_read_short_of_open_files_is_no_damage(pristine: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of open files (`prlimit --nofile=24`), `compact` said the table "cannot be read as a Parquet passage
    table" and to run `dilstore verify`, and verify listed the same as damage (limits59 F6)."""
    def short(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(pq, "read_table", short)
    shortage = rf"^reading {re.escape(str(pristine / TABLE))} failed: this process holds as many open files as it may"
    with open_store(pristine) as opened, pytest.raises(StoreReadError, match=shortage):
        compact_store(opened, tmp_path / "out", lambda passage_id: 0, generation="0" * 16)
    with pytest.raises(StoreReadError, match=shortage):
        passage_column(pristine / TABLE, "doc_id")
    with pytest.raises(DilstoreError, match="stopped before it could judge the store: this process holds as many"):
        verify_store(pristine)
