"""Appending shards to a finalized store (storage/append.py, STORE_FORMAT.md §13), without Beam or a model.

A store of A followed by an append of B must read exactly like the store of
A ∪ B written in one go; duplicates are refused unless replace, which makes the
old rows unreachable; a reader opened before the append keeps its store; and
a commit that dies before the manifest leaves the old store as it was and can
be run again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dilstore.runners.cmd_store import format_info
from dilstore.storage import append as append_module
from dilstore.storage import reader as reader_module
from dilstore.storage.append import AppendMismatchError, commit_append, first_free_shard, remove_leftovers
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import (
    APPENDED_FORMAT_VERSION,
    APPENDS_DIR,
    INDEX_DIR,
    MANIFEST_FILE,
    TMP_PREFIX,
    StoreFormatError,
    append_dir,
)
from dilstore.storage.id_index import DuplicatePassageIdError, row_keys
from dilstore.storage.info import store_info
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import manifest_json, read_manifest
from dilstore.storage.reader import MissingPassagesError, open_store
from dilstore.storage.records import PassageRecord
from dilstore.storage.verify import verify_store
from dilstore.storage.writer import write_shard
from tests.fixtures.store_fixtures import build_store, fingerprint_for, passage, scratch_dir

GENERATION = "a1b2c3d4e5f60718"


def records(ids: list[str], seed: int = 0) -> list[PassageRecord]:
    """Random passages with these ids (the same id and seed give the same passage)."""
    return [passage(passage_id, int(np.random.default_rng([seed, i]).integers(0, 12)), (8,),
                    np.random.default_rng([seed, i])) for i, passage_id in enumerate(ids)]


class StoreCopies:
    """Stores of `records(ids)` in one shard, each built once per module: `copy` puts a copy of one where a test
    wants it (tests append to, damage and commit into their copies)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.built: dict[tuple[str, ...], Path] = {}

    def copy(self, ids: list[str], target: Path) -> Path:
        """A copy at `target` of the fp32 store of `records(ids)` (one shard, finalized)."""
        key = tuple(ids)
        if key not in self.built:
            self.built[key] = build_store(self.folder / f"store-{len(self.built)}", [records(ids)])
        return Path(shutil.copytree(self.built[key], target))


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> StoreCopies:
    return StoreCopies(tmp_path_factory.mktemp("append-templates"))


def write_append(root: Path, shards: list[list[PassageRecord]], generation: str = GENERATION,
                 encoding: str = "fp32") -> None:
    """Write `shards` into the store's append folder for `generation`, numbered from its first free shard."""
    first = first_free_shard(read_manifest(StoreLocation.parse(root)))
    (root / append_dir(generation)).mkdir(parents=True, exist_ok=True)
    for offset, shard in enumerate(shards):
        write_shard(root / append_dir(generation), first + offset, shard, kind="dilbert", encoding=encoding,
                    durable=False, generation=generation)


def contents(store_path: Path) -> dict[str, tuple]:
    """Every id the store's index reaches, with its title, text, token ids and states."""
    with open_store(store_path) as store:
        ids = [store.shard(entry.index).id_at(row) for entry in store.manifest.shards
               for row in range(entry.passages)]
        live = [passage_id for passage_id in dict.fromkeys(ids) if passage_id in store]
        return {p.id: (p.title, p.text, p.token_ids.tolist(), np.asarray(p.states).tolist())
                for p in store.fetch(live)}


def fetched(store_path: Path, ids: list[str]) -> dict[str, tuple]:
    with open_store(store_path) as store:
        return {p.id: (p.text, np.asarray(p.states).tolist()) for p in store.fetch(ids)}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(split=st.lists(st.booleans(), min_size=2, max_size=14), cut=st.integers(1, 3))
