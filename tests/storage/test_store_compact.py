"""Compacting a store (storage/compact.py): the live rows of a store and its appends rewritten into new shards.

The compacted store must serve exactly what the old one served (the same ids, texts, tokens and the very same
decoded states, since the codes are copied, not encoded again), leave the superseded rows out, pass `verify`,
and refuse stores whose codes cannot move between shards unchanged.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dilstore.storage.append import commit_append, first_free_shard
from dilstore.storage.codebook import CODEBOOK_DIR, codebook_build, codebook_sample_tokens, write_codebook
from dilstore.storage.compact import compact_store
from dilstore.storage.encodings import train_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.format import ATTRIBUTES_KEY, append_dir
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.reader import open_store
from dilstore.storage.records import EncodedPassage, PassageRecord
from dilstore.storage.verify import verify_store
from dilstore.storage.writer import write_encoded_shard, write_shard
from tests.fixtures.store_fixtures import build_store, fingerprint_for, passage, scratch_dir

APPEND = "a1b2c3d4e5f60718"
COMPACTED = "0f1e2d3c4b5a6978"
DIMS = 8


def records(ids: list[str], seed: int, vectors: bool = False) -> list[PassageRecord]:
    """Random passages with these ids, states shaped (n, DIMS), and with `vectors` a random (DIMS,) vector each."""
    made = [passage(passage_id, int(np.random.default_rng([seed, i]).integers(1, 12)), (DIMS,),
                    np.random.default_rng([seed, i])) for i, passage_id in enumerate(ids)]  # fmt: skip
    if not vectors:
        return made
    return [dataclasses.replace(record, vector=np.random.default_rng([seed, i, 1]).standard_normal(DIMS).astype(
        np.float32)) for i, record in enumerate(made)]  # fmt: skip


def appended_store(root: Path, base: list[list[PassageRecord]], append: list[PassageRecord], *, encoding: str,
                   replace: bool = False, retire: tuple[str, ...] = ()) -> Path:
    """A store of `base` (one list per shard) and one committed append of `append`; with a 2bit/1bit encoding a
    store-wide codebook trained on all the records encodes every shard."""
    every = [record for shard in [*base, append] for record in shard]
    codebook = None
    if encoding in ("2bit", "1bit"):
        sample = np.concatenate([record.states for record in every])  # (N, d)
        codebook = train_codebook(encoding, sample)
        write_codebook(root / CODEBOOK_DIR, encoding, codebook, (DIMS,), sample_tokens=len(sample))
    for index, shard in enumerate(base):
        write_shard(root, index, shard, kind="dilbert", encoding=encoding, durable=False, codebook=codebook)
    root.mkdir(parents=True, exist_ok=True)  # a first build of no passage has no shard folder to make it
    finalize(root, fingerprint_for("dilbert", encoding), {"command": "test"})
    folder = root / append_dir(APPEND)
    write_shard(folder, first_free_shard(read_manifest(StoreLocation.parse(root))), append, kind="dilbert",
                encoding=encoding, durable=False, codebook=codebook, generation=APPEND)  # fmt: skip
    commit_append(root, APPEND, fingerprint_for("dilbert", encoding), replace=replace, retire=retire)
    return root


class AppendedCopies:
    """The two fp32 appended stores most tests here start from, each built once per module: "ab+c" (records a, b
    appended with c) and "a+b"; `copy` puts a copy of one where a test wants it (tests compact, swap and damage
    their copies)."""

    BUILDS = {"ab+c": (["a", "b"], ["c"]), "a+b": (["a"], ["b"])}

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def copy(self, name: str, target: Path) -> Path:
        """A copy at `target` of appended store `name`, built at the first copy asked for."""
        built = self.folder / name
        if not built.exists():
            base, append = self.BUILDS[name]
            appended_store(built, [records(base, 1)], records(append, 2), encoding="fp32")
        return Path(shutil.copytree(built, target))


@pytest.fixture(scope="module")
def appended(tmp_path_factory: pytest.TempPathFactory) -> AppendedCopies:
    return AppendedCopies(tmp_path_factory.mktemp("appended-templates"))


def served(store_path: Path) -> dict[str, tuple]:
    """Every passage the store serves: title, text, token ids, char spans, decoded states and vector, exactly."""
    with open_store(store_path) as store:
        ids = [store.shard(entry.index).id_at(row) for entry in store.manifest.shards for row in range(entry.passages)]
        live = [passage_id for passage_id in dict.fromkeys(ids) if passage_id in store]
        return {p.id: (p.title, p.text, p.token_ids.tolist(), p.char_spans.tolist(), np.asarray(p.states).tobytes(),
                       None if p.vector is None else p.vector.tobytes()) for p in store.fetch(live)}  # fmt: skip


def stored_codes(store_path: Path) -> dict[str, dict[str, bytes]]:
    """Every live passage's stored state arrays (codes, scales, centroid ids) as bytes: what compaction copies."""
    with open_store(store_path) as store:
        kept: dict[str, dict[str, bytes]] = {}
        for entry in store.manifest.shards:  # in order: a later row of an id (an append's --replace) wins
            shard = store.shard(entry.index)
            for row, encoded in enumerate(shard.encoded(list(range(entry.passages)))):
                kept[shard.id_at(row)] = {name: np.asarray(values).tobytes() for name, values in encoded.arrays.items()}
        return {passage_id: arrays for passage_id, arrays in kept.items() if passage_id in store}


