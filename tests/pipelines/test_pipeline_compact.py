"""`dilstore compact` on stores `dilstore precompute` built and appended to.

In place, the compacted store replaces STORE under the same name and serves exactly what it served (states
bit for bit), with one build, no appends, its passage tables and its settings, so later appends and `dilstore
index` work as on any store. With --output, STORE is left as it was. A BM25 index comes along only when it
covers the store as it is. Stores whose codes cannot move between shards are refused before anything is
written.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dilstore.pipelines.spec_file import read_spec
from dilstore.reader.retrieval import INDEX_RECORD, check_index_covers, indexed_state
from dilstore.runners import cli
from dilstore.storage import write_lock as write_lock_module
from dilstore.storage.collection import collection_dir
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import APPENDS_DIR, MANIFEST_FILE
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.passage_tables import passage_column
from dilstore.storage.replacement import building_dir, replaced_dir
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import (
    killed_while_writing,
    save_tiny_reader,
    store_contents,
    wiki_like_documents,
    write_jsonl,
)
from tests.fixtures.store_fixtures import build_store, passage

pytestmark = pytest.mark.slow

DOCUMENTS = wiki_like_documents(10, words=30)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reader(tmp_path_factory.mktemp("compact-model") / "reader")


def precompute(model: Path, corpus: Path, store: Path, *extra: str) -> None:
    assert cli.main(["precompute", "--input", str(corpus), "--output", str(store), "--model", str(model),
                     "--workers", "1", "--threads", "1", "--max-length", "48", "--shards", "3",
                     "--encoding", "fp16", "--no-progress", *extra]) == 0  # fmt: skip


@pytest.fixture(scope="module")
def appended(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of six documents, an append of three more, and an append that replaces one with a new text; the
    first two runs each set a record aside (a dead letter)."""
    folder = tmp_path_factory.mktemp("compact-stores")
    store = folder / "appended"
    precompute(model, with_a_bad_line(write_jsonl(folder / "a.jsonl", DOCUMENTS[:6])), store)
    precompute(model, with_a_bad_line(write_jsonl(folder / "b.jsonl", DOCUMENTS[6:9])), store, "--append")
    changed = {**DOCUMENTS[2], "text": "the library was built by the river in the early industrial period"}
    precompute(model, write_jsonl(folder / "r.jsonl", [changed]), store, "--append", "--replace")
    return store


def with_a_bad_line(corpus: Path) -> Path:
    with corpus.open("a", encoding="utf-8") as file:
        file.write("{not json\n")
    return corpus


def dead_letters(store: Path) -> list[str]:
    """Every dead letter of the store: under `rejected/` (a compacted store's appends' in subfolders there) and
    under each append's folder, sorted."""
    parts = [*(store / "rejected").rglob("*.jsonl"), *(store / APPENDS_DIR).glob("*/rejected/*.jsonl")]
    return sorted(line for part in parts for line in part.read_text(encoding="utf-8").splitlines())


def document_ids(store: Path) -> dict[str, str]:
    """passage id -> doc_id from the passage tables of the store and its appends (a later table's row wins)."""
    tables = sorted((store / "passages").glob("*.parquet")) + sorted((store / APPENDS_DIR).glob("*/passages/*.parquet"))
    found: dict[str, str] = {}
    for table in tables:
        found.update(zip(passage_column(table, "id"), passage_column(table, "doc_id"), strict=True))
    return found


