"""`dilstore index STORE`: a pyserini BM25 index over the store's passage collection, with the store's ids.

Indexing and searching each run in their own process (the JVM is started
there and never forked), as users run them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dilstore.runners import cli
from dilstore.storage.collection import collection_jsonl, write_live_collection
from dilstore.storage.errors import DilstoreError
from dilstore.storage.passage_files import jsonl_path
from dilstore.storage.records import PassageRecord
from dilstore.storage.verify import verify_store
from dilstore.storage.write_lock import INDEX_ROLE, WRITE_ROLE
from tests.fixtures.locks import held_lock
from tests.fixtures.pipeline_fixtures import (
    ROOT,
    commands_in_one_process,
    dilstore_command,
    save_tiny_reader,
    store_contents,
    write_jsonl,
)
from tests.fixtures.store_fixtures import build_store, random_shards

DOCUMENTS = [
    {"id": "rhine", "title": "Rhine", "text": "The Rhine flows from the Swiss Alps to the North Sea through Germany."},
    {"id": "oxygen", "title": "Oxygen", "text": "Oxygen is a chemical element with symbol O and atomic number 8."},
    {"id": "normans", "title": "Normans", "text": "The Normans gave their name to Normandy, a region in France."},
]
SEARCH = """
import json, sys
from pathlib import Path
from dilstore.reader.retrieval import Bm25Searcher
hits = Bm25Searcher(Path(sys.argv[1])).search(sys.argv[2], k=3)
print(json.dumps({"hits": [hit.passage_id for hit in hits], "encoders": "pyserini.encode" in sys.modules}))
"""
# Builds a BM25 index of a JSONL folder (argv[1]) into argv[2], Anserini's log kept off stdout.
BUILD = """
import sys
from pathlib import Path
from dilstore.reader.retrieval import build_bm25_index
build_bm25_index(Path(sys.argv[1]), Path(sys.argv[2]))
"""
# Leaves a whole old index at argv[1], as a build killed between its renames does.
LEAVE_ASIDE = """
import sys
from pathlib import Path
Path(sys.argv[1]).mkdir()
(Path(sys.argv[1]) / "segments_1").write_text("an old index")
"""
# Renames argv[1] to argv[2], argv[3] to argv[4], ...: an index put aside, another put in its place, and back.
MOVE = """
import sys
from pathlib import Path
for old, new in zip(sys.argv[1::2], sys.argv[2::2]):
    Path(old).rename(new)
"""
# Copies the file argv[1] to argv[2]: the store's index record, given to another index.
COPY = """
import sys
from pathlib import Path
Path(sys.argv[2]).write_bytes(Path(sys.argv[1]).read_bytes())
"""
# Opens and searches an index whose files were cut: one line naming the index, not a Java traceback.
SEARCH_DAMAGED = """
import sys
from pathlib import Path
from dilstore.reader.retrieval import Bm25Searcher
from dilstore.storage.errors import DilstoreError
try:
    Bm25Searcher(Path(sys.argv[1])).search(sys.argv[2], k=3)
except DilstoreError as error:
    print("DilstoreError", error)