def compact(source: Path, target: Path, shards: int):
    with open_store(source) as store:
        return compact_store(store, target, lambda passage_id: sum(map(ord, passage_id)) % shards,
                             generation=COMPACTED)  # fmt: skip


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    in_append=st.lists(st.sampled_from(["base", "append", "both"]), min_size=2, max_size=12),
    shards=st.integers(1, 4),
    encoding=st.sampled_from(["fp32", "fp16"]),
)
@example(in_append=["append", "append"], shards=1, encoding="fp32")  # a first build of no passage
def test_a_compacted_store_serves_exactly_what_the_appended_one_did(in_append: list[str], shards: int,
                                                                    encoding: str) -> None:
    ids = [f"p{i}" for i in range(len(in_append))]
    base_ids = [passage_id for passage_id, where in zip(ids, in_append, strict=True) if where != "append"]
    append_ids = [passage_id for passage_id, where in zip(ids, in_append, strict=True) if where != "base"] + ["new"]
    replaced = sum(where == "both" for where in in_append)
    with scratch_dir() as scratch:
        base = [records(base_ids[0::2], seed=1), records(base_ids[1::2], seed=2)]
        source = appended_store(Path(scratch) / "source", [shard for shard in base if shard],
                                records(append_ids, seed=3), encoding=encoding, replace=True)  # fmt: skip
        before = served(source)
        result = compact(source, Path(scratch) / "compacted", shards)
        assert served(Path(scratch) / "compacted") == before
        assert result.dropped_rows == replaced
        manifest = result.manifest
        assert manifest.passages == len(ids) + 1 and manifest.superseded_passages == 0 and manifest.appends == ()
        assert len(manifest.shards) <= shards and manifest.generation == COMPACTED
        assert all(entry.generation is None for entry in manifest.shards)
        report = verify_store(Path(scratch) / "compacted")
        assert report.ok, report.problems