def compact(capsys: pytest.CaptureFixture[str], *arguments: str) -> dict:
    capsys.readouterr()
    assert cli.main(["compact", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def same_contents(found: dict, expected: dict) -> bool:
    """The same ids, titles and texts, and equal token ids, spans and states (exactly)."""
    return sorted(found) == sorted(expected) and all(
        found[key][:2] == expected[key][:2]
        and all(np.array_equal(a, b) for a, b in zip(found[key][2:], expected[key][2:], strict=True))
        for key in expected
    )


def test_in_place_the_store_serves_the_same_passages_from_fewer_files_and_takes_appends(
        model: Path, appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    shutil.copytree(appended, store)
    (store / "notes.txt").write_text("mine", encoding="utf-8")  # a user's own file
    before, letters, documents = store_contents(store), dead_letters(store), document_ids(store)
    assert len(letters) == 2
    result = compact(capsys, str(store))
    assert same_contents(store_contents(store), before)
    first_append = read_manifest(StoreLocation.parse(appended)).appends[0]["generation"]
    assert dead_letters(store) == letters and (store / "rejected" / first_append).is_dir()
    assert document_ids(store) == {passage_id: documents[passage_id] for passage_id in before}
    assert (store / "notes.txt").read_text(encoding="utf-8") == "mine" and (store / "run-summary.json").is_file()
    assert result["superseded_rows_dropped"] >= 1 and result["appends_before"] == 2
    assert result["files"] < result["files_before"] and result["shards"] < result["shards_before"]
    manifest = read_manifest(StoreLocation.parse(store))
    assert manifest.appends == () and manifest.superseded_passages == 0
    assert manifest.creation["command"] == f"dilstore compact {store} --shards {result['shards']}"
    assert not (store / APPENDS_DIR).exists() and not building_dir(store).exists()
    assert read_spec(store)["split"] == "words" and len(read_spec(store)["compacted"]["appends"]) == 2
    report = verify_store(store)
    assert report.ok, report.problems
    parts = collection_dir(store).glob("*.jsonl")
    assert sum(len(part.read_text(encoding="utf-8").splitlines()) for part in parts) == manifest.passages
    precompute(model, write_jsonl(tmp_path / "c.jsonl", DOCUMENTS[9:]), store, "--append")
    new = set(store_contents(store)) - set(before)
    assert new and all(passage_id.startswith(DOCUMENTS[9]["id"]) for passage_id in new)


def test_a_store_in_a_folder_whose_name_is_not_utf8_is_compacted_in_place(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(unicode56 F8) pyarrow took the passage tables' paths as UTF-8 and the manifest recorded the command with the
    store's path as it was: compacting a store in a folder named in Latin-1 bytes ended with "text that is not valid
    UTF-8" and the store as it was. The tables are read through open files and the command records the name's
    bytes as escapes."""
    store = tmp_path / os.fsdecode(b"caf\xe9")
    shutil.copytree(appended, store)
    before = store_contents(store)
    result = compact(capsys, str(store))
    assert same_contents(store_contents(store), before) and result["shards"] < result["shards_before"]
    manifest = read_manifest(StoreLocation.parse(store))
    assert manifest.creation["command"] == f"dilstore compact '{tmp_path}/caf\\xe9' --shards {result['shards']}"
    report = verify_store(store)
    assert report.ok, report.problems


def test_output_leaves_the_store_as_it_was_and_brings_an_index_only_when_it_covers_the_store(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "source"
    assert cli.main(["compact", str(appended), "--output", str(source), "--no-progress"]) == 0
    manifest = read_manifest(StoreLocation.parse(source))
    index = source / "bm25"
    index.mkdir()
    (index / "segments_1").write_bytes(b"lucene")
    (index / INDEX_RECORD).write_text(json.dumps(indexed_state(manifest)), encoding="utf-8")
    manifest_bytes = (source / MANIFEST_FILE).read_bytes()
    result = compact(capsys, str(source), "--output", str(tmp_path / "copy"), "--shards", "1")
    assert (source / MANIFEST_FILE).read_bytes() == manifest_bytes
    assert result["bm25_index"] == "carried" and result["shards"] == 1
    assert same_contents(store_contents(tmp_path / "copy"), store_contents(source))
    check_index_covers(tmp_path / "copy" / "bm25", read_manifest(StoreLocation.parse(tmp_path / "copy")),
                       tmp_path / "copy")  # fmt: skip
    (index / INDEX_RECORD).write_text(json.dumps({**indexed_state(manifest), "appends": 5}), encoding="utf-8")
    assert compact(capsys, str(tmp_path / "copy"))["bm25_index"] == "carried"  # compact already, its index covers it
    stale = compact(capsys, str(source), "--output", str(tmp_path / "stale"))
    assert stale["bm25_index"] == "stale" and not (tmp_path / "stale" / "bm25").exists()



def test_an_index_given_elsewhere_of_the_build_a_store_was_compacted_from_covers_it(
        model: Path, appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(conc54 F5) Compaction moves STORE/bm25's record on to the new build, but an index given elsewhere (`--index
    DIR`, as every store at a URL needs) kept the appended store's record: serve, ask and evaluate-qa refused it as
    "built for another store", and a served store compacted on its web server stayed unavailable until an index was
    copied, though its live passages are the same. One appended to since is still refused, and so is another
    build's; the first as the build the store was compacted from, not as "another store" (conc54 L)."""
    from tests.fixtures.http_store import serve_directory

    store = tmp_path / "store"
    shutil.copytree(appended, store)
    index = tmp_path / "elsewhere"
    index.mkdir()
    (index / INDEX_RECORD).write_text(json.dumps(indexed_state(read_manifest(StoreLocation.parse(store)))),
                                      encoding="utf-8")  # fmt: skip
    compact(capsys, str(store))
    compacted = read_manifest(StoreLocation.parse(store))
    check_index_covers(index, compacted, store)
    with serve_directory(tmp_path) as server:
        check_index_covers(index, compacted, f"{server.url}/store")
    other = tmp_path / "other"
    other.mkdir()
    (other / INDEX_RECORD).write_text(json.dumps({**indexed_state(compacted), "generation": "0123456789abcdef"}),
                                      encoding="utf-8")  # fmt: skip
    with pytest.raises(DilstoreError, match="was built for another store"):
        check_index_covers(other, compacted, store)
    precompute(model, write_jsonl(tmp_path / "c.jsonl", DOCUMENTS[9:]), store, "--append")
    appended_since = read_manifest(StoreLocation.parse(store))
    with pytest.raises(DilstoreError, match=f"^the BM25 index at {index} is of build '[0-9a-f]+', which the store "
                                            f"{store} was compacted from; it holds {appended_since.passages} passages "
                                            r"after 1 append\(s\) since: .* rebuild it with `dilstore index"):
        check_index_covers(index, appended_since, store)
    # A record naming no build, of a store never compacted (no record of a build it was compacted from either).
    (other / INDEX_RECORD).write_text(json.dumps({"passages": 1, "appends": 0}), encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"was built for another store \(build None\)"):
        check_index_covers(other, read_manifest(StoreLocation.parse(appended)), appended)


def test_an_output_a_killed_compaction_left_is_named_as_such_and_the_same_command_starts_it_over(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(conc54 F7) A `compact --output DIR` killed before its end (kill -9, the OOM killer) left its spec and part of
    the store in DIR: the same command was refused ("exists and is not an empty folder"), and `info` said a
    `dilstore precompute` had been killed and that the same command would go on. A folder of anything else is
    still refused."""
    output = tmp_path / "copy"
    compact(capsys, str(appended), "--output", str(output))
    expected = store_contents(output)
    (output / MANIFEST_FILE).unlink()  # what a kill before the compacted store was finalized leaves, spec first
    assert cli.main(["info", str(output)]) == 2
    assert "a `dilstore compact --output` into it stopped before its end" in capsys.readouterr().err
    assert compact(capsys, str(appended), "--output", str(output))["passages"] == len(expected)
    assert same_contents(store_contents(output), expected) and verify_store(output).ok
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine", encoding="utf-8")
    assert cli.main(["compact", str(appended), "--output", str(busy)]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err and (busy / "notes.txt").exists()


def test_an_output_a_compaction_killed_while_it_wrote_its_spec_left_is_cleared_by_the_same_command(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(state56 F3) A `compact --output DIR` killed while it wrote its spec, the first file it writes into DIR, left
    that spec's temporary: the same command was refused with "exists and is not an empty folder", of a folder that
    `ls` shows empty."""
    output = tmp_path / "copy"
    killed_while_writing(output / "precompute.json")
    assert [path.name.startswith(".tmp-precompute.json.") for path in output.iterdir()] == [True]
    assert compact(capsys, str(appended), "--output", str(output))["passages"] == len(store_contents(appended))
    assert same_contents(store_contents(output), store_contents(appended))
    report = verify_store(output)
    assert report.ok and report.untracked == [], (report.problems, report.untracked)


def test_an_output_a_compaction_killed_after_its_copy_left_is_named_with_what_it_lacks_and_what_to_do(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(left56b F1) A `compact --output DIR` killed after the copy was finalized but before it had copied STORE's
    BM25 index (or all of it) and the user's files along: the same command said only "exists and is not an empty
    folder", neither that DIR holds STORE compacted nor what to do. It is still refused (DIR may have been used
    since), and says what DIR lacks and how to finish it."""
    store = tmp_path / "store"
    shutil.copytree(appended, store)
    (store / "bm25").mkdir()
    (store / "bm25" / "segments_1").write_bytes(b"lucene")
    (store / "bm25" / INDEX_RECORD).write_text(json.dumps(indexed_state(read_manifest(StoreLocation.parse(store)))),
                                               encoding="utf-8")  # fmt: skip
    (store / "notes.txt").write_text("mine", encoding="utf-8")
    output = tmp_path / "copy"
    assert compact(capsys, str(store), "--output", str(output))["bm25_index"] == "carried"
    assert cli.main(["compact", str(store), "--output", str(output)]) == 2
    said = capsys.readouterr().err
    assert f"exists and is not an empty folder: it holds {store} compacted already; use it" in said, said
    (output / "notes.txt").unlink()
    (output / "bm25" / INDEX_RECORD).write_bytes((store / "bm25" / INDEX_RECORD).read_bytes())  # part of a copy
    assert cli.main(["compact", str(store), "--output", str(output)]) == 2
    said = capsys.readouterr().err
    assert (f"exists and is not an empty folder: it holds {store} compacted, without its BM25 index or your files "
            f"in it (notes.txt) (a `dilstore compact --output` stopped before it had copied them along): run "
            f"`dilstore index {output}`, and copy them into {output}; or delete {output} and run the command again"
            ) in said, said  # fmt: skip
    shutil.rmtree(output / "bm25")
    (output / "notes.txt").write_text("mine", encoding="utf-8")
    assert cli.main(["compact", str(store), "--output", str(output)]) == 2
    said = capsys.readouterr().err
    assert "compacted, without its BM25 index (a `dilstore compact --output` stopped before" in said, said
    other = tmp_path / "other"
    compact(capsys, str(output), "--output", str(other), "--shards", "1")
    assert cli.main(["compact", str(store), "--output", str(other)]) == 2
    assert f"it holds a compacted store, of another build than {store} as it is now" in capsys.readouterr().err


def test_an_index_folder_whose_record_matches_but_that_holds_no_index_is_not_carried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """STORE/bm25 with its record and no Lucene segments (an index cut short, or emptied) is no index to copy: the
    compacted store gets none, and `dilstore index` builds one, rather than a bm25/ folder that ask and serve refuse."""
    store = tmp_path / "store"
    build_store(store, [[passage(f"p{row}", 6, (8,), np.random.default_rng(row)) for row in range(2)]])
    (store / "bm25").mkdir()
    record = json.dumps(indexed_state(read_manifest(StoreLocation.parse(store))))
    (store / "bm25" / INDEX_RECORD).write_text(record, encoding="utf-8")
    result = compact(capsys, str(store), "--output", str(tmp_path / "copy"), "--shards", "1")
    assert result["bm25_index"] == "stale" and not (tmp_path / "copy" / "bm25").exists()

@pytest.mark.parametrize("shards", [2, 3])
def test_compacting_into_several_shards_keeps_each_passage_table_row_with_its_own_passage(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int) -> None:
    """With more than one target shard, rows move between shards: each table row's id still names the doc_id and
    text the source store served under that id (the tables feed the BM25 collection), and verify passes."""
    copy = tmp_path / "copy"
    assert compact(capsys, str(appended), "--output", str(copy), "--shards", str(shards))["shards"] == shards
    served, documents = store_contents(appended), document_ids(appended)
    rows: dict[str, tuple[str, str]] = {}
    for table in sorted((copy / "passages").glob("*.parquet")):
        rows.update(zip(passage_column(table, "id"), zip(passage_column(table, "doc_id"),
                                                         passage_column(table, "text"), strict=True), strict=True))
    assert rows == {passage_id: (documents[passage_id], text) for passage_id, (_, text, *_) in served.items()}
    report = verify_store(copy)
    assert report.ok, report.problems


def test_a_store_on_a_read_only_mount_is_compacted_to_output_without_its_lock(
        appended: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """compact44 L4: --output only reads STORE, but was refused for want of a lock file beside it. The suite may
    run as root, whom file modes do not stop, so the mount is stood in for: its folder cannot be written to, and
    a lock file there cannot be made."""
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    store = mounted / "store"
    shutil.copytree(appended, store)
    access, make = os.access, write_lock_module.os.open

    def read_only(path: object, *args: object, **kwargs: object) -> int:
        if Path(str(path)).parent == mounted and args and args[0] & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return make(path, *args, **kwargs)

    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not (Path(path) == mounted and mode & os.W_OK)
                        and access(path, mode, **kw))  # fmt: skip
    monkeypatch.setattr(write_lock_module.os, "open", read_only)
    before = store_contents(store)
    result = compact(capsys, str(store), "--output", str(tmp_path / "copy"))
    assert result["superseded_rows_dropped"] >= 1
    assert same_contents(store_contents(tmp_path / "copy"), before)
    assert not list(mounted.glob(".*"))
    assert cli.main(["compact", str(store)]) == 2
    assert (f"cannot create the lock file {mounted}/.store.dilstore-lock: Read-only file system; the lock of {store} "
            f"lives beside it, so its folder {mounted} must be writable") in capsys.readouterr().err


def test_compaction_runs_no_model_code(appended: Path, tmp_path: Path) -> None:
    """scale45 L1: the spec helpers came from pipelines/job.py, whose routing imports the model code, so every
    compaction loaded torch (3-5 s and about 250 MB) to copy bytes. In a process of its own: this one has torch."""
    script = ("import sys; from dilstore.runners import cli; "
              f"status = cli.main(['compact', {str(appended)!r}, '--output', {str(tmp_path / 'copy')!r}, '--json']); "
              "print(status, sorted(name for name in ('torch', 'transformers', 'apache_beam') if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 []", done.stderr
    assert (tmp_path / "copy" / MANIFEST_FILE).is_file()


def test_an_int8_store_and_a_busy_output_are_refused_before_anything_is_written(
        model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "int8"
    precompute(model, write_jsonl(tmp_path / "a.jsonl", DOCUMENTS[:2]), store, "--encoding", "int8")
    capsys.readouterr()
    assert cli.main(["compact", str(store), "--shards", "2"]) == 2  # one shard now: compact already without it
    assert "int8 codes are scaled per shard" in capsys.readouterr().err
    assert not building_dir(store).exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine", encoding="utf-8")
    assert cli.main(["compact", str(store), "--output", str(busy)]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert (busy / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_a_compressed_store_compacts_and_stays_compressed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A zstd store was refused: compact opened it memory-mapped, which only uncompressed stores are (quant44 M1)."""
    store = tmp_path / "zstd"
    shards = [[passage(f"s{shard}-{row}", 6, (8,), np.random.default_rng([shard, row])) for row in range(3)]
              for shard in range(3)]  # fmt: skip
    build_store(store, shards, compressor="zstd")
    before = store_contents(store)
    result = compact(capsys, str(store), "--shards", "1")
    assert result["shards"] == 1 and read_manifest(StoreLocation.parse(store)).compressor == "zstd"
    assert same_contents(store_contents(store), before)


def test_the_first_build_command_still_finds_the_compacted_store_complete(
        model: Path, appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was refused as "other settings (compacted, shards)", with a hint to --overwrite that would have dropped
    every appended passage (compact44 M1)."""
    store = tmp_path / "store"
    shutil.copytree(appended, store)
    compact(capsys, str(store))
    manifest_bytes = (store / MANIFEST_FILE).read_bytes()
    precompute(model, appended.parent / "a.jsonl", store)
    assert "is already complete with these settings" in capsys.readouterr().err
    assert (store / MANIFEST_FILE).read_bytes() == manifest_bytes


def test_overwrite_with_the_first_build_s_inputs_builds_an_appended_or_compacted_store_again(
        model: Path, appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(conc54 F2) `precompute --overwrite` of an appended store (or one compacted since) with its first build's
    inputs said "already complete with these settings", printed the first build's summary and kept every appended
    and replacing passage, where README offers --overwrite as the way to build a store again without them. The
    same command without --overwrite still finds it complete, and now says the store changed since."""
    fresh = tmp_path / "fresh"
    precompute(model, appended.parent / "a.jsonl", fresh)
    expected = store_contents(fresh)
    for compacted in (False, True):
        store = tmp_path / f"store-{compacted}"
        shutil.copytree(appended, store)
        if compacted:
            compact(capsys, str(store))
        manifest_bytes = (store / MANIFEST_FILE).read_bytes()
        capsys.readouterr()
        precompute(model, appended.parent / "a.jsonl", store)
        assert "has changed since (appends, or a compaction)" in capsys.readouterr().err
        assert (store / MANIFEST_FILE).read_bytes() == manifest_bytes
        precompute(model, appended.parent / "a.jsonl", store, "--overwrite")
        assert "already complete" not in capsys.readouterr().err
        assert read_manifest(StoreLocation.parse(store)).appends == () and "compacted" not in read_spec(store)
        assert same_contents(store_contents(store), expected) and not building_dir(store).exists()
        precompute(model, appended.parent / "a.jsonl", store, "--overwrite")  # now what these inputs build
        err = capsys.readouterr().err
        assert "is already complete with these settings\n" in err and "changed since" not in err


def test_a_swap_a_kill_cut_short_is_finished_by_the_next_compact_or_append(
        model: Path, appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Killed between its two renames, a compaction left no STORE: `compact` and `precompute --append` said there
    was no store (compact44 M2)."""
    for command in ("compact", "append"):
        store = tmp_path / command
        shutil.copytree(appended, replaced_dir(store))  # the old store, put aside
        assert cli.main(["compact", str(replaced_dir(store)), "--output", str(building_dir(store)),
                         "--no-progress"]) == 0  # the new one, complete  # fmt: skip
        before = store_contents(building_dir(store))
        if command == "compact":
            assert cli.main(["compact", str(store), "--no-progress"]) == 0
        else:
            precompute(model, write_jsonl(tmp_path / "c.jsonl", DOCUMENTS[9:]), store, "--append")
        assert not replaced_dir(store).exists() and not building_dir(store).exists()
        after = store_contents(store)
        assert set(before) <= set(after) and verify_store(store).ok


def left_by_a_killed_compaction(appended: Path, store: Path) -> Path:
    """A copy of `appended` at `store`, beside it what an in-place `compact` killed (-9) before its end leaves: its
    building folder, unfinalized (no manifest); that folder."""
    shutil.copytree(appended, store)
    building = building_dir(store)
    assert cli.main(["compact", str(store), "--output", str(building), "--no-progress"]) == 0
    (building / MANIFEST_FILE).unlink()  # killed before it was finalized
    return building


def test_what_a_killed_in_place_compaction_left_is_named_by_info_and_deleted_by_the_next_precompute(
        model: Path, appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(left55 F1) A `compact` killed (-9) while it built the compacted store beside STORE left
    `.STORE.dilstore-building`, a copy of the store's live rows: `info` said nothing of it, and a `precompute` of
    the store (the first build's command again, or an append) left it for good; only a `compact` deleted it."""
    for command in ("rerun", "append"):
        store = tmp_path / command
        building = left_by_a_killed_compaction(appended, store)
        capsys.readouterr()
        assert cli.main(["info", str(store)]) == 0
        said = capsys.readouterr().err
        assert f"{building} (" in said and "the next `dilstore compact` or `dilstore precompute` of it" in said, said
        before = store_contents(store)
        if command == "rerun":
            precompute(model, appended.parent / "a.jsonl", store)
            assert same_contents(store_contents(store), before)
        else:
            precompute(model, write_jsonl(tmp_path / "c.jsonl", DOCUMENTS[9:]), store, "--append")
            assert set(before) < set(store_contents(store))
        assert not building.exists()
        capsys.readouterr()
        assert cli.main(["info", str(store)]) == 0 and capsys.readouterr().err == ""


def test_info_names_a_killed_compaction_s_folder_through_a_link_and_not_while_one_runs(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(mut55) `info LINK` names what a killed in-place compaction left beside the store the link leads to, where
    `compact` builds it, not beside the link; and while a compaction runs (it holds the store's locks) its building
    folder is its work, of which `info` says nothing."""
    from dilstore.storage.write_lock import INDEX_ROLE, WRITE_ROLE
    from tests.fixtures.locks import held_lock

    store, link = tmp_path / "store", tmp_path / "link"
    building = left_by_a_killed_compaction(appended, store)
    link.symlink_to(store)
    capsys.readouterr()
    assert cli.main(["info", str(link)]) == 0
    said = capsys.readouterr().err
    assert said.startswith(f"dilstore info: {building} (") and f"a `dilstore compact` of {link} stopped" in said, said
    with held_lock(store, WRITE_ROLE, INDEX_ROLE):
        assert cli.main(["info", str(store)]) == 0
        assert capsys.readouterr().err == ""


def test_a_link_to_the_store_stays_a_link_and_a_stopped_overwrites_build_is_kept(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through a link, the link was replaced by a compacted copy and the store left as it was; and a stopped
    `precompute --overwrite`'s folder, which its re-run resumes from, was deleted (compact44 M3, L2)."""
    store, link = tmp_path / "store", tmp_path / "link"
    shutil.copytree(appended, store)
    link.symlink_to(store)
    result = compact(capsys, str(link))
    assert link.is_symlink() and result["store"] == str(store) and result["appends_before"] == 2
    assert read_manifest(StoreLocation.parse(store)).appends == ()
    building = building_dir(store)
    building.mkdir()
    (building / "precompute.json").write_text(json.dumps({"inputs": [], "shards": 4}), encoding="utf-8")
    (building / "shards").mkdir()
    assert cli.main(["compact", str(store), "--shards", "2"]) == 2
    assert "a stopped `dilstore precompute --overwrite`" in capsys.readouterr().err and (building / "shards").is_dir()


def test_a_compaction_stopped_twice_leaves_no_folder_that_blocks_the_next(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C while a stopped compaction deleted its half-built store left shards without the spec; every
    later `compact` was refused as a stopped `precompute --overwrite`'s folder to run again (scale53 F1)."""
    from dilstore.storage import durability

    store = tmp_path / "store"
    shutil.copytree(appended, store)
    before = store_contents(store)

    def interrupt(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    removal = durability.remove_path

    def interrupted_removal(path: Path) -> None:  # rmtree got as far as the spec file when the second Ctrl-C came
        if not (path / "precompute.json").is_file():
            return removal(path)
        (path / "precompute.json").unlink()
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr("dilstore.storage.compact.finalize", interrupt)
        patch.setattr(durability, "remove_path", interrupted_removal)
        assert cli.main(["compact", str(store), "--no-progress"]) == 130
    assert (building_dir(store) / "shards").is_dir() and not read_spec(building_dir(store))
    capsys.readouterr()
    assert compact(capsys, str(store))["appends_before"] == 2
    assert not building_dir(store).exists() and same_contents(store_contents(store), before)


def test_a_store_compact_already_is_left_and_a_full_disk_is_said_before_writing(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    shutil.copytree(appended, store)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    assert cli.main(["compact", str(store)]) == 2
    said = capsys.readouterr().err
    assert re.search(r"needs about [0-9.]+ MB free .* has 0\.00 MB \([0-9.]+ MB short\)", said), said  # full49 F7
    assert not building_dir(store).exists()
    monkeypatch.undo()
    first = compact(capsys, str(store))
    manifest_bytes = (store / MANIFEST_FILE).read_bytes()
    again = compact(capsys, str(store))
    assert again["already_compact"] is True and (store / MANIFEST_FILE).read_bytes() == manifest_bytes
    assert first["already_compact"] is False and list(again) == list(first)  # one shape either way (api45 L7)
    assert {key: again[key] for key in ("passages", "tokens", "shards", "files", "bytes", "generation")} == {
        key: first[key] for key in ("passages", "tokens", "shards", "files", "bytes", "generation")}
    assert again["superseded_rows_dropped"] == 0 and again["files_before"] == again["files"]
    assert again["bm25_index"] == "none"  # the index's state, as a compaction says it (it said "unchanged")


def test_the_default_shard_count_follows_the_tokens_served_and_never_grows() -> None:
    """A store of 1 passage in 4 shards, then 200 appended, went to 175 shards (compact44 H1)."""
    from types import SimpleNamespace

    from dilstore.runners.cmd_compact import SHARD_TOKENS, default_shards

    def manifest(tokens: int, shards: int) -> SimpleNamespace:
        return SimpleNamespace(tokens=tokens, shards=[object()] * shards)

    assert default_shards(manifest(8_000, 175)) == 1
    assert default_shards(manifest(10 * SHARD_TOKENS + 1, 30)) == 11
    assert default_shards(manifest(100 * SHARD_TOKENS, 30)) == 30
    assert default_shards(manifest(0, 0)) == 1


def test_the_current_folder_a_url_and_an_output_inside_a_store_are_refused_and_an_empty_store_is_left(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`compact .` swapped the shell's folder away; a URL got `index`'s Lucene hint; an --output inside another
    store was written there; an empty store was rebuilt on every run, or (2bit) refused with a codebook error
    (review44 L2-L5)."""
    store = tmp_path / "store"
    shutil.copytree(appended, store)
    monkeypatch.chdir(store)
    assert cli.main(["compact", "."]) == 2
    assert "is the current folder or one of its parents" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compact", "http://example.invalid/store"]) == 2
    assert "is a URL: compact a local copy of the store" in capsys.readouterr().err
    assert cli.main(["compact", str(store), "--output", str(appended / "copy")]) == 2
    assert f"is inside the store {appended}" in capsys.readouterr().err and not (appended / "copy").exists()
    empty = build_store(tmp_path / "empty", [], encoding="2bit")
    assert compact(capsys, str(empty))["already_compact"] is True


def test_an_in_place_compaction_from_inside_the_store_is_refused_and_leaves_it(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a folder inside the store (its shards/), the swap would pull the shell's folder away as `compact .`
    would: refused the same way, the store left as it was."""
    store = tmp_path / "store"
    shutil.copytree(appended, store)
    manifest_bytes = (store / MANIFEST_FILE).read_bytes()
    monkeypatch.chdir(store / "shards")
    assert cli.main(["compact", str(store)]) == 2
    assert "is the current folder or one of its parents" in capsys.readouterr().err
    assert (store / MANIFEST_FILE).read_bytes() == manifest_bytes and Path.cwd() == (store / "shards").resolve()


def test_a_store_whose_append_retired_every_passage_is_not_already_compact(tmp_path: Path) -> None:
    """No live passage, but an append whose superseded rows still take room: compacting drops them, so the store is
    not "already compact" as a store that never had a passage is."""
    from dilstore.runners.cmd_compact import already_compact
    from dilstore.storage.append import commit_append
    from dilstore.storage.format import append_dir
    from tests.fixtures.store_fixtures import fingerprint_for

    generation = "0123456789abcdef"
    rng = np.random.default_rng(7)
    store = build_store(tmp_path / "store", [[passage("a", 3, (4,), rng), passage("b", 2, (4,), rng)]])
    (store / append_dir(generation)).mkdir(parents=True)
    commit_append(store, generation, fingerprint_for(), replace=True, retire=("a", "b"))
    manifest = read_manifest(StoreLocation.parse(store))
    assert (manifest.passages, len(manifest.appends), manifest.superseded_passages) == (0, 1, 2)
    assert already_compact(store, None) is None
    assert already_compact(build_store(tmp_path / "never", []), None) == "no passages"


def test_a_compaction_to_more_shards_than_the_passages_fill_is_not_done_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(tail61 F2) Eight passages routed to eight shards fill six: `compact --shards 8` wrote six, and the same
    command then compacted the store again on every run, as six is not eight. It is now left as it is."""
    from dilstore.pipelines.sharding import shard_of

    rng = np.random.default_rng(3)
    store = build_store(tmp_path / "store", [[passage(f"p{number}", 2, (4,), rng) for number in range(8)]])
    routes = {shard_of(f"p{number}", 8) for number in range(8)}
    first = compact(capsys, str(store), "--shards", "8")
    assert first["already_compact"] is False and first["shards"] == len(routes) < 8, first
    manifest_bytes = (store / MANIFEST_FILE).read_bytes()
    again = compact(capsys, str(store), "--shards", "8")
    assert again["already_compact"] is True and (store / MANIFEST_FILE).read_bytes() == manifest_bytes, again
    assert again["reason"] == f"8 passages in {len(routes)} shards (all that its passages fill of 8), no appends, no " \
        "superseded rows"
    assert compact(capsys, str(store), "--shards", "7")["already_compact"] is False  # routed for 8, not for 7


def test_an_index_being_built_holds_compaction_off_and_hidden_work_is_not_carried(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction beside a running `dilstore index` carried its half-built `.bm25.building` into the new store,
    and the index then failed (review44b M1); `--output .` from an empty folder left the shell in a deleted one,
    and an empty 2bit store could not be compacted into --output (review44b L2, L5)."""
    from dilstore.storage.write_lock import INDEX_ROLE, write_lock

    store = tmp_path / "store"
    shutil.copytree(appended, store)
    with write_lock(store, INDEX_ROLE, doing="indexed"):
        assert cli.main(["compact", str(store)]) == 2
    assert "indexed" in capsys.readouterr().err and read_manifest(StoreLocation.parse(store)).appends
    (store / ".bm25.building").mkdir()
    (store / ".bm25.building" / "write.lock").write_text("", encoding="utf-8")
    compact(capsys, str(store))
    assert not (store / ".bm25.building").exists()
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert cli.main(["compact", str(store), "--output", "."]) == 2
    assert "is the current folder or one of its parents" in capsys.readouterr().err and here.is_dir()
    monkeypatch.chdir(tmp_path)
    empty = build_store(tmp_path / "empty", [], encoding="2bit")
    assert compact(capsys, str(empty), "--output", str(tmp_path / "empty-copy"))["passages"] == 0


def test_a_stop_says_whether_the_compacted_store_is_in_place(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C after the swap said only "interrupted", as if nothing had been done (compact44 L5); one before it
    leaves the store as it was and nothing beside it."""
    from dilstore.runners import cmd_compact

    store = tmp_path / "store"
    shutil.copytree(appended, store)

    def interrupt(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr("dilstore.storage.compact.finalize", interrupt)
        assert cli.main(["compact", str(store), "--no-progress"]) == 130
    said = capsys.readouterr().err.strip()  # no swap to finish: not "stopped while the new store was put in place"
    assert said.endswith(f"interrupted; {store} is as it was"), said  # (scale53 F2)
    assert read_manifest(StoreLocation.parse(store)).appends and not building_dir(store).exists()
    with monkeypatch.context() as patch:
        patch.setattr(cmd_compact, "_summary", interrupt)
        assert cli.main(["compact", str(store), "--no-progress"]) == 130
    assert f"interrupted after the compaction had finished: {store} is compacted" in capsys.readouterr().err
    assert read_manifest(StoreLocation.parse(store)).appends == ()


def test_a_stop_while_deleting_the_old_copy_says_the_store_is_compacted(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every in-place stop said the store was as it was, stopped while the new one was put in place: one while the
    old copy was deleted had the compacted store in place (scale53 F2)."""
    from dilstore.storage import durability

    store = tmp_path / "store"
    shutil.copytree(appended, store)
    removal = durability.remove_path

    def interrupted_removal(path: Path) -> None:  # Ctrl-C while the old store's copy is deleted
        if path == replaced_dir(store) and path.is_dir():
            raise KeyboardInterrupt
        removal(path)

    with monkeypatch.context() as patch:
        patch.setattr(durability, "remove_path", interrupted_removal)
        assert cli.main(["compact", str(store), "--no-progress"]) == 130
    said = capsys.readouterr().err
    assert f"interrupted; {store} is compacted; the old store's copy left at {replaced_dir(store)}" in said, said
    assert read_manifest(StoreLocation.parse(store)).appends == () and replaced_dir(store).is_dir()
    assert compact(capsys, str(store))["already_compact"] is True and not replaced_dir(store).exists()


def test_a_compact_that_finished_a_stopped_one_s_work_says_what_it_did(
        appended: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(left55 F2) Run again after a compaction killed while it deleted the old store's copy, `compact` deleted that
    copy (the store's full size) and said "... is compact already (...); nothing was written"; `--json` had no word
    of it either. One that finishes a swap or clears a half-built store before compacting says so too."""
    store = tmp_path / "store"
    shutil.copytree(appended, store)
    compact(capsys, str(store))
    shutil.copytree(appended, replaced_dir(store))  # the old store's copy, its delete cut short
    assert cli.main(["compact", str(store), "--no-progress"]) == 0
    said = capsys.readouterr().err
    assert f"deleted the old store's copy a stopped run left at {replaced_dir(store)}; {store} is compact" in said
    assert "nothing else was changed" in said and not replaced_dir(store).exists(), said
    assert compact(capsys, str(store))["finished"] == []
    assert cli.main(["compact", str(store), "--no-progress"]) == 0
    assert capsys.readouterr().err.endswith("; nothing was written\n")
    shutil.rmtree(store)
    shutil.copytree(appended, replaced_dir(store))  # killed between the renames, the new store not finished
    building = building_dir(store)
    assert cli.main(["compact", str(replaced_dir(store)), "--output", str(building), "--no-progress"]) == 0
    (building / MANIFEST_FILE).unlink()
    result = compact(capsys, str(store))
    assert result["finished"] == [f"put the store a stopped run had set aside at {replaced_dir(store)} back in place",
                                  f"deleted what a compaction stopped before its swap left at {building}"]
    assert result["appends_before"] == 2 and not building.exists() and not replaced_dir(store).exists()


def test_verify_checks_each_jsonl_part_against_its_shard(appended: Path, tmp_path: Path) -> None:
    """A part naming another passage than its shard's row verified, was indexed, and `ask` failed on it at question
    time (hostile46 F9); an appended store's parts are in its appends' folders."""
    store = Path(shutil.copytree(appended, tmp_path / "store"))
    assert verify_store(store).ok
    part = sorted((store / APPENDS_DIR).glob("*/passages/jsonl/*.jsonl"))[0]
    shard, relative = part.stem.replace("part", "shard"), part.relative_to(store).as_posix()
    lines = part.read_text(encoding="utf-8").splitlines(keepends=True)
    first = json.loads(lines[0])
    part.write_text("".join([json.dumps({**first, "id": "ghost"}) + "\n", *lines[1:]]), encoding="utf-8")
    problems = verify_store(store).problems
    assert f"{relative}: line 1 names passage 'ghost', but row 0 of shard {shard} is {first['id']!r}" in problems
    part.write_text("".join(lines[:-1]), encoding="utf-8")
    problems = verify_store(store).problems
    assert f"{relative} has {len(lines) - 1} lines for the {len(lines)} rows of shard {shard}" in problems, problems
    # Its own id with other text: indexed as it was, and verify compares the index with the collection.
    part.write_text("".join([json.dumps({**first, "contents": "Tesla\nNikola Tesla"}) + "\n", *lines[1:]]),
                    encoding="utf-8")  # fmt: skip
    problems = verify_store(store).problems
    assert (f"{relative}: line 1 ({first['id']!r}) holds other contents than the title and text of row 0 of shard "
            f"{shard}") in problems, problems