def test_store_of_a_then_append_of_b_reads_like_the_store_of_a_and_b(split: list[bool], cut: int) -> None:
    ids = [f"p{i}" for i in range(len(split))]
    every = records(ids)
    a = [record for record, in_b in zip(every, split, strict=True) if not in_b]
    b = [record for record, in_b in zip(every, split, strict=True) if in_b]
    with scratch_dir() as scratch:
        whole = build_store(Path(scratch) / "whole", [every])
        appended = build_store(Path(scratch) / "appended", [a] if a else [])
        write_append(appended, [b[i::cut] for i in range(cut) if b[i::cut]])
        commit_append(appended, GENERATION, fingerprint_for())
        assert contents(appended) == contents(whole)
        assert verify_store(appended).ok, verify_store(appended).problems
        assert len(open_store(appended)) == len(every)
        assert store_info(appended)["passages"] == store_info(whole)["passages"]
        assert store_info(appended)["tokens"] == store_info(whole)["tokens"]


def test_an_append_writes_only_new_files_and_moves_the_index(tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", [records(["a", "b"]), records(["c"], seed=1)])
    before = {path: path.read_bytes() for path in store.rglob("*") if path.is_file() and INDEX_DIR not in path.parts}
    write_append(store, [records(["d", "e"], seed=2)])
    manifest = commit_append(store, GENERATION, fingerprint_for(), {"command": "test append"})
    for path, data in before.items():
        if path.name != MANIFEST_FILE:
            assert path.read_bytes() == data, f"{path} was rewritten"
    assert manifest.format_version == APPENDED_FORMAT_VERSION
    assert manifest.index == f"{append_dir(GENERATION)}/{INDEX_DIR}"
    assert not (store / INDEX_DIR).exists()
    assert [entry.index for entry in manifest.shards] == [0, 1, 2]
    assert manifest.shards[2].directory == f"{append_dir(GENERATION)}/shards/shard-00002"
    assert manifest.appends[0]["command"] == "test append" and manifest.appends[0]["passages"] == 2
    assert verify_store(store).ok


@pytest.mark.parametrize("back", [1, 2])
def test_an_appended_shard_numbered_as_one_of_the_store_s_is_refused_and_the_store_is_untouched(
    tmp_path: Path, back: int
) -> None:
    """Appended shards start at the first free index: one numbered as the store's last shard (or an earlier one)
    would stand for it in the manifest."""
    store = build_store(tmp_path / "store", [records(["a", "b"]), records(["c"], seed=1)])
    manifest_bytes = (store / MANIFEST_FILE).read_bytes()
    first = first_free_shard(read_manifest(StoreLocation.parse(store)))
    (store / append_dir(GENERATION)).mkdir(parents=True)
    write_shard(store / append_dir(GENERATION), first - back, records(["d"], seed=2), kind="dilbert",
                encoding="fp32", durable=False, generation=GENERATION)  # fmt: skip
    with pytest.raises(DilstoreError, match=f"shard {first - back} would collide with the store's; appended shards "
                                            f"start at {first}"):  # fmt: skip
        commit_append(store, GENERATION, fingerprint_for())
    assert (store / MANIFEST_FILE).read_bytes() == manifest_bytes
    assert sorted(contents(store)) == ["a", "b", "c"]


def test_a_duplicate_id_is_refused_naming_it_and_the_store_is_untouched(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a", "b", "c"], tmp_path / "store")
    manifest_bytes = (store / MANIFEST_FILE).read_bytes()
    write_append(store, [records(["x", "b", "c"], seed=1)])
    with pytest.raises(DuplicatePassageIdError, match=r"2 passage ids of the append are already in store .*'b', 'c'"):
        commit_append(store, GENERATION, fingerprint_for())
    assert (store / MANIFEST_FILE).read_bytes() == manifest_bytes
    assert verify_store(store).ok
    assert "x" not in open_store(store)


def test_a_duplicate_id_within_the_append_is_refused_even_with_replace(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["x"], seed=1), records(["x"], seed=2)])
    with pytest.raises(DuplicatePassageIdError, match="'x'"):
        commit_append(store, GENERATION, fingerprint_for(), replace=True)