@pytest.mark.parametrize("encoding", ["2bit", "1bit"])
def test_low_bit_codes_are_copied_with_the_store_codebook_not_encoded_again(encoding: str, tmp_path: Path) -> None:
    source = appended_store(tmp_path / "source", [records(["a", "b", "c"], 1), records(["d", "e"], 2)],
                            records(["b", "f"], 3), encoding=encoding, replace=True)  # fmt: skip
    before, codes = served(source), stored_codes(source)
    compact(source, tmp_path / "compacted", 2)
    assert stored_codes(tmp_path / "compacted") == codes  # bit for bit: the same codes, not encoded again
    # Decoded, they agree up to the rounding of the rotated decode's product, which depends on the rows decoded
    # together (README "compact"); the test's codebook of 70 tokens decoded exactly before small samples trained
    # fewer centroids than tokens (codes51 F1), so every token was its own centroid.
    after = served(tmp_path / "compacted")
    assert sorted(after) == sorted(before)
    for passage_id, row in before.items():
        assert after[passage_id][:4] == row[:4] and after[passage_id][5:] == row[5:], passage_id
        decoded, expected = (np.frombuffer(states[passage_id][4], dtype=np.float32) for states in (after, before))
        np.testing.assert_allclose(decoded, expected, rtol=0, atol=1e-5)
    assert shard_versions(tmp_path / "compacted") == shard_versions(source) == {3}  # rotated codes
    assert codebook_build(tmp_path / "compacted" / CODEBOOK_DIR)["generation"] == COMPACTED
    # The same codebook: it tells later appends the sample it was trained on, as the source's did (codes51 F1).
    counted = codebook_sample_tokens(source / CODEBOOK_DIR)
    assert counted is not None and codebook_sample_tokens(tmp_path / "compacted" / CODEBOOK_DIR) == counted
    report = verify_store(tmp_path / "compacted")
    assert report.ok, report.problems


def shard_versions(root: Path) -> set[int]:
    """The format versions the store's shards record (ROTATED_SHARD_VERSION for rotated 2bit/1bit codes)."""
    manifest = read_manifest(StoreLocation.parse(root))
    return {zarr.open_group(str(root / entry.directory), mode="r").attrs[ATTRIBUTES_KEY]["format_version"]
            for entry in manifest.shards}  # fmt: skip


def test_vectors_come_along_with_their_passages(tmp_path: Path) -> None:
    """EARL and Listformer stores keep a vector per passage, which rerank reads (review44 M3)."""
    source = appended_store(tmp_path / "source", [records(["a", "b", "c"], 1, vectors=True)],
                            records(["b", "d"], 2, vectors=True), encoding="fp16", replace=True)  # fmt: skip
    before = served(source)
    assert all(row[-1] is not None for row in before.values())
    compact(source, tmp_path / "compacted", 2)
    assert served(tmp_path / "compacted") == before


def test_retired_rows_are_left_out_and_superseded_rows_dropped(tmp_path: Path) -> None:
    source = appended_store(tmp_path / "source", [records(["a", "b", "c"], 1)], records(["b"], 2),
                            encoding="fp32", replace=True, retire=("c",))  # fmt: skip
    result = compact(source, tmp_path / "compacted", 1)
    assert sorted(served(tmp_path / "compacted")) == ["a", "b"]
    assert result.dropped_rows == 2 and result.source_appends == 1 and result.source_shards == 2
    assert result.manifest.creation["compacted_from"]["dropped_rows"] == 2