"""


def script(folder: Path, name: str, code: str) -> str:
    """`code` written as FOLDER/NAME.py, a script for `commands_in_one_process`."""
    path = folder / f"{name}.py"
    path.write_text(code, encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_index_builds_bm25_over_the_store_passages(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", DOCUMENTS)
    store = tmp_path / "store"
    model = save_tiny_reader(tmp_path / "tiny")
    assert cli.main(["precompute", "--input", str(corpus), "--output", str(store), "--model", str(model),
                     "--workers", "1", "--shards", "2", "--max-length", "48", "--no-progress"]) == 0
    aside = store / f".tmp-old-bm25-{'0' * 32}"  # a whole old index, left by a build killed between its renames
    # The index, the leftover made, and the index again: one process, one JVM start (ci59: a process less, 2-3 s).
    indexed, left, rebuilt = commands_in_one_process(
        ["dilstore", "index", str(store), "--json"],
        [script(tmp_path, "leave", LEAVE_ASIDE), str(aside)],
        ["dilstore", "index", str(store)],
    )
    assert indexed.returncode == 0, indexed.stderr
    result = json.loads(indexed.stdout)
    assert result["index"] == str(store / "bm25") and result["files"] == 2
    assert "index:" not in indexed.stderr  # no bar with --json
    assert left.returncode == 0, left.stderr
    assert rebuilt.returncode == 0 and f"| {len(DOCUMENTS)}/{len(DOCUMENTS)} [" in rebuilt.stderr, rebuilt.stderr
    assert not aside.exists(), "nothing ever removed it (crash36 7)"
    # A line Anserini cannot read: it went on without that file's passages, exit 0, and the index claimed the store.
    part = sorted((store / "passages" / "jsonl").glob("*.jsonl"))[0]
    intact, index_files = part.read_bytes(), sorted(path.name for path in (store / "bm25").iterdir())
    part.write_bytes(intact + b"not json\n")
    (store / ".bm25.building").write_text("a stray file where the build goes")  # was a Java traceback
    short = dilstore_command(["index", str(store), "--no-progress"])
    part.write_bytes(intact)
    assert short.returncode == 2, short.stderr
    bad_line = len(intact.splitlines()) + 1  # named in Python: Anserini's trace names no file (longrun45 F6)
    assert (f"of the store's {len(DOCUMENTS)} passages from {store / 'passages' / 'jsonl'} (the first line it could "
            f"not read is {part}:{bad_line}: Expecting value") in short.stderr
    assert "the index was not replaced" in short.stderr and "Traceback" not in short.stderr
    assert " ERROR [" not in short.stderr, "Anserini's log line of the bad line (docs50 L4)"
    assert sorted(path.name for path in (store / "bm25").iterdir()) == index_files
    assert not (store / ".bm25.building").exists()
    report = verify_store(store)
    assert report.ok and report.untracked and all(name.startswith("bm25/") for name in report.untracked)
    # The store's ids with their contents swapped, the real record copied in (hostile47 F2): verify finds it.
    swapped = tmp_path / "swapped"
    (swapped / "collection").mkdir(parents=True)
    lines = [json.loads(line) for jsonl in sorted((store / "passages" / "jsonl").glob("*.jsonl"))
             for line in jsonl.read_text(encoding="utf-8").splitlines()]  # fmt: skip
    write_jsonl(swapped / "collection" / "part.jsonl", [{"id": line["id"], "contents": other["contents"]}
                                                         for line, other in zip(lines, lines[1:] + lines[:1])])
    # A search, the index verified, the swapped index built, put in the real one's place with the real one's record
    # and verified, and the real index put back: steps in one process, one JVM start (the second verify, a process
    # of its own, took 2-3 s more, ci62a F4).
    real, aside, move = store / "bm25", tmp_path / "real-bm25", script(tmp_path, "move", MOVE)
    found, verified, built, swapped_in, copied, verified_swapped, put_back = commands_in_one_process(
        [script(tmp_path, "search", SEARCH), str(real), "atomic number of oxygen"],
        ["dilstore", "verify", str(store), "--json"],  # the index too: Lucene's checksums, documents
        [script(tmp_path, "build", BUILD), str(swapped / "collection"), str(swapped / "bm25")],
        [move, str(real), str(aside), str(swapped / "bm25"), str(real)],
        [script(tmp_path, "copy", COPY), str(aside / "dilstore-index.json"), str(real / "dilstore-index.json")],
        ["dilstore", "verify", str(store), "--json"],
        [move, str(real), str(swapped / "bm25"), str(aside), str(real)],
    )
    assert found.returncode == 0, found.stderr
    searched = json.loads(found.stdout.strip().splitlines()[-1])
    hits = searched["hits"]
    assert hits[0] == "oxygen#0" and set(hits) <= set(store_contents(store))
    assert not searched["encoders"]  # searching never imports pyserini's neural encoders (10 s of start-up)
    assert verified.returncode == 0 and json.loads(verified.stdout)["untracked"] == [], verified.stdout
    assert built.returncode == 0, built.stderr
    assert swapped_in.returncode == copied.returncode == put_back.returncode == 0, (swapped_in, copied, put_back)
    assert verified_swapped.returncode == 1 and json.loads(verified_swapped.stdout)["problems"] == [
        f"the BM25 index {real} holds other documents than the store's collection (ids or contents differ): rebuild "
        "it with `dilstore index`"], verified_swapped.stdout  # fmt: skip
    for path in (store / "bm25").iterdir():  # every file but the commit point cut to a few bytes
        if path.is_file() and not path.name.startswith(("segments", "write.lock", "dilstore")):
            path.write_bytes(path.read_bytes()[:8])
    damaged = subprocess.run([sys.executable, "-c", SEARCH_DAMAGED, str(store / "bm25"), "oxygen"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert damaged.returncode == 0 and "Traceback" not in damaged.stderr, damaged.stderr
    assert damaged.stdout.startswith(f"DilstoreError the BM25 index {store / 'bm25'} cannot be read ("), damaged.stdout
    assert "rebuild it with `dilstore index STORE`" in damaged.stdout


# `dilstore index STORE` as if a precompute had rebuilt the store during the build: every read of the manifest
# after the first finds another generation (the command must read it again before the index goes in place).
REBUILT_MEANWHILE = (
    "import dataclasses, sys\n"
    "from dilstore.runners import cli\n"
    "from dilstore.storage import manifest\n"
    "first = manifest.read_manifest; reads = []\n"
    "def read(location):\n"
    "    reads.append(1); found = first(location)\n"
    "    return found if len(reads) == 1 else dataclasses.replace(found, generation='0' * 16)\n"
    "manifest.read_manifest = read\n"
    "sys.exit(cli.main(['index', sys.argv[1], '--no-progress']))\n"
)


def test_an_index_of_a_store_rebuilt_while_it_was_built_is_not_put_in_place(tmp_path: Path) -> None:
    """`index` took the store's lock only at its start: an --overwrite during the build made it exit 0 with an
    index of the old store, which `ask` then refused as another store's (conc39 L5)."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", DOCUMENTS)
    store = tmp_path / "store"
    assert cli.main(["precompute", "--input", str(corpus), "--output", str(store), "--model",
                     str(save_tiny_reader(tmp_path / "tiny")), "--workers", "1", "--max-length", "48",
                     "--no-progress"]) == 0  # fmt: skip
    done = subprocess.run([sys.executable, "-c", REBUILT_MEANWHILE, str(store)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "dilstore index: error: the store was rebuilt or appended to while it was indexed (a `dilstore precompute` "
        "ran meanwhile): run `dilstore index` again; the index was not replaced"
    )
    assert not (store / "bm25").exists() and not (store / ".bm25.building").exists()


def test_index_refuses_a_folder_that_is_not_a_precomputed_store(tmp_path: Path, capsys) -> None:
    assert cli.main(["index", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"dilstore index: error: no store at {tmp_path / 'missing'}\n"
    (tmp_path / ".missing.dilstore-replaced").mkdir()  # a compaction killed between its two renames (conc54 L)
    assert cli.main(["index", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith(f"dilstore index: error: no store at {tmp_path / 'missing'}: a "
                                              "`dilstore precompute --overwrite` or `dilstore compact` was stopped")
    (tmp_path / "empty").mkdir()
    assert cli.main(["index", str(tmp_path / "empty")]) == 2
    assert "has no passage collection" in capsys.readouterr().err
    assert cli.main(["index", "https://reader:Pw-2@host/store"]) == 2  # a URL, its password not shown (review40c)
    said = capsys.readouterr().err
    assert said.startswith("dilstore index: error: https://reader:***@host/store is a URL, and Lucene"), said


def test_index_refuses_a_store_it_cannot_write_before_any_work(tmp_path: Path, capsys, monkeypatch) -> None:
    """It failed after copying the collection and starting the JVM, naming its scratch copy (storage43 L4). Root
    writes anywhere, so the permission is what `os.access` answers here."""
    store = tmp_path / "store"
    (store / "passages" / "jsonl").mkdir(parents=True)
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == store else real(path, mode))
    assert cli.main(["index", str(store)]) == 2
    assert capsys.readouterr().err == (f"dilstore index: error: {store} is not writable by this user: its index is "
                                       f"built inside it ({store}/bm25)\n")  # fmt: skip


def test_index_refuses_an_old_index_it_could_not_delete_before_any_work(tmp_path: Path, capsys, monkeypatch) -> None:
    """(perm57 F7) An old STORE/bm25 another user built in a store this user may write was renamed aside, the new one
    put in place, and its deletion failed silently: `.tmp-old-bm25-*` stayed in the store for good (verify lists
    it), with success said. Root deletes anything, so the permission is what `os.access` answers here."""
    store = tmp_path / "store"
    (store / "passages" / "jsonl").mkdir(parents=True)
    (store / "bm25").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **given: Path(path) != store / "bm25" and real(path, mode))
    assert cli.main(["index", str(store)]) == 2
    assert capsys.readouterr().err.startswith(f"dilstore index: error: {store / 'bm25'} cannot be replaced by this "
                                              "user: it is not writable by it, so the old files could not be deleted "
                                              "(a rebuilt index replaces the old one, which is deleted); ")  # fmt: skip
    assert sorted(path.name for path in store.iterdir()) == ["bm25", "passages"]


def test_index_stops_at_once_while_another_index_run_holds_the_store(tmp_path: Path, capsys) -> None:
    """Two runs deleted each other's half-built index: one failed with a Java traceback, or the first found its
    folder gone."""
    store = tmp_path / "store"
    (store / "passages" / "jsonl").mkdir(parents=True)
    with held_lock(store, INDEX_ROLE) as holder:
        status = cli.main(["index", str(store)])
    assert status == 2
    assert f"{store} is being indexed by pid {holder}" in capsys.readouterr().err
    assert sorted(path.name for path in store.iterdir()) == ["passages"]


def test_index_racing_a_compaction_names_the_compaction(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """(left55 F3) An index that passed the store's write lock just before a `dilstore compact` took both locks was
    refused as "being indexed by pid N", N the compaction's, as if another index build were running; one that met
    the compaction at the write lock was told a run "written" it. Both now name the compaction."""
    from dilstore.runners import cmd_index

    store = tmp_path / "store"
    (store / "passages" / "jsonl").mkdir(parents=True)
    taken = contextlib.ExitStack()
    real = cmd_index.write_lock

    @contextlib.contextmanager
    def compaction_after_the_probe(folder: Path, role: str = WRITE_ROLE, doing: str = "written") -> Iterator[Path]:
        with real(folder, role, doing) as held:
            yield held
        if role == WRITE_ROLE:  # the probe of the write lock let go: the compaction takes both locks
            compaction.append(taken.enter_context(held_lock(store, WRITE_ROLE, INDEX_ROLE)))

    compaction: list[int] = []
    with taken:
        monkeypatch.setattr(cmd_index, "write_lock", compaction_after_the_probe)
        assert cli.main(["index", str(store)]) == 2
        monkeypatch.undo()
        said = capsys.readouterr().err
        assert f"{store} is being compacted by pid {compaction[0]} (`dilstore compact`)" in said, said
        assert cli.main(["index", str(store)]) == 2
        said = capsys.readouterr().err
        assert f"{store} is being compacted by pid {compaction[0]} (`dilstore compact`)" in said, said
    assert sorted(path.name for path in store.iterdir()) == ["passages"]


def test_index_of_a_store_a_precompute_is_writing_names_the_writer(tmp_path: Path, capsys) -> None:
    """It said the store was "never finalized" or had "no passage collection ... was it made by `dilstore
    precompute`?" (crash38 L2)."""
    store = tmp_path / "store"
    (store / "passages" / "jsonl").mkdir(parents=True)
    with held_lock(store) as holder:
        status = cli.main(["index", str(store)])
    assert status == 2
    assert f"{store} is being written by pid {holder}" in capsys.readouterr().err
    assert sorted(path.name for path in store.iterdir()) == ["passages"]


def test_what_index_imports_leaves_out_the_model_stack() -> None:
    """`dilstore index` needs the store and Lucene, not torch or transformers (about 5 s of every start)."""
    code = (
        "import sys\n"
        "import dilstore.runners.cmd_index, dilstore.storage.collection, dilstore.reader.retrieval\n"
        "print([name for name in ('torch', 'transformers') if name in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("change", ["one more line", "one line less"])
def test_a_collection_part_whose_lines_are_not_its_shard_s_rows_is_refused(change, tmp_path: Path) -> None:
    """Line r of a shard's JSONL part is row r of the shard: a part of another length (a line added by hand, or
    cut off) is refused naming it, not indexed, so BM25 never finds a document the store does not serve."""
    shards = random_shards([3, 2], state_shape=(4,), seed=2)
    store = build_store(tmp_path / "store", shards)
    for index, rows in enumerate(shards):
        jsonl_path(store, index).parent.mkdir(parents=True, exist_ok=True)
        jsonl_path(store, index).write_text(collection_jsonl(rows), encoding="utf-8")
    assert write_live_collection(store, tmp_path / "whole") == 2
    written = [json.loads(line)["id"] for index in (0, 1) for line in
               (tmp_path / "whole" / jsonl_path(store, index).name).read_text(encoding="utf-8").splitlines()]
    assert written == [row.id for rows in shards for row in rows]
    part = jsonl_path(store, 0)
    lines = part.read_text(encoding="utf-8").splitlines(keepends=True)
    stranger = json.dumps({"id": "stranger", "contents": "not in the store"}) + "\n"
    part.write_text("".join([*lines, stranger] if change == "one more line" else lines[:-1]), encoding="utf-8")
    count = len(lines) + (1 if change == "one more line" else -1)
    with pytest.raises(DilstoreError, match=rf"{part.name} has {count} lines for the 3 rows of shard-00000"):
        write_live_collection(store, tmp_path / "again")


def sentence_record(passage_id: str, title: str, text: str) -> PassageRecord:
    """A stored passage of `text`, one token per space-separated word (its span) and a trailing [SEP]."""
    starts = [match.start() for match in re.finditer(r"\S+", text)]
    ends = [match.end() for match in re.finditer(r"\S+", text)]
    spans = np.array([*zip(starts, ends), (-1, -1)], dtype=np.int32)  # (words + 1, 2)
    return PassageRecord(id=passage_id, title=title, text=text, token_ids=np.arange(1, len(spans) + 1, dtype=np.int32),
                         char_spans=spans, states=np.ones((len(spans), 4), np.float32))  # fmt: skip


# Searches an index (argv[1]) for each query of argv[2:], in one process: {query: [passage ids]}.
SEARCH_EACH = """
import json, sys
from pathlib import Path
from dilstore.reader.retrieval import Bm25Searcher
searcher = Bm25Searcher(Path(sys.argv[1]))
print(json.dumps({query: [hit.passage_id for hit in searcher.search(query, k=3)] for query in sys.argv[2:]}))
"""

# What `dilstore verify` finds wrong with the BM25 index of the store argv[1] (its documents against the collection).
INDEX_PROBLEMS = """
import sys
from pathlib import Path
from dilstore.reader.retrieval import index_problems
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
store = Path(sys.argv[1])
print(index_problems(store / "bm25", read_manifest(StoreLocation.parse(store)), store))
"""


@pytest.mark.slow
def test_passages_in_decomposed_ligature_or_full_width_forms_are_found_by_the_words_questions_give(
    tmp_path: Path,
) -> None:
    """(unicode56 F2) Questions are searched with their compatibility forms folded (NFKC); the index held the
    passages' text as stored, so a passage that wrote `Zu\\u0308rich` (decomposed, as text from macOS), `ﬁnance` (a
    PDF's ligature) or `１９９８` (full width, as CJK text) was never found by those words: BM25 gave no hit. The
    index now reads the folded text; the store's ids, texts and collection stay as they were, and verify finds the
    index to be the store's collection (its digest folds both sides)."""
    records = [
        sentence_record("Zu\u0308rich#p0", "Zu\u0308rich", "The tram network of Zu\u0308rich opened in 1882."),
        sentence_record("minister", "Ministers", "The ﬁnance minister resigned after a long scandal."),
        sentence_record("census", "Census", "The census of １９９８ counted every household."),
        sentence_record("rhine", "Rhine", "The Rhine flows from the Swiss Alps to the North Sea."),
    ]
    store = build_store(tmp_path / "store", [records[:2], records[2:]], encoding="fp16")
    for index, rows in enumerate([records[:2], records[2:]]):
        jsonl_path(store, index).parent.mkdir(parents=True, exist_ok=True)
        jsonl_path(store, index).write_text(collection_jsonl(rows), encoding="utf-8")
    collection = {path: path.read_bytes() for path in (store / "passages" / "jsonl").glob("*.jsonl")}
    queries = ["Zürich", "finance", "1998", "rhine"]
    # Index, searches and verify's look at the index in one process, one JVM start.
    indexed, searched, checked = commands_in_one_process(
        ["dilstore", "index", str(store), "--json"],
        [script(tmp_path, "search_each", SEARCH_EACH), str(store / "bm25"), *queries],
        [script(tmp_path, "index_problems", INDEX_PROBLEMS), str(store)],
    )
    assert indexed.returncode == 0, indexed.stderr
    assert json.loads(indexed.stdout)["folded"] is True
    assert searched.returncode == 0, searched.stderr
    assert json.loads(searched.stdout) == {"Zürich": ["Zu\u0308rich#p0"], "finance": ["minister"],
                                           "1998": ["census"], "rhine": ["rhine"]}  # fmt: skip
    assert {path: path.read_bytes() for path in (store / "passages" / "jsonl").glob("*.jsonl")} == collection
    assert (checked.returncode, checked.stdout) == (0, "[]\n"), checked.stderr


def test_the_index_folds_text_as_questions_are_folded() -> None:
    """(unicode56 F2) What BM25 indexes of a passage and what it searches for a question meet only when both are
    folded by one rule."""
    from dilstore.reader.text.tokenization import folded
    from dilstore.storage.collection import searched_form

    texts = ["Zu\u0308rich", "ﬁnance ﬂow", "１９９８ Ｗｈｏ", "km² ½ …", "\u1112\u1161\u11ab", "plain", "İstanbul ß"]
    for text in texts:
        assert searched_form(text) == folded(text)


def test_verify_names_an_index_an_older_dilstore_built_unfolded(tmp_path: Path) -> None:
    """(upgrade58 F1) An index built before dilstore folded passages (2026-12-01) holds `１９９８` and `6½ km²` as
    stored, while questions are now searched folded (`1998`, `61⁄2 km2`): searches miss those passages. Its digest
    matches the store's collection (`document_digest` folds both sides), so verify said OK and nothing told the user
    to rebuild it. The Lucene reader is stood in for by the two calls verify makes (`maxDoc`, `storedFields()`)."""
    from dilstore.reader.retrieval import indexed_documents_problems
    from dilstore.storage.collection import document_digest, searched_form

    documents = [("census#0", "Census\nThe census of １９９８ counted 6½ km²."), ("rhine#0", "Rhine\nThe Rhine.")]

    class Fields:
        def __init__(self, stored: list[tuple[str, str]]) -> None:
            self.stored = stored

        def document(self, number: int) -> dict[str, str]:
            passage_id, contents = self.stored[number]
            return {"raw": json.dumps({"id": passage_id, "contents": contents})}

    def lucene(stored: list[tuple[str, str]]) -> object:
        return type("Reader", (), {"maxDoc": lambda self: len(stored), "storedFields": lambda self: Fields(stored)})()

    expected = (2, sum(document_digest(passage_id, contents) for passage_id, contents in documents) % 2**256)
    (problem,) = indexed_documents_problems(tmp_path / "bm25", lucene(documents), expected)
    assert "older than 2026-12-01" in problem and "1 of its 2 documents (e.g. 'census#0')" in problem
    assert problem.endswith("rebuild it with `dilstore index`")
    folded = [(passage_id, searched_form(contents)) for passage_id, contents in documents]  # as `index` builds now
    assert indexed_documents_problems(tmp_path / "bm25", lucene(folded), expected) == []
    (other,) = indexed_documents_problems(tmp_path / "bm25", lucene(folded[:1]), expected)
    assert "holds other documents than the store's collection" in other


def test_the_fold_scan_leaves_lines_it_cannot_read_to_the_index_build(tmp_path: Path) -> None:
    """(mut56 M98, M99, M60) `dilstore index` scans the collection for text folding changes before the build,
    which names the first line it cannot read by file and line. The scan must not fail first on such a line: bytes
    that are not UTF-8 were a UnicodeDecodeError naming no file, and a JSON line that is no object an AttributeError,
    had it read them strictly; neither was held by a test. A collection folding leaves as it is is indexed in place,
    not copied."""
    from dilstore.storage.collection import folds_anything

    part = tmp_path / "part-00000.jsonl"
    part.write_bytes(b'{"id": "a", "contents": "caf\xe9"}\n["\xef\xac\x81nance"]\n{"id": "b", "contents": "ok"}\n')
    assert folds_anything(tmp_path) is False
    # (mut56 M62) an id folding would change is the store's id, kept as it is: its line alone needs no folded copy
    part.write_bytes(part.read_bytes() + '{"id": "Zu\u0308rich", "contents": "plain"}\n'.encode())
    assert folds_anything(tmp_path) is False
    part.write_bytes(part.read_bytes() + '{"id": "c", "contents": "ﬁnance"}\n'.encode())
    assert folds_anything(tmp_path) is True