def test_replace_makes_the_old_row_unreachable_everywhere(tmp_path: Path) -> None:
    old = records(["a", "b", "c"])
    store = build_store(tmp_path / "store", [old])
    new_b = records(["b", "d"], seed=7)
    write_append(store, [new_b])
    manifest = commit_append(store, GENERATION, fingerprint_for(), replace=True)
    assert fetched(store, ["b"]) == {"b": (new_b[0].text, np.asarray(new_b[0].states).tolist())}
    assert manifest.passages == 4 and manifest.superseded_passages == 1
    assert manifest.tokens == sum(len(r.token_ids) for r in (old[0], old[2], *new_b))
    assert manifest.superseded_tokens == len(old[1].token_ids)
    with open_store(store) as opened:
        assert len(opened) == 4
        assert opened.superseded().shards.tolist() == [0] and opened.superseded().rows.tolist() == [1]
    info = store_info(store)
    assert info["passages"] == 4 and info["superseded"] == {"passages": 1, "tokens": len(old[1].token_ids)}
    report = verify_store(store)
    assert report.ok, report.problems
    assert report.passages == 4


def test_plain_zarr_reads_an_appended_store_by_the_steps_of_store_format_md(tmp_path: Path) -> None:
    """An appended int8 store with a replaced id, read with json, hashlib, zarr and numpy only, as STORE_FORMAT.md
    says (§4 int8, §6, §7, §13): the manifest names the index in use and each appended shard's folder, the index
    reaches the live rows and lists the superseded one apart, and the hand decode equals dilstore's read (interop59:
    the plain-zarr tests read only fresh fp32 and 2bit/1bit stores, so nothing held those sections to the code)."""
    store = build_store(tmp_path / "store", [records(["a", "b", "c"])], encoding="int8")
    write_append(store, [records(["b", "d"], seed=7)], encoding="int8")
    commit_append(store, GENERATION, fingerprint_for(encoding="int8"), replace=True)
    manifest = json.loads((store / MANIFEST_FILE).read_text(encoding="utf-8"))
    signed = {key: value for key, value in manifest.items() if key != "checksum"}
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert hashlib.sha256(canonical).hexdigest() == manifest["checksum"]
    folders = {entry["index"]: store / entry.get("path", f"shards/{entry['name']}") for entry in manifest["shards"]}
    index = zarr.open_group(store / manifest["index"], mode="r")
    hashes = index["hashes"][...]
    live = list(zip(index["shards"][...].tolist(), index["rows"][...].tolist(), strict=True))
    superseded = list(zip(index["superseded_shards"][...].tolist(), index["superseded_rows"][...].tolist(),
                          strict=True))
    assert superseded == [(0, 1)] and len(live) == manifest["passages"] == 4 and (hashes[1:] >= hashes[:-1]).all()
    found = {}
    with open_store(store) as opened:
        for (shard, row), hashed in zip(live, hashes.tolist(), strict=True):
            group = zarr.open_group(folders[shard], mode="r")
            ids, id_offsets = group["passages/ids/bytes"][...], group["passages/ids/offsets"][...]
            passage_id = bytes(ids[id_offsets[row] : id_offsets[row + 1]]).decode("utf-8")
            digest = hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest()
            assert int.from_bytes(digest, "little") == hashed
            start, stop = group["tokens/offsets"][row : row + 2]
            codes = group["states/codes"][start:stop].astype(np.float32)  # (n, d)
            scales = group["states/scales"][start:stop]  # (n,)
            decoded = codes * (scales[:, None] * group["states/channel_scales"][...])  # (n, d): q · (s · C)
            stored = opened.fetch([passage_id])[0]
            np.testing.assert_array_equal(decoded, stored.states)
            found[passage_id] = shard
    assert found == {"a": 0, "c": 0, "b": 1, "d": 1}  # b from the append, its first row superseded


