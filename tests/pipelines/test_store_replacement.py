"""`precompute --overwrite` replaces only a dilstore store, never what holds the inputs or the current folder,
and builds the replacement beside the old store, so a failed run leaves the old store as it was."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dilstore.pipelines.job import (
    check_replaceable,
    compacted_from,
    discard_other_replacement,
    needs_replacement,
    prepare_store,
    replacement_dir,
    unmade_if_nothing_stored,
)
from dilstore.pipelines.spec_file import read_spec, spec_json
from dilstore.runners import cli
from dilstore.storage import durability
from dilstore.storage.codebook import CODEBOOK_DIR, codebook_build, read_codebook
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import SPEC_FILE, StoreFormatError
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.replacement import finish_interrupted_swap, swap_in
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import save_tiny_reader, wiki_like_documents, write_jsonl

SPEC = {"inputs": [], "split": "words", "shards": 2, "fingerprint": {"layers": 1}}
OTHER = {**SPEC, "split": "paragraphs"}


def fake_store(folder: Path, spec: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / SPEC_FILE).write_text(spec_json(spec))
    (folder / "manifest.json").write_text("{}")
    return folder


def test_a_folder_that_is_not_a_store_is_never_replaced(tmp_path: Path) -> None:
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    with pytest.raises(DilstoreError, match="was not made by `dilstore precompute`; choose another folder$"):
        prepare_store(foreign, SPEC, overwrite=True)
    assert (foreign / "thesis.tex").read_text() == "years of work"


def test_the_current_folder_and_its_parents_are_never_replaced(tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for target in (Path("."), tmp_path / "project", tmp_path):
        with pytest.raises(DilstoreError, match="current folder or one of its parents"):
            check_replaceable(target, [])


def test_a_folder_holding_an_input_is_never_replaced(tmp_path: Path) -> None:
    store = fake_store(tmp_path / "store", SPEC)
    (store / "inputs").mkdir()
    corpus = store / "inputs" / "corpus.jsonl"
    corpus.write_text("{}\n")
    with pytest.raises(DilstoreError, match="holds the input"):
        check_replaceable(store, [str(corpus)])
    check_replaceable(store, [str(tmp_path / "elsewhere.jsonl")])


def test_a_store_this_user_could_not_delete_is_refused_before_the_build(tmp_path: Path, monkeypatch) -> None:
    """(perm57 F4) `precompute --overwrite` of a store another user built (or `chmod -R a-w`) in a folder this user may
    write renamed it aside, swapped the new one in, and its deletion failed silently: success, the old store's whole
    copy hidden beside the new one, and every later write of the store "Permission denied: precompute.json". Root
    deletes anything, so the refusal is what os.access answers here."""
    store = fake_store(tmp_path / "store", SPEC)
    locked = store / "shards" / "shard-00000"
    locked.mkdir(parents=True)
    check_replaceable(store, [])
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **given: Path(path) != locked and real(path, mode, **given))
    with pytest.raises(DilstoreError, match=f"^{store} cannot be replaced by this user: its folder {locked} is not "
                                            "writable by it, so the old files could not be deleted"):  # fmt: skip
        check_replaceable(store, [])
    # (mut57c) A folder it may list and search but not write to (0555) is refused as well, and the store itself is
    # named as "it"; only the write bit was ever checked through a refusal of every bit.
    monkeypatch.setattr(os, "access", lambda path, mode, **given: not (Path(path) == locked and mode & os.W_OK)
                        and real(path, mode, **given))  # fmt: skip
    with pytest.raises(DilstoreError, match=f"its folder {locked} is not writable by it"):
        check_replaceable(store, [])
    monkeypatch.setattr(os, "access", lambda path, mode, **given: Path(path) != store and real(path, mode, **given))
    with pytest.raises(DilstoreError, match=f"^{store} cannot be replaced by this user: it is not writable by it"):
        check_replaceable(store, [])
    monkeypatch.setattr(os, "access", real)
    listed = os.scandir

    def scandir(path: Any) -> Any:  # a folder this user cannot list (mode 0311): os.walk passes over it unasked
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return listed(path)

    def vanished(path: Any) -> Any:  # a folder deleted while it is walked is no refusal (mut57c)
        if Path(path) == locked:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return listed(path)

    monkeypatch.setattr(os, "scandir", vanished)
    check_replaceable(store, [])
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(DilstoreError, match=f"its folder {locked} is not writable by it"):
        check_replaceable(store, [])
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((0,) * 8 + (os.ST_RDONLY, 255)))
    with pytest.raises(DilstoreError, match=f"^{store} cannot be replaced: its folder {locked} is on a read-only "
                                            r"filesystem \(--overwrite deletes the store it replaces; "):  # fmt: skip
        check_replaceable(store, [])  # not told to `chmod`, which a read-only mount refuses too


@pytest.mark.skipif(os.geteuid() == 0, reason="root deletes any file")
def test_an_old_copy_this_user_cannot_delete_is_named_by_its_whole_path(tmp_path: Path) -> None:
    """(perm57 F4) shutil.rmtree names the entry it failed at alone: "Permission denied: precompute.json"."""
    store = fake_store(tmp_path / "store", SPEC)
    old = fake_store(tmp_path / ".store.dilstore-replaced", SPEC)
    old.chmod(0o555)
    try:
        with pytest.raises(DilstoreError, match=f"cannot delete the old store's copy a stopped run left at {old}: "
                                                f"Permission denied \\(at {old}/"):  # fmt: skip
            finish_interrupted_swap(store)
    finally:
        old.chmod(0o755)


@pytest.mark.parametrize("left", ["the old store's copy", "a stopped compaction's copy"])
def test_a_left_copy_that_cannot_be_deleted_is_named_as_root_too(tmp_path: Path, monkeypatch, left: str) -> None:
    """(mut57c) The test above is skipped as root, and a stopped compaction's copy had none: a deletion that fails is
    an error naming the copy and the entry it failed at, not passed over, which left the copy hidden beside the
    store. Root deletes anything, so the refusal is what os.rmdir raises here.

    (left58 F4) A building folder without a spec was "what a compaction stopped before its swap left", where only
    `precompute --overwrite` may have run (one killed before its spec, or whose deletion stopped part-way): it is
    named as either command's, as `info` names it."""
    store = fake_store(tmp_path / "store", SPEC)
    copy = tmp_path / (".store.dilstore-replaced" if left == "the old store's copy" else ".store.dilstore-building")
    (copy / "shards").mkdir(parents=True)  # a building folder without a spec: a stopped compaction's or overwrite's
    real = os.rmdir

    def refused(path: Any, *args: Any, **given: Any) -> None:
        if Path(os.fsdecode(path)) == copy:
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        real(path, *args, **given)

    monkeypatch.setattr(os, "rmdir", refused)
    what = ("the old store's copy a stopped run left" if left == "the old store's copy" else
            "what a stopped `dilstore compact` or `precompute --overwrite` left")  # fmt: skip
    with pytest.raises(DilstoreError, match=f"^cannot delete {what} at {copy}: Permission denied \\(at {copy}\\); "):
        finish_interrupted_swap(store)