def test_more_live_rows_than_the_manifest_s_passages_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An id index whose list of superseded rows lost some (here: all) would bring a retired passage back to life
    in the compacted store: refused before any shard is written."""
    from dilstore.storage.id_index import Superseded
    from dilstore.storage.reader import Store

    source = appended_store(tmp_path / "source", [records(["a", "b", "c"], 1)], records(["d"], 2),
                            encoding="fp32", replace=True, retire=("c",))  # fmt: skip
    none = Superseded(np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.uint32))
    monkeypatch.setattr(Store, "superseded", lambda self: none)
    with pytest.raises(DilstoreError, match=r"4 live rows found for the manifest's 3 passages; run `dilstore verify`"):
        compact(source, tmp_path / "compacted", 1)
    assert list((tmp_path / "compacted").iterdir()) == []


def test_an_int8_store_and_shards_with_codebooks_of_their_own_are_refused(tmp_path: Path) -> None:
    int8 = appended_store(tmp_path / "int8", [records(["a", "b"], 1)], records(["c"], 2), encoding="int8")
    with pytest.raises(DilstoreError, match="int8 codes are scaled per shard"):
        compact(int8, tmp_path / "out8", 1)
    own = tmp_path / "own"
    write_shard(own, 0, records(["a", "b"], 1), kind="dilbert", encoding="2bit", durable=False)
    finalize(own, fingerprint_for("dilbert", "2bit"))
    with pytest.raises(DilstoreError, match="keep codebooks of their own"):
        compact(own, tmp_path / "out2", 1)
    assert not (tmp_path / "out8").exists() and not (tmp_path / "out2").exists()


def test_a_target_that_holds_a_store_is_refused(appended: AppendedCopies, tmp_path: Path) -> None:
    source = appended.copy("a+b", tmp_path / "source")
    compact(source, tmp_path / "compacted", 1)
    with pytest.raises(DilstoreError, match="holds a store already"):
        compact(source, tmp_path / "compacted", 1)


def test_a_target_that_holds_an_unfinished_store_s_shards_is_refused_and_left_as_it_was(
    appended: AppendedCopies, tmp_path: Path
) -> None:
    """A folder with shards/ but no manifest (a store whose build was stopped before finalize) is a store too: its
    shards are not written over, nor finalized into the compacted store."""
    source = appended.copy("a+b", tmp_path / "source")
    target = tmp_path / "unfinished"
    write_shard(target, 0, records(["x", "y"], 3), kind="dilbert", encoding="fp32", durable=False)
    before = {path: path.read_bytes() for path in target.rglob("*") if path.is_file()}
    with pytest.raises(DilstoreError, match="holds a store already"):
        compact(source, target, 1)
    assert {path: path.read_bytes() for path in target.rglob("*") if path.is_file()} == before


def encoded(passage_id: str, arrays: dict[str, np.ndarray]) -> EncodedPassage:
    n = len(next(iter(arrays.values())))
    return EncodedPassage(id=passage_id, title="", text="", token_ids=np.zeros(n, dtype=np.int32),
                          char_spans=np.full((n, 2), -1, dtype=np.int32), arrays=arrays)  # fmt: skip


def test_write_encoded_shard_names_the_passage_with_wrong_arrays_and_refuses_per_shard_codes(tmp_path: Path) -> None:
    write = {"kind": "dilbert", "encoding": "fp16", "state_shape": (DIMS,), "durable": False}
    with pytest.raises(DilstoreError, match=r"passage 'x': values must be float16 \(2, 8\), got float32"):
        write_encoded_shard(tmp_path, 0, [encoded("x", {"values": np.zeros((2, DIMS), np.float32)})], **write)
    with pytest.raises(DilstoreError, match=r"passage 'y': encoded arrays \['codes'\], this encoding stores"):
        write_encoded_shard(tmp_path, 0, [encoded("y", {"codes": np.zeros((2, DIMS), np.int8)})], **write)
    with pytest.raises(DilstoreError, match=r"int8 codes decode with arrays of their own shard \(channel_scales\)"):
        write_encoded_shard(tmp_path, 0, [encoded("z", {"codes": np.zeros((2, DIMS), np.int8),
                                                        "scales": np.ones(2, np.float32)})],
                            **{**write, "encoding": "int8"})  # fmt: skip
    written = write_encoded_shard(tmp_path, 0, [encoded("ok", {"values": np.ones((3, DIMS), np.float16)})], **write)
    assert written.passages == 1 and written.tokens == 3


def test_a_reader_opened_before_a_compaction_swapped_in_is_told_the_store_was_rebuilt(
    appended: AppendedCopies, tmp_path: Path
) -> None:
    """A shard it had not opened yet is gone with the old build: that read said "cannot open shard ...
    GroupNotFoundError", as if the store were damaged (compact44 L1)."""
    from dilstore.storage.reader import StoreChangedError
    from dilstore.storage.replacement import building_dir, swap_in

    source = appended.copy("ab+c", tmp_path / "store")
    reader = open_store(source)
    reader.fetch(["a"])  # shard 0 open; the append's shard 1 not yet
    compact(source, building_dir(source), 1)
    swap_in(source, building_dir(source))
    with pytest.raises(StoreChangedError, match=f"the store at {source} was rebuilt .*: open it again"):
        reader.fetch(["c"])
    reader.close()