def test_info_counts_superseded_states_on_their_own_not_as_fixed_bytes(tmp_path: Path) -> None:
    """A replacing append and a plain one of passages of the same sizes write the same state bytes: the fixed
    bytes (padding, chunk indexes) agree, and the superseded row's states are their own entry."""
    infos = {}
    for name, ids, replace in (("replaced", ["b", "d"], True), ("plain", ["x", "d"], False)):
        store = build_store(tmp_path / name, [records(["a", "b", "c"])])
        write_append(store, [records(ids, seed=7)])
        commit_append(store, GENERATION, fingerprint_for(), replace=replace)
        infos[name] = store_info(store)
    replaced, plain = infos["replaced"], infos["plain"]
    marginal = replaced["state_bytes_per_token_marginal"]
    assert replaced["bytes_by_part"]["states"] == plain["bytes_by_part"]["states"]
    assert replaced["state_bytes"]["superseded"] == replaced["superseded"]["tokens"] * marginal > 0
    assert plain["state_bytes"]["superseded"] == 0
    assert replaced["state_bytes"]["fixed"] == plain["state_bytes"]["fixed"]
    assert sum(replaced["state_bytes"].values()) == replaced["bytes_by_part"]["states"]
    table = format_info(replaced)
    tokens = replaced["superseded"]["tokens"]
    assert f"appends      1; 1 passages ({tokens} tokens) superseded by --replace" in table, table
    assert f" + {replaced['state_bytes']['superseded']} B superseded + " in table, table


def test_info_counts_an_appends_files_in_the_part_their_path_has_at_the_root(
    stores: StoreCopies, tmp_path: Path
) -> None:
    """`info` counts a file under `appends/<generation>/` in the part of the same path at the store's root: the
    appended shard's states, tokens and passages are not "other". The reference sorts every file by its path."""
    store = stores.copy(["a", "b", "c"], tmp_path / "store")
    write_append(store, [records(["x", "d"], seed=7)])
    commit_append(store, GENERATION, fingerprint_for())
    expected = dict.fromkeys(("states", "tokens", "passages", "index", "metadata", "other"), 0)
    appended = 0
    for file in (path for path in store.rglob("*") if path.is_file()):
        parts = file.relative_to(store).parts
        appended += parts[0] == APPENDS_DIR and "states" in parts
        inside = parts[2:] if parts[0] == APPENDS_DIR else parts
        if inside[-1] in ("zarr.json", MANIFEST_FILE):
            part = "metadata"
        elif inside[0] == INDEX_DIR:
            part = "index"
        elif inside[0] == "shards" and inside[2] in ("states", "tokens", "passages"):
            part = inside[2]
        else:
            part = "other"
        expected[part] += file.stat().st_size
    info = store_info(store)
    assert appended > 0
    assert info["bytes_by_part"] == expected
    assert info["bytes_per_token"]["dilbert"] == round(expected["states"] / info["tokens"], 3)


@settings(max_examples=50, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), min_size=1, max_size=30,
                      unique=True))
def test_row_keys_are_distinct_for_distinct_rows_and_sort_by_shard_then_row(pairs: list[tuple[int, int]]) -> None:
    """An append drops old index entries by their (shard, row) key: two rows that share a key would be superseded
    together (row 65536 of shard 0 with row 0 of shard 1 under a 16-bit shift). The keys must be one per pair,
    ordered as the pairs are, for rows up to 2**32 - 1 (the index's uint32)."""
    shards = np.array([shard for shard, _ in pairs], dtype=np.uint32)
    rows = np.array([row for _, row in pairs], dtype=np.uint32)
    keys = row_keys(shards, rows).tolist()
    assert len(set(keys)) == len(pairs)
    assert [pairs[i] for i in np.argsort(keys, kind="stable")] == sorted(pairs)
    assert row_keys(np.array([0, 1], dtype=np.uint32), np.array([65536, 0], dtype=np.uint32)).tolist() == [65536, 2**32]