def test_a_replacement_of_other_settings_that_cannot_be_deleted_is_named(tmp_path: Path, monkeypatch) -> None:
    """(left58 F3) `precompute --overwrite` beside a stopped replacement of other settings that this user could not
    delete (another account's) said "Operation not permitted: zarr.json", shutil.rmtree's bare entry name: neither
    the folder nor what it was named. Root deletes anything, so the refusal is what os.unlink raises here."""
    store = fake_store(tmp_path / "store", SPEC)
    building = tmp_path / ".store.dilstore-building"
    (building / "shards" / "shard-00000").mkdir(parents=True)
    (building / SPEC_FILE).write_text(spec_json(SPEC))
    (building / "shards" / "shard-00000" / "zarr.json").write_text("{}")
    real = os.unlink

    def refused(path: Any, *args: Any, **given: Any) -> None:
        if os.fsdecode(path) == "zarr.json":  # rmtree names the entry within its folder's descriptor
            raise PermissionError(1, "Operation not permitted", os.fsdecode(path))
        real(path, *args, **given)

    monkeypatch.setattr(os, "unlink", refused)
    zarr_json = building / "shards" / "shard-00000" / "zarr.json"
    with pytest.raises(DilstoreError, match=f"^cannot delete the replacement of other settings a stopped run was "
                                            f"building at {building}: Operation not permitted \\(at {zarr_json}\\); "
                                            "delete it .*, then run the command again$"):  # fmt: skip
        discard_other_replacement(store, OTHER)