def test_a_check_finds_a_store_rebuilt_though_every_file_the_reader_had_mapped_was_deleted(
    appended: AppendedCopies, tmp_path: Path
) -> None:
    """(conc54 F6) A server's copy of an appended store maps its id index under the append's folder; a later append
    deletes that folder and a compaction replaces the rest. Every file it had mapped was then gone, which a check
    takes for unchanged (the maps hold them whole), so `dilstore serve` said /health 200, "available again: its
    files are back as it was opened", while each request to a shard it had not opened got 503, and back."""
    from dilstore.storage.reader import StoreChangedError
    from dilstore.storage.replacement import building_dir, swap_in

    source = appended.copy("ab+c", tmp_path / "store")
    reader = open_store(source, check_files=True)
    assert reader.manifest.index.startswith("appends/")
    later = "b1c2d3e4f5061728"
    write_shard(source / append_dir(later), first_free_shard(read_manifest(StoreLocation.parse(source))),
                records(["d"], 3), kind="dilbert", encoding="fp32", durable=False, generation=later)  # fmt: skip
    commit_append(source, later, fingerprint_for("dilbert", "fp32"))
    reader.check_unchanged()  # an append: the same build, read as it was opened
    compact(source, building_dir(source), 1)
    swap_in(source, building_dir(source))
    with pytest.raises(StoreChangedError, match=f"the store at {source} was rebuilt .*: open it again"):
        reader.check_unchanged()
    reader.close()


@pytest.mark.parametrize("compressor", ["zstd", "blosc"])
def test_a_compressed_store_read_by_path_is_told_it_was_rebuilt_even_in_a_shard_it_has_open(
        compressor: str, tmp_path: Path) -> None:
    """zarr-python opens a chunk's file when it reads it: after a compaction swapped in, an open shard read the new
    build's files under the old names, "cannot be decoded (checksum) ... damaged, run `dilstore verify`"
    (review44 M1), or another passage's bytes where the sizes agreed."""
    from dilstore.storage.reader import StoreChangedError
    from dilstore.storage.replacement import building_dir, swap_in

    root = tmp_path / "store"
    shards = [records([f"a{i}" for i in range(6)], 1), records([f"b{i}" for i in range(6)], 2)]
    build_store(root, shards, compressor=compressor)
    reader = open_store(root)
    reader.fetch(["a0", "b0"])  # both shards open
    compact(root, building_dir(root), 1)
    swap_in(root, building_dir(root))
    with pytest.raises(StoreChangedError, match="was rebuilt"):
        reader.fetch(["a1", "b5"])
    reader.close()
    with open_store(root) as reopened:
        assert [passage.id for passage in reopened.fetch(["a1", "b5"])] == ["a1", "b5"]


def test_a_manifest_that_could_not_be_read_once_is_looked_at_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that failed to read the rebuilt store's manifest once took it as seen and went on reading the new
    build's files under the old names, with no error (review44b L1)."""
    from dilstore.storage.location import StoreLocation as Location
    from dilstore.storage.reader import StoreChangedError
    from dilstore.storage.replacement import building_dir, swap_in

    root = tmp_path / "store"
    build_store(root, [records([f"a{i}" for i in range(6)], 1), records([f"b{i}" for i in range(6)], 2)],
                compressor="zstd")  # fmt: skip
    reader = open_store(root)
    reader.fetch(["a0", "b0"])
    compact(root, building_dir(root), 1)
    swap_in(root, building_dir(root))
    real = Location.read_bytes
    failing = iter([True])

    def read_bytes(self: Location, relative: str, at_most: int | None = None) -> bytes:
        if next(failing, False):
            raise OSError("Too many open files")
        return real(self, relative, at_most)

    monkeypatch.setattr(Location, "read_bytes", read_bytes)
    try:
        reader.fetch(["a1"])  # the manifest could not be read: nothing proves a rebuild yet
    except StoreChangedError:
        pass  # the read itself failed, and the manifest, read again, named the new build
    with pytest.raises(StoreChangedError, match="was rebuilt"):
        reader.fetch(["a2"])
    reader.close()