def test_verify_still_checks_the_superseded_rows_files(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a", "b"], tmp_path / "store")
    write_append(store, [records(["b"], seed=3)])
    commit_append(store, GENERATION, fingerprint_for(), replace=True)
    states = store / "shards" / "shard-00000" / "states" / "values" / "c" / "0" / "0"  # (T, d): c/0/0
    data = bytearray(states.read_bytes())
    data[0] ^= 0xFF
    states.write_bytes(bytes(data))
    assert any("SHA-256 differs" in problem for problem in verify_store(store).problems)


def test_a_second_append_replaces_rows_of_the_first(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a", "b"], tmp_path / "store")
    write_append(store, [records(["b", "c"], seed=1)], generation="1" * 16)
    commit_append(store, "1" * 16, fingerprint_for(), replace=True)
    latest = records(["c", "a"], seed=2)
    write_append(store, [latest], generation="2" * 16)
    manifest = commit_append(store, "2" * 16, fingerprint_for(), replace=True)
    assert manifest.passages == 3 and manifest.superseded_passages == 3  # b, then c and a
    assert manifest.index == f"{append_dir('2' * 16)}/{INDEX_DIR}"
    assert not (store / append_dir("1" * 16) / INDEX_DIR).exists()
    assert fetched(store, ["c"])["c"][0] == latest[0].text
    assert verify_store(store).ok, verify_store(store).problems


@pytest.mark.parametrize(("kind", "encoding", "max_length", "named"), [
    ("earl-s1", "fp32", 512, "kind: store 'dilbert', this run 'earl-s1'"),
    ("dilbert", "fp16", 512, "encoding: store 'fp32', this run 'fp16'"),
    ("dilbert", "fp32", 256, "max_length: store 512, this run 256"),
])
def test_other_settings_are_refused_in_one_line_naming_them(
    stores: StoreCopies, tmp_path: Path, kind: str, encoding: str, max_length: int, named: str
) -> None:
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)])
    with pytest.raises(AppendMismatchError) as raised:
        commit_append(store, GENERATION, fingerprint_for(kind, encoding, max_length))
    assert named in str(raised.value) and "\n" not in str(raised.value)


def test_another_model_is_refused_naming_its_weights(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a"], tmp_path / "store")
    other = fingerprint_for()
    other = type(other)(**{**other.to_dict(), "weights_sha256": "f" * 64})
    with pytest.raises(AppendMismatchError, match="weights_sha256: store wwwwwwwwwwww…, this run ffffffffffff…"):
        commit_append(store, GENERATION, other)


@pytest.mark.parametrize(("read_path", "check_files"), [("mmap", False), ("mmap", True), ("zarr", False)])
def test_a_reader_opened_before_the_append_keeps_reading_the_old_store(tmp_path: Path, read_path: str,
                                                                       check_files: bool) -> None:  # fmt: skip
    """With `check_files` (serve) too: the append deletes the index the reader mapped, which it reads on safely."""
    old = records(["a", "b", "c"])
    store = build_store(tmp_path / "store", [old[:2], old[2:]])
    before = open_store(store, read_path=read_path, check_files=check_files)
    before.fetch(["a"])  # shard 0 open before the append, shard 1 opened after
    write_append(store, [records(["b", "z"], seed=5)])
    commit_append(store, GENERATION, fingerprint_for(), replace=True)
    assert [p.text for p in before.fetch(["a", "b", "c"])] == [r.text for r in old]
    assert np.array_equal(np.asarray(before.fetch(["b"])[0].states), old[1].states)
    with pytest.raises(MissingPassagesError):
        before.fetch(["z"])
    assert len(before) == 3
    after = open_store(store, read_path=read_path)
    assert len(after) == 4 and after.fetch(["b"])[0].text != old[1].text


def test_a_commit_killed_before_the_manifest_leaves_the_old_store_and_a_rerun_completes(
    stores: StoreCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores.copy(["a", "b"], tmp_path / "store")
    reference = stores.copy(["a", "b"], tmp_path / "reference")
    manifest_bytes = (store / MANIFEST_FILE).read_bytes()
    for target in (store, reference):
        write_append(target, [records(["b", "c"], seed=4)])

    def crash(*_: object) -> None:
        raise KeyboardInterrupt("killed before the commit")

    monkeypatch.setattr(append_module, "write_manifest", crash)
    with pytest.raises(KeyboardInterrupt):
        commit_append(store, GENERATION, fingerprint_for(), replace=True)
    assert (store / MANIFEST_FILE).read_bytes() == manifest_bytes
    assert verify_store(store).ok, verify_store(store).problems  # the append folder is only untracked
    assert "c" not in open_store(store)
    monkeypatch.undo()
    commit_append(store, GENERATION, fingerprint_for(), replace=True)
    commit_append(reference, GENERATION, fingerprint_for(), replace=True)
    assert contents(store) == contents(reference)
    assert verify_store(store).ok


def test_a_committed_append_cannot_be_committed_twice(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)])
    commit_append(store, GENERATION, fingerprint_for())
    with pytest.raises(Exception, match="committed already"):
        commit_append(store, GENERATION, fingerprint_for())