def test_overwrite_leaves_the_old_store_in_place_until_the_new_one_is_swapped_in(tmp_path: Path) -> None:
    store = fake_store(tmp_path / "store", SPEC)
    assert prepare_store(store, OTHER, overwrite=True) is False
    assert json.loads((store / SPEC_FILE).read_text()) == SPEC, "prepare touches nothing of the old store"
    assert needs_replacement(store, OTHER) and not needs_replacement(store, SPEC)
    building = replacement_dir(store, OTHER)
    assert building.parent == store.parent and json.loads((building / SPEC_FILE).read_text()) == OTHER
    (building / "manifest.json").write_text("{}")
    swap_in(store, building)
    assert json.loads((store / SPEC_FILE).read_text()) == OTHER
    assert sorted(path.name for path in tmp_path.iterdir()) == ["store"]


def test_a_swap_interrupted_between_its_renames_puts_the_old_store_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C between swap_in's renames left no store at the path until the next run of the store."""
    store = fake_store(tmp_path / "store", SPEC)
    building = replacement_dir(store, OTHER)
    (building / "manifest.json").write_text("{}")
    real_rename = os.rename

    def rename(source: Path, destination: Path) -> None:
        if Path(source) == building:
            raise KeyboardInterrupt
        real_rename(source, destination)

    monkeypatch.setattr(durability.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        swap_in(store, building)
    assert json.loads((store / SPEC_FILE).read_text()) == SPEC
    assert sorted(path.name for path in tmp_path.iterdir()) == [building.name, "store"]


@pytest.mark.parametrize("finished", [True, False])
def test_a_swap_killed_between_its_renames_is_completed_by_the_next_run(tmp_path: Path, finished: bool) -> None:
    """It left no store at the path, the old one aside and the new one in its building folder; the re-run built from
    scratch beside both, and two full copies stayed for good (crash36 3). An unfinished new store (never so when
    swap_in runs) gives the old one back."""
    store = fake_store(tmp_path / "store", SPEC)
    building = replacement_dir(store, OTHER)
    if finished:
        (building / "manifest.json").write_text("{}")
    store.rename(tmp_path / ".store.dilstore-replaced")  # the kill comes here
    with pytest.raises(StoreFormatError, match=f"^no store at {store}: a `dilstore precompute --overwrite` or "
                       r"`dilstore compact` was stopped while it put a new store here \(the old one is in "
                       r".store.dilstore-replaced\); the next `dilstore precompute` or `dilstore compact` of this "
                       "store finishes it$"):  # crash38 L5: "no store at" alone
        read_manifest(StoreLocation.parse(str(store)))
    finish_interrupted_swap(store)
    assert json.loads((store / SPEC_FILE).read_text()) == (OTHER if finished else SPEC)
    left = ["store"] if finished else [".store.dilstore-building", "store"]  # an unfinished build stays to resume
    assert sorted(path.name for path in tmp_path.iterdir()) == left


def test_a_swap_killed_before_its_delete_loses_the_old_copy_on_the_next_run(tmp_path: Path) -> None:
    """The re-run said "already complete" and kept the whole old store beside the new one (crash36 4)."""
    fake_store(tmp_path / ".store.dilstore-replaced", SPEC)
    store = fake_store(tmp_path / "store", OTHER)
    finish_interrupted_swap(store)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["store"]
    assert json.loads((store / SPEC_FILE).read_text()) == OTHER
    finish_interrupted_swap(store)  # nothing to finish: nothing changes
    assert sorted(path.name for path in tmp_path.iterdir()) == ["store"]


@pytest.mark.parametrize("left", ["nothing", "the spec's temporary", "shards without a spec"])
def test_a_building_folder_without_a_spec_is_named_by_info_and_deleted_by_the_next_precompute(
        tmp_path: Path, left: str) -> None:
    """(left57 F1) What a `compact` stopped before it wrote its spec (killed), or stopped twice while it deleted its
    half-built copy (a second Ctrl-C: shards, the spec already gone), left `.STORE.dilstore-building` that `info`
    said nothing of and a `precompute` (rerun or append) of the store kept, until the next `compact`. Both now treat
    it as a stopped compaction's; a stopped overwrite's folder with its spec is still kept for its rerun."""
    from dilstore.runners.cmd_store import stopped_compaction_note

    store = fake_store(tmp_path / "store", SPEC)
    building = tmp_path / ".store.dilstore-building"
    building.mkdir()
    if left == "the spec's temporary":
        (building / f".tmp-{SPEC_FILE}.host-1.x.tmp").write_text("{")
    if left == "shards without a spec":
        (building / "shards" / "shard-00000").mkdir(parents=True)
        (building / "shards" / "shard-00000" / "states").write_bytes(bytes(1000))
    note = stopped_compaction_note(str(store))
    assert note is not None and note.startswith(f"{building} (") and "a `dilstore compact` or `precompute " \
        f"--overwrite` of {store} stopped before its end left" in note, note
    finish_interrupted_swap(store)  # as precompute (a rerun, an append) does under the store's lock
    assert sorted(path.name for path in tmp_path.iterdir()) == ["store"]
    replacement_dir(store, OTHER)  # a stopped overwrite's, which its rerun resumes
    assert stopped_compaction_note(str(store)) is None
    finish_interrupted_swap(store)
    assert read_spec(building) == OTHER


def test_a_killed_replacement_is_resumed_and_a_stale_one_removed(tmp_path: Path) -> None:
    store = fake_store(tmp_path / "store", SPEC)
    building = replacement_dir(store, OTHER)
    (building / "shards").mkdir()
    (building / "shards" / "kept").write_text("a committed shard of this spec")
    assert (replacement_dir(store, OTHER) / "shards" / "kept").is_file(), "same spec: resumed"
    third = {**SPEC, "shards": 3}
    assert not (replacement_dir(store, third) / "shards").exists(), "another spec: started afresh"


def test_a_failed_overwrite_run_leaves_the_old_store_intact(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real store, then replacements that fail (a broken model; a pipeline that dies part-way): the old store
    still verifies, byte for byte; a replacement that completes is swapped in and says where it is."""
    from dilstore.runners import cmd_precompute

    tiny = save_tiny_reader(tmp_path / "tiny")
    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(3))
    store = tmp_path / "store"
    args = ["precompute", "--input", str(corpus), "--output", str(store), "--model", str(tiny), "--workers", "1",
            "--threads", "1", "--max-length", "48", "--shards", "2", "--no-progress"]  # fmt: skip
    assert cli.main(args) == 0
    before = {path.relative_to(store): path.read_bytes() for path in store.rglob("*") if path.is_file()}
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    assert cli.main([*args[:5], "--model", str(broken), *args[7:], "--split", "paragraphs", "--overwrite"]) == 2
    assert "cannot load" in capsys.readouterr().err
    real_run = cmd_precompute.run_pipeline

    def dies_part_way(job, *rest):
        (Path(job.store) / "shards").mkdir(exist_ok=True)
        raise DilstoreError("a worker died")

    monkeypatch.setattr(cmd_precompute, "run_pipeline", dies_part_way)
    assert cli.main([*args, "--split", "paragraphs", "--overwrite"]) == 2
    after = {path.relative_to(store): path.read_bytes() for path in store.rglob("*") if path.is_file()}
    assert after == before and verify_store(store).ok
    monkeypatch.setattr(cmd_precompute, "run_pipeline", real_run)
    assert cli.main([*args, "--split", "paragraphs", "--overwrite"]) == 0
    assert json.loads((store / "run-summary.json").read_text())["store"] == str(store.resolve())
    assert json.loads((store / SPEC_FILE).read_text())["split"] == "paragraphs" and verify_store(store).ok
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".store")) == []


def test_a_2bit_replacement_builds_its_codebook_inside_the_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--overwrite of a 1bit store with a 2bit one: the codebook is trained inside `.store.dilstore-building` and
    swapped in with it; a second replacement may reuse the store's own codebook (--codebook STORE/codebook),
    read before the old store goes. Each codebook records its store's build."""
    from dilstore.runners import cmd_precompute

    tiny = save_tiny_reader(tmp_path / "tiny")
    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(3))
    store = tmp_path / "store"
    args = ["precompute", "--input", str(corpus), "--output", str(store), "--model", str(tiny), "--workers", "1",
            "--threads", "1", "--max-length", "48", "--shards", "2", "--no-progress"]  # fmt: skip
    assert cli.main([*args, "--encoding", "1bit"]) == 0
    built_in: list[tuple[str, bool]] = []
    real_run = cmd_precompute.run_pipeline

    def watched(job, *rest):
        built_in.append((Path(job.store).name, (Path(job.store) / CODEBOOK_DIR).is_dir()))
        assert read_codebook(store / CODEBOOK_DIR, "1bit"), "the old store keeps its codebook until the swap"
        return real_run(job, *rest)

    monkeypatch.setattr(cmd_precompute, "run_pipeline", watched)
    assert cli.main([*args, "--encoding", "2bit", "--overwrite"]) == 0
    assert built_in == [(".store.dilstore-building", True)]
    trained, _ = read_codebook(store / CODEBOOK_DIR, "2bit")
    monkeypatch.setattr(cmd_precompute, "run_pipeline", real_run)
    # The three documents' codebook is far under the 512 states a --codebook run takes; this test is of the swap.
    monkeypatch.setattr("dilstore.pipelines.codebook.MIN_REUSE_TOKENS", 0)
    again = [*args, "--encoding", "2bit", "--split", "paragraphs", "--codebook", str(store / CODEBOOK_DIR)]
    assert cli.main([*again, "--overwrite"]) == 0
    reused, _ = read_codebook(store / CODEBOOK_DIR, "2bit")
    assert all(np.array_equal(reused[name], trained[name]) for name in trained)
    manifest = json.loads((store / "manifest.json").read_text())
    assert codebook_build(store / CODEBOOK_DIR)["generation"] == manifest["generation"]
    assert json.loads((store / SPEC_FILE).read_text())["split"] == "paragraphs" and verify_store(store).ok
    assert not any(path.name.endswith(".dilstore-building") for path in tmp_path.iterdir())


def test_a_run_that_fails_before_storing_anything_leaves_no_settings_behind(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that never started (Beam refusing a Dataflow project) left STORE/precompute.json, and the corrected
    command with other settings was refused as "a run with other settings"; a run that stored a part keeps it."""
    from dilstore.runners import cmd_precompute

    tiny = save_tiny_reader(tmp_path / "tiny")
    corpus = write_jsonl(tmp_path / "c.jsonl", wiki_like_documents(3))
    store, made_by_user = tmp_path / "store", tmp_path / "empty"
    made_by_user.mkdir()
    args = ["precompute", "--input", str(corpus), "--model", str(tiny), "--workers", "1", "--threads", "1",
            "--max-length", "48", "--shards", "2", "--no-progress"]  # fmt: skip
    real_run = cmd_precompute.run_pipeline

    def never_starts(job, *rest):
        raise DilstoreError("the job did not start")

    def dies_part_way(job, *rest):
        (Path(job.store) / "shards").mkdir()
        raise DilstoreError("a worker died")

    def launched_then_interrupted(job, *rest):
        rest[-1].launched = True  # a Dataflow job accepted: its workers go on, reading the spec and the codebook
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd_precompute, "run_pipeline", launched_then_interrupted)
    assert cli.main([*args, "--output", str(tmp_path / "remote"), "--encoding", "2bit"]) == 130
    assert sorted(path.name for path in (tmp_path / "remote").iterdir()) == [CODEBOOK_DIR, SPEC_FILE]
    with pytest.raises(KeyboardInterrupt):  # not the take-back's FileNotFoundError for a folder never made
        with unmade_if_nothing_stored(tmp_path / "never-made"):
            raise KeyboardInterrupt
    launched = tmp_path / "launched"  # a launched job that fails here (a DilstoreError) keeps its start too (mut58)
    with pytest.raises(DilstoreError, match="the launcher lost its job"), unmade_if_nothing_stored(launched) as attempt:
        launched.mkdir()
        (launched / SPEC_FILE).write_text("{}")
        attempt.launched = True
        raise DilstoreError("the launcher lost its job (the shards it finished are kept)")
    assert [path.name for path in launched.iterdir()] == [SPEC_FILE]
    monkeypatch.setattr(cmd_precompute, "run_pipeline", never_starts)
    assert cli.main([*args, "--output", str(store)]) == 2
    assert cli.main([*args, "--output", str(made_by_user), "--encoding", "2bit"]) == 2  # its codebook goes too
    assert capsys.readouterr().err.count("the job did not start") == 2
    assert not store.exists() and list(made_by_user.iterdir()) == []
    monkeypatch.setattr(cmd_precompute, "run_pipeline", dies_part_way)
    assert cli.main([*args, "--output", str(store), "--split", "paragraphs"]) == 2
    assert sorted(path.name for path in store.iterdir()) == [SPEC_FILE, "shards"]
    monkeypatch.setattr(cmd_precompute, "run_pipeline", real_run)
    assert cli.main([*args, "--output", str(store)]) == 2
    assert "holds a run with other settings (differs in: split: the store's 'paragraphs', this run's 'words')" in \
           capsys.readouterr().err  # fmt: skip
    assert cli.main([*args, "--output", str(made_by_user)]) == 0 and verify_store(made_by_user).ok


def test_another_users_store_in_a_sticky_folder_is_refused_before_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(read57b F1) A store another user built in a sticky folder (/tmp, a team's scratch of mode 1777 or 3775), with
    folders its group may write, passed the check of perm57 F4: `precompute --overwrite` or an in-place `compact` ran
    to its end, and renaming the old store aside failed there with "Operation not permitted". Root renames anything,
    so this user is another uid here."""
    shared = tmp_path / "shared"
    shared.mkdir()
    store = fake_store(shared / "store", SPEC)
    shared.chmod(0o1777)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(shared).st_uid + 4242)
    with pytest.raises(DilstoreError, match=f"^{store} cannot be replaced by this user: it belongs to another user, "
                                            f"and its folder {shared} has the sticky bit"):  # fmt: skip
        check_replaceable(store, [])
    shared.chmod(0o777)
    check_replaceable(store, [])  # not sticky: a folder its group may write is enough


def test_overwrite_rebuilds_a_compacted_store_of_the_same_spec_and_replaces_one_without_a_spec(tmp_path: Path) -> None:
    """A finalized store that `dilstore compact` rewrote is "already complete" for the same command, but --overwrite
    builds it again (conc54 F2); a finalized store without a spec (made through the Python API) is a store --overwrite
    replaces, not a stranger (mut58: neither path of prepare_store was tested)."""
    spec = {"split": "words", "compacted": {"generation": "0123456789abcdef"}}
    compacted = tmp_path / "compacted"
    compacted.mkdir()
    (compacted / SPEC_FILE).write_text(spec_json(spec))
    (compacted / "manifest.json").write_text("{}")
    assert prepare_store(compacted, spec, overwrite=False) is True
    assert prepare_store(compacted, spec, overwrite=True) is False
    assert needs_replacement(compacted, spec)
    api_made = tmp_path / "api-made"
    api_made.mkdir()
    (api_made / "manifest.json").write_text("{}")
    assert prepare_store(api_made, {"split": "words"}, overwrite=True) is False
    with pytest.raises(DilstoreError, match="holds a run with other settings"):
        prepare_store(api_made, {"split": "words"}, overwrite=False)


def test_a_compaction_of_this_spec_is_recognised_whatever_its_shard_count() -> None:
    """`dilstore compact` writes its own shard count into the spec it keeps: the same settings with another count are
    this spec's compaction; another setting, or no `compacted` record, is not (mut58: the shard count was untested)."""
    spec = {"split": "words", "shards": 2}
    assert compacted_from({"split": "words", "shards": 5, "compacted": {"generation": "0123456789abcdef"}}, spec)
    assert not compacted_from({"split": "paragraphs", "shards": 5, "compacted": {}}, spec)
    assert not compacted_from({"split": "words", "shards": 5}, spec)