def test_a_full_disk_while_compacting_names_the_target(
    appended: AppendedCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zarr's writes name no file: "No space left on device" alone did not say which disk filled (full49 F4)."""
    from dilstore.storage import compact as compact_module

    def full_disk(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    source = appended.copy("a+b", tmp_path / "source")
    monkeypatch.setattr(compact_module, "write_encoded_shard", full_disk)
    with pytest.raises(OSError) as raised:
        compact(source, tmp_path / "compacted", 1)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(tmp_path / "compacted"))


def test_a_compaction_that_runs_out_of_room_copying_the_bm25_index_says_so_and_leaves_the_store(
    appended: AppendedCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The room check counted the store's live rows, not the BM25 index that comes along; a compaction it let
    through failed copying the index, and `dilstore compact` printed shutil.Error's list of (source, destination,
    error) tuples, one for every index file, as its error line (disk56 F3). Now the check counts the index, and a
    disk that fills anyway is one line naming the file, the store left as it was."""
    import json
    import shutil

    from dilstore.reader.retrieval import INDEX_RECORD, bm25_index_dir, indexed_state
    from dilstore.runners import cli, cmd_compact
    from dilstore.storage import file_errors
    from dilstore.storage.format import MANIFEST_FILE
    from dilstore.storage.replacement import building_dir

    store = appended.copy("ab+c", tmp_path / "store")
    index = bm25_index_dir(store)
    index.mkdir()
    (index / "segments_1").write_bytes(b"lucene" * 20_000)  # 120 kB
    (index / INDEX_RECORD).write_text(json.dumps(indexed_state(read_manifest(StoreLocation.parse(store)))))
    rows = cmd_compact._footprint(store)["bytes"]
    manifest = (store / MANIFEST_FILE).read_bytes()
    free = shutil.disk_usage(tmp_path)._replace(free=rows + 60_000)
    with monkeypatch.context() as patch:
        patch.setattr(cmd_compact.shutil, "disk_usage", lambda _: free)
        assert cli.main(["compact", str(store), "--no-progress"]) == 2
    assert "(the store's live rows and its BM25 index), and its disk has" in capsys.readouterr().err

    real_copy = shutil.copy2

    def full(source: object, destination: object, **options: object) -> None:
        if str(destination).endswith("segments_1"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(source), None, str(destination))
        real_copy(source, destination, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(file_errors.shutil, "copy2", full)
    assert cli.main(["compact", str(store), "--no-progress"]) == 2
    building = building_dir(store)
    assert capsys.readouterr().err == (
        f"dilstore compact: error: cannot write the compacted store at {building}: No space left on device "
        f"({building / 'bm25' / 'segments_1'}); {store} is as it was: free space on that disk, or give --output on "
        "another disk\n")  # fmt: skip
    assert (store / MANIFEST_FILE).read_bytes() == manifest and not building.exists() and verify_store(store).ok


def test_a_compaction_into_output_flushes_the_index_it_copied(
    appended: AppendedCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`compact --output` copied the BM25 index (and the user's own files) and never flushed them: an I/O error of
    their write-back went unseen, and the command said the compaction was done (disk56 F8). In place, the swap
    flushed them already."""
    import json

    from dilstore.reader.retrieval import INDEX_RECORD, bm25_index_dir, indexed_state
    from dilstore.runners import cli
    from dilstore.storage import durability

    store = appended.copy("ab+c", tmp_path / "store")
    index = bm25_index_dir(store)
    index.mkdir()
    (index / "segments_1").write_bytes(b"lucene")
    (index / INDEX_RECORD).write_text(json.dumps(indexed_state(read_manifest(StoreLocation.parse(store)))))
    output = tmp_path / "copy"

    def failing_write_back(descriptor: int) -> None:
        if os.readlink(f"/proc/self/fd/{descriptor}") == str(output / "bm25" / "segments_1"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(durability.os, "fsync", failing_write_back)
    assert cli.main(["compact", str(store), "--output", str(output), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"dilstore compact: error: Input/output error: {output / 'bm25' / 'segments_1'}\n"
    assert not output.exists() and verify_store(store).ok


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_compaction_short_of_room_for_its_shards_says_so_once_for_each_kind_of_limit(
    appended: AppendedCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    code: int,
) -> None:
    """A full disk, a full quota and a file size limit met while writing the shards are each one line saying that
    STORE is as it was (mut56b M29), with what to do: free space for a disk or quota, raise the limit for a file size
    limit (read56 F3); and the error that names the building folder itself does not name it twice, "at B: No space
    left on device (B)" (mut56b M31)."""
    from dilstore.runners import cli
    from dilstore.storage import compact as compact_module
    from dilstore.storage.file_errors import FILE_SIZE_ADVICE
    from dilstore.storage.format import MANIFEST_FILE
    from dilstore.storage.replacement import building_dir

    def no_room(*_: object, **__: object) -> None:
        raise OSError(code, os.strerror(code))

    store = appended.copy("ab+c", tmp_path / "store")
    manifest = (store / MANIFEST_FILE).read_bytes()
    monkeypatch.setattr(compact_module, "write_encoded_shard", no_room)
    assert cli.main(["compact", str(store), "--no-progress"]) == 2
    building = building_dir(store)
    advice = FILE_SIZE_ADVICE if code == errno.EFBIG else "free space on that disk, or give --output on another disk"
    assert capsys.readouterr().err == (
        f"dilstore compact: error: cannot write the compacted store at {building}: {os.strerror(code)}; {store} is "
        f"as it was: {advice}\n")  # fmt: skip
    assert (store / MANIFEST_FILE).read_bytes() == manifest and not building.exists()


@pytest.mark.parametrize("failing", ["run-summary.json", "notes/scores.txt", "rejected/bad.jsonl"])
def test_a_file_compact_copies_that_a_full_disk_refuses_is_named_where_it_was_written(
    appended: AppendedCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    failing: str,
) -> None:
    """The first build's run-summary.json, a folder of the user's own and the store's dead letters are copied with
    `copy_file`/`copy_tree`: a full disk is named by the file it could not write. shutil's own copy named the source,
    the store's file (mut56b M42), and shutil.copytree raised a list of every failed file as text (mut56b M41, M43)."""
    import shutil

    from dilstore.pipelines.spec_file import SUMMARY_FILE
    from dilstore.runners import cli
    from dilstore.storage.format import MANIFEST_FILE
    from dilstore.storage.passage_files import REJECTED_DIR
    from dilstore.storage.replacement import building_dir

    store = appended.copy("ab+c", tmp_path / "store")
    (store / SUMMARY_FILE).write_text("{}\n")
    (store / "notes").mkdir()
    (store / "notes" / "scores.txt").write_text("0.5\n")
    (store / REJECTED_DIR).mkdir(exist_ok=True)
    (store / REJECTED_DIR / "bad.jsonl").write_text("{}\n")
    manifest = (store / MANIFEST_FILE).read_bytes()
    building = building_dir(store)
    real_copyfile = shutil.copyfile

    def full(source: object, destination: object, **options: object) -> object:
        if str(destination) == str(building / failing):  # sendfile's error names both files, the source first
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(source), None, str(destination))
        return real_copyfile(source, destination, **options)  # type: ignore[call-overload]

    monkeypatch.setattr(shutil, "copyfile", full)
    assert cli.main(["compact", str(store), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"dilstore compact: error: cannot write the compacted store at {building}: No space left on device "
        f"({building / failing}); {store} is as it was: free space on that disk, or give --output on another "
        "disk\n")  # fmt: skip
    assert (store / MANIFEST_FILE).read_bytes() == manifest and not building.exists()