def test_verify_reports_superseded_counts_that_do_not_match_the_index(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a", "b"], tmp_path / "store")
    write_append(store, [records(["b"], seed=3)])
    manifest = commit_append(store, GENERATION, fingerprint_for(), replace=True)
    edited = dataclasses.replace(manifest, superseded_passages=0, passages=manifest.passages + 1)
    (store / MANIFEST_FILE).write_bytes(manifest_json(edited))  # with a valid checksum of its own
    problems = verify_store(store).problems
    assert any("superseded_shards" in problem for problem in problems), problems


def test_a_reader_opening_while_an_append_commits_retries_with_the_new_manifest(
    stores: StoreCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = stores.copy(["a", "b"], tmp_path / "store")
    stale = read_manifest(StoreLocation.parse(store))  # read just before the commit ...
    write_append(store, [records(["c"], seed=1)])
    commit_append(store, GENERATION, fingerprint_for())  # ... which then removes the index it names
    real = reader_module.read_manifest
    answers = iter([stale])
    monkeypatch.setattr(reader_module, "read_manifest", lambda location: next(answers, None) or real(location))
    with open_store(store) as opened:
        assert len(opened) == 3 and "c" in opened


def test_verify_during_a_commit_says_the_store_changed_not_that_it_is_damaged(
    stores: StoreCopies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append committing between verify's manifest read and its id-index check made verify report a sound store
    as damaged ("id index: cannot be read: GroupNotFoundError"; crash36 5)."""
    import dilstore.storage.verify as verify

    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)])
    check_index = verify._check_index

    def commit_first(*args, **kwargs):
        commit_append(store, GENERATION, fingerprint_for())  # the commit lands here
        return check_index(*args, **kwargs)

    monkeypatch.setattr(verify, "_check_index", commit_first)
    assert verify_store(store).problems == [
        "the store changed while it was verified (an append committed): run verify again"
    ]
    monkeypatch.setattr(verify, "_check_index", check_index)
    assert verify_store(store).ok
    real = verify.read_manifest
    reads = []

    def rebuilt_meanwhile(location):  # the second read, after the checks, finds another build (--overwrite)
        reads.append(location)
        manifest = real(location)
        return manifest if len(reads) == 1 else dataclasses.replace(manifest, generation="0" * 16)

    monkeypatch.setattr(verify, "read_manifest", rebuilt_meanwhile)
    monkeypatch.setattr(verify, "_check_index", lambda *args, **kwargs: (_ for _ in ()).throw(OSError("gone")))
    assert verify_store(store).problems == [
        "the store changed while it was verified (it was rebuilt: another build): run verify again"
    ]  # it was called an append (conc39 L3)


def test_leftovers_of_killed_appends_and_replaced_indexes_are_removed(stores: StoreCopies, tmp_path: Path) -> None:
    store = stores.copy(["a"], tmp_path / "store")
    shutil.copytree(store / INDEX_DIR, tmp_path / "old-index")
    write_append(store, [records(["b"], seed=1)])
    manifest = commit_append(store, GENERATION, fingerprint_for())
    shutil.copytree(tmp_path / "old-index", store / INDEX_DIR)  # as a kill right after the commit leaves it
    for name in ("0" * 16, "f" * 16):
        write_append(store, [records(["z"], seed=2)], generation=name)  # killed appends, never committed
    report = verify_store(store)
    assert report.ok, report.problems  # uncommitted appends and the replaced index are untracked, not problems
    assert any(path.startswith(f"{INDEX_DIR}/") for path in report.untracked)
    notes = store / APPENDS_DIR / "my-notes"  # an operator's: the next append deleted it (storage43 L3)
    notes.mkdir()
    (notes / "todo.txt").write_text("important")
    removed = remove_leftovers(store, manifest, keep=("f" * 16,))
    assert sorted(removed) == [append_dir("0" * 16), INDEX_DIR]
    assert (notes / "todo.txt").read_text() == "important"
    shutil.rmtree(notes)
    assert (store / append_dir("f" * 16)).is_dir() and (store / append_dir(GENERATION)).is_dir()
    assert verify_store(store).ok and len(open_store(store)) == 2


def test_a_second_append_s_replaced_index_left_by_a_kill_is_untracked_and_then_removed(
    stores: StoreCopies, tmp_path: Path
) -> None:
    """A kill between a second append's commit and its cleanup left the first append's index, which verify called
    damage ("inside the store's data but not in the manifest"), though no reader opens it (crash36 2)."""
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)], generation="1" * 16)
    commit_append(store, "1" * 16, fingerprint_for())
    first_index = store / append_dir("1" * 16) / INDEX_DIR
    shutil.copytree(first_index, tmp_path / "first-index")
    write_append(store, [records(["c"], seed=2)], generation="2" * 16)
    manifest = commit_append(store, "2" * 16, fingerprint_for())
    shutil.copytree(tmp_path / "first-index", first_index)  # as the kill leaves it
    report = verify_store(store)
    assert report.ok, report.problems
    assert any(path.startswith(f"{append_dir('1' * 16)}/{INDEX_DIR}/") for path in report.untracked)
    assert remove_leftovers(store, manifest) == [f"{append_dir('1' * 16)}/{INDEX_DIR}"]


def test_an_id_index_a_kill_left_half_made_inside_an_append_s_folder_is_removed(
    stores: StoreCopies, tmp_path: Path
) -> None:
    """A kill while an append wrote its id index left appends/G/.tmp-index-*; the re-run committed beside it, and
    verify failed for good, as no cleanup looked inside an append's folder (crash36 1)."""
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)])
    half_made = store / append_dir(GENERATION) / f"{TMP_PREFIX}{INDEX_DIR}-{'9' * 32}"
    shutil.copytree(store / INDEX_DIR, half_made)
    set_aside = store / append_dir(GENERATION) / f"{TMP_PREFIX}old-{INDEX_DIR}-{'8' * 32}"
    shutil.copytree(store / INDEX_DIR, set_aside)
    manifest = commit_append(store, GENERATION, fingerprint_for())
    assert not half_made.exists() and not set_aside.exists()
    assert verify_store(store).ok, verify_store(store).problems
    shutil.copytree(store / manifest.index, half_made)  # a store damaged so before this fix: the next cleanup mends it
    assert not verify_store(store).ok
    assert remove_leftovers(store, manifest) == [f"{append_dir(GENERATION)}/{half_made.name}"]
    assert verify_store(store).ok


def test_replace_also_retires_the_given_ids_the_append_does_not_bring_again(tmp_path: Path) -> None:
    old = records(["d#0", "d#1", "d#2", "e#0"])
    store = build_store(tmp_path / "store", [old[:2], old[2:]])
    write_append(store, [records(["d#0"], seed=8)])
    manifest = commit_append(store, GENERATION, fingerprint_for(), replace=True, retire=["d#0", "d#1", "d#2", "gone"])
    with open_store(store) as opened:
        assert [passage_id in opened for passage_id in ("d#0", "d#1", "d#2", "e#0")] == [True, False, False, True]
        assert len(opened) == 2
    assert manifest.superseded_passages == 3
    assert manifest.superseded_tokens == sum(len(record.token_ids) for record in old[:3])
    assert verify_store(store).ok, verify_store(store).problems


def test_a_store_whose_appends_folder_is_a_link_to_another_disk_verifies(stores: StoreCopies, tmp_path: Path) -> None:
    """Readers follow folder links; verify and info listed files through fsspec, which does not, and reported every
    file of a linked `appends/` missing, and the link itself untracked (storage43 L2)."""
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)])
    commit_append(store, GENERATION, fingerprint_for())
    shutil.move(store / APPENDS_DIR, tmp_path / "other-disk")
    (store / APPENDS_DIR).symlink_to(tmp_path / "other-disk", target_is_directory=True)
    (tmp_path / "other-disk" / "loop").symlink_to(store, target_is_directory=True)  # a link loop ends the walk
    report = verify_store(store)
    assert report.ok and report.problems == [], report.problems
    assert report.untracked == []  # the loop's folder was listed already
    assert len(open_store(store)) == 2


def resigned(store: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change `store`'s manifest and sign it again, as anyone handing over a store can (its checksum has no
    secret)."""
    data = json.loads((store / MANIFEST_FILE).read_text(encoding="utf-8"))
    data.pop("checksum")
    change(data)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    data["checksum"] = hashlib.sha256(canonical).hexdigest()
    (store / MANIFEST_FILE).write_text(json.dumps(data), encoding="utf-8")


@pytest.mark.parametrize(("change", "message"), [
    (lambda data: data["appends"][0].update(generation="../../victim"),
     r"appends\[0\]\.generation is '\.\./\.\./victim', not a build id"),
    (lambda data: data.update(index="../../victim/index"),
     r"index is '\.\./\.\./victim/index', not 'index' or a committed append's index"),
    (lambda data: data["shards"][-1].update(path="../victim/shards/shard-00001"),
     r"shards\[1\]\.path is '\.\./victim/shards/shard-00001', not where an append puts shard 1"),
])  # fmt: skip
def test_a_manifest_naming_folders_outside_the_store_is_refused_before_anything_is_deleted(
    stores: StoreCopies, tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    """A generation of "../../victim" made the next append delete `victim/index` beside the store, and verify
    passed the store (hostile46 F1)."""
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)])
    commit_append(store, GENERATION, fingerprint_for())
    precious = tmp_path / "victim" / INDEX_DIR / "data.txt"
    precious.parent.mkdir(parents=True)
    precious.write_text("precious")
    resigned(store, change)
    with pytest.raises(StoreFormatError, match=f"malformed manifest: ValueError: {message}"):
        read_manifest(StoreLocation.parse(store))
    assert not verify_store(store).ok
    with pytest.raises(StoreFormatError, match="malformed manifest"):
        remove_leftovers(store, read_manifest(StoreLocation.parse(store)))
    assert precious.read_text() == "precious"


def test_the_cleanup_does_not_follow_a_link_under_appends(stores: StoreCopies, tmp_path: Path) -> None:
    """A link under appends/ led the cleanup's glob into the folder it names, whose `.tmp-*` entries it deleted
    (hostile46 F2)."""
    store = stores.copy(["a"], tmp_path / "store")
    write_append(store, [records(["b"], seed=1)])
    manifest = commit_append(store, GENERATION, fingerprint_for())
    outside = tmp_path / "outside"
    (outside / f"{TMP_PREFIX}precious").mkdir(parents=True)
    for name in ("linked", "e" * 16):
        (store / APPENDS_DIR / name).symlink_to(outside, target_is_directory=True)
    assert remove_leftovers(store, manifest) == [append_dir("e" * 16)]  # the link itself, as an uncommitted append
    assert (outside / f"{TMP_PREFIX}precious").is_dir() and (store / APPENDS_DIR / "linked").is_symlink()


def test_a_store_without_appends_has_none_to_clean_and_a_folder_of_another_name_is_left_alone(
    stores: StoreCopies, tmp_path: Path
) -> None:
    """(mut61 M5) The cleanup was seen only for stores that had appends/: a store's first append asks it before the
    folder exists (it would have stopped on "No such file or directory"). Inside appends/, only folders named as
    appends are searched for temporaries: a `.tmp-*` in a folder of another name is not dilstore's to delete."""
    store = stores.copy(["a"], tmp_path / "store")
    manifest = read_manifest(StoreLocation.parse(store))
    assert not (store / APPENDS_DIR).exists() and remove_leftovers(store, manifest) == []
    (store / APPENDS_DIR / "notes" / f"{TMP_PREFIX}draft").mkdir(parents=True)
    assert remove_leftovers(store, manifest) == [] and (store / APPENDS_DIR / "notes" / f"{TMP_PREFIX}draft").is_dir()
