"""storage/atomic_files.py: whole files or nothing, with the mode the umask gives any new file."""

from __future__ import annotations

import fcntl
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.atomic_files import (
    _host,
    atomic_write_bytes,
    atomic_write_text,
    give_new_file_modes,
    process_umask,
    remove_dead_writers_temporaries,
    remove_stale_writes,
)
from tests.fixtures.store_fixtures import build_store, passage


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_holds_the_data_and_no_temporary_is_left(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "file.json"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second ü")
    assert target.read_text(encoding="utf-8") == "second ü"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.json"]


def test_a_missing_folder_is_an_error_when_parents_are_not_created(tmp_path: Path) -> None:
    """The error named the temporary file the write would have made in the folder (review38 L8)."""
    with pytest.raises(FileNotFoundError, match=f"no such folder: '{tmp_path / 'nowhere'}'$"):
        atomic_write_bytes(tmp_path / "nowhere" / "run.trec", b"x", named_by_user=True)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(NotADirectoryError, match=f"not a folder: '{tmp_path / 'a-file'}'$"):
        atomic_write_bytes(tmp_path / "a-file" / "run.trec", b"x", named_by_user=True)


@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_mode_is_what_the_umask_gives_a_new_file(tmp_path: Path, umask: int, expected: int) -> None:
    """A bare temporary file is 0600 whatever the umask; a store must be readable by the servers that mount it."""
    target = tmp_path / "manifest.json"
    code = (f"import os; os.umask({umask}); from pathlib import Path\n"
            "from dilstore.storage.atomic_files import atomic_write_bytes\n"
            f"atomic_write_bytes(Path({str(target)!r}), b'{{}}')")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    assert mode(target) == expected


def test_every_file_of_a_store_has_the_mode_of_a_plain_new_file(tmp_path: Path) -> None:
    reference = tmp_path / "plain"
    reference.write_bytes(b"")
    rng = np.random.default_rng(0)
    store = build_store(tmp_path / "store", [[passage("a", 5, (8,), rng)], [passage("b", 3, (8,), rng)]])
    modes = {str(path.relative_to(store)): mode(path) for path in store.rglob("*") if path.is_file()}
    assert "manifest.json" in modes
    assert {name: m for name, m in modes.items() if m != mode(reference)} == {}


def test_finalize_removes_what_killed_atomic_writes_left_and_nothing_else(tmp_path: Path) -> None:
    """A run SIGKILLed while it wrote a part file left `.tmp-part-00000.jsonl.XXXX.tmp` beside it; the re-run
    wrote the part again and finalized, and the temporary stayed in the store (found by the resume test)."""
    rng = np.random.default_rng(0)
    records = [[passage("a", 5, (8,), rng)], [passage("b", 3, (8,), rng)]]
    stale = [tmp_path / "store" / "passages" / "jsonl" / ".tmp-part-00000.jsonl.dn7rz7fk.tmp",
             tmp_path / "store" / "rejected" / ".tmp-part-00001.jsonl.x1.tmp"]  # fmt: skip
    kept = [tmp_path / "store" / "passages" / "jsonl" / "part-00000.jsonl", tmp_path / "store" / "notes.tmp"]
    for path in (*stale, *kept):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x", encoding="utf-8")
    store = build_store(tmp_path / "store", records)
    assert [path for path in stale if path.exists()] == [] and all(path.is_file() for path in kept)
    assert remove_stale_writes(store) == []


def test_stale_writes_in_the_subfolders_named_to_skip_are_left_alone(tmp_path: Path) -> None:
    """finalize and commit_append pass shards/ and index/ as `skip`: what lies below them stays, and only the
    temporaries of the other subfolders, and of the folder itself, go."""
    names = ["shards/shard-00000/.tmp-zarr.json.a1.tmp", "index/.tmp-segments_1.b2.tmp",
             "passages/jsonl/.tmp-part-00000.jsonl.c3.tmp", ".tmp-manifest.json.d4.tmp"]  # fmt: skip
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x", encoding="utf-8")
    removed = remove_stale_writes(tmp_path, skip=("shards", "index"))
    assert sorted(removed) == sorted([tmp_path / names[2], tmp_path / names[3]])
    assert [name for name in names if (tmp_path / name).exists()] == names[:2]


def test_a_rewrite_removes_what_a_killed_write_of_the_same_file_left(tmp_path: Path) -> None:
    """`kill -9` during the final write of `--output run.trec` left `.tmp-run.trec.XXXX.tmp` (the whole new run)
    beside it for good, and a re-run to the same output left it too (longrun45 F5)."""
    target = tmp_path / "run.trec"
    target.write_text("OLD")
    code = ("import os, signal; from pathlib import Path\n"
            "os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)\n"
            "from dilstore.storage.atomic_files import atomic_write_bytes\n"
            f"atomic_write_bytes(Path({str(target)!r}), b'NEW')")  # fmt: skip
    killed = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2])
    assert killed.returncode == -signal.SIGKILL
    left = [path.name for path in tmp_path.glob(".tmp-run.trec.*.tmp")]
    assert len(left) == 1 and (tmp_path / left[0]).read_bytes() == b"NEW" and target.read_text() == "OLD"
    atomic_write_text(target, "RERUN", named_by_user=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run.trec"] and target.read_text() == "RERUN"


def test_only_temporaries_of_writers_known_to_be_gone_are_removed(tmp_path: Path) -> None:
    """A live writer's temporary, another host's (its process ids mean nothing here) and another file's stay."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            names = {"dead": f".tmp-run.trec.{_host()}-{dead_pid}.ab12cd34.tmp",
                     "live": f".tmp-run.trec.{_host()}-{live.pid}.ef56ab78.tmp",
                     "other host": f".tmp-run.trec.{'0' * 8 if _host() != '0' * 8 else '1' * 8}-{dead_pid}.x.tmp",
                     "other file": f".tmp-run.trec2.{_host()}-{dead_pid}.x.tmp",
                     "old form": ".tmp-run.trec.dn7rz7fk.tmp",
                     # A writer in another pid namespace (a container): its pid means nothing here, its lock does
                     # (review46 M1).
                     "locked": f".tmp-run.trec.{_host()}-{dead_pid}.cd90ef12.tmp"}  # fmt: skip
            for name in names.values():
                (tmp_path / name).write_text("x")
            with (tmp_path / names["locked"]).open("rb") as held:
                fcntl.flock(held, fcntl.LOCK_EX)
                assert remove_dead_writers_temporaries(tmp_path / "run.trec") == [tmp_path / names["dead"]]
            assert sorted(path.name for path in tmp_path.iterdir()) == sorted(set(names.values()) - {names["dead"]})
        finally:
            live.kill()


def test_safetensors_files_get_the_umask_s_mode_and_other_files_keep_theirs(tmp_path: Path) -> None:
    """safetensors writes 0600 whatever the umask; only the weights are widened, not every file of the folder."""
    weights, private = tmp_path / "sub" / "model.safetensors", tmp_path / "notes.txt"
    weights.parent.mkdir()
    for path in (weights, private):
        path.write_bytes(b"x")
        path.chmod(0o600)
    give_new_file_modes(tmp_path)
    assert stat.S_IMODE(weights.stat().st_mode) == 0o666 & ~process_umask()
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_a_copied_read_only_tree_gets_the_modes_of_new_files_and_folders(tmp_path: Path) -> None:
    """(perm57 F3) shutil's copies kept the source's modes: `dilstore compact --output` of a store made read-only (its
    BM25 index 0555/0444, another account's or `chmod -R a-w`) made a read-only index folder, failed writing its
    record into it ("Permission denied: OUT/bm25/dilstore-index.json") and left the folder, which no cleanup could
    delete. A copy now gets what a new file or folder gets under the umask; a file's execute bits stay."""
    from dilstore.storage.file_errors import copy_file, copy_tree

    plain_file, plain_folder = tmp_path / "plain", tmp_path / "plain-folder"
    plain_file.write_bytes(b"")
    plain_folder.mkdir()
    source = tmp_path / "bm25"
    (source / "sub").mkdir(parents=True)
    for path, content in ((source / "segments_1", b"s"), (source / "sub" / "part", b"p"), (source / "run.sh", b"x")):
        path.write_bytes(content)
        path.chmod(0o555 if path.name == "run.sh" else 0o444)
    (source / "link").symlink_to("segments_1")
    for folder in (source / "sub", source):
        folder.chmod(0o555)
    try:
        copy_tree(source, tmp_path / "copy", symlinks=True)
        copy_file(source / "segments_1", tmp_path / "one")
    finally:
        for folder in (source, source / "sub"):
            folder.chmod(0o755)
    copy = tmp_path / "copy"
    assert {str(path.relative_to(copy)): mode(path) for path in [copy, *copy.rglob("*")] if not path.is_symlink()} == {
        ".": mode(plain_folder), "sub": mode(plain_folder), "segments_1": mode(plain_file),
        "sub/part": mode(plain_file), "run.sh": mode(plain_file) | (0o555 & ~process_umask() & 0o111),
    }  # fmt: skip
    assert (copy / "link").is_symlink() and mode(tmp_path / "one") == mode(plain_file)
    (copy / "sub" / "new").write_bytes(b"")  # the copy's owner writes into it (denied before, unless root)


def test_a_copy_of_a_private_file_or_folder_stays_private(tmp_path: Path) -> None:
    """The copies perm57 F3 made writable took the umask's whole mode: a 0600 file (a token, a private note kept in a
    store's folder) came out of `compact --output` as 0644, readable by every user under umask 022. The source's
    bits are kept, only the owner's write (and a folder's search) bit added."""
    from dilstore.storage.file_errors import copy_file, copy_tree

    source = tmp_path / "private"
    source.mkdir()
    (source / "token").write_bytes(b"secret")
    (source / "token").chmod(0o600)
    (source / "notes").write_bytes(b"n")
    (source / "notes").chmod(0o400)
    source.chmod(0o700)
    copy_tree(source, tmp_path / "copy")
    copy_file(source / "token", tmp_path / "token")
    owner_only = 0o700 & ~process_umask()
    assert mode(tmp_path / "copy") == owner_only and mode(tmp_path / "token") == 0o600 & ~process_umask()
    assert {path.name: mode(path) for path in (tmp_path / "copy").iterdir()} == {
        "token": 0o600 & ~process_umask(), "notes": 0o600 & ~process_umask()}


def test_a_copy_leaves_what_its_links_lead_to_and_a_failed_one_is_writable(tmp_path: Path, monkeypatch) -> None:
    """(mut57c) The copies' modes are given to the copies alone: a link copied as a link (a file's, or a folder's in a
    tree) left the mode of what it leads to, which may be the source's own; they are held within the umask, so 0444
    under umask 027 is 0640; a folder gets its owner's read and search bits too; and a copy that failed half-way
    has writable folders, so that its cleanup can delete them."""
    import shutil

    from dilstore.storage import atomic_files
    from dilstore.storage.file_errors import _give_folder_modes, copy_file, copy_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_bytes(b"t")
    (outside / "target").chmod(0o444)
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "part").write_bytes(b"p")
    (source / "file-link").symlink_to(outside / "target")
    (source / "folder-link").symlink_to(outside)
    outside.chmod(0o555)
    with monkeypatch.context() as patch:  # umask 027, as process_umask (read once) gives it
        patch.setattr(atomic_files, "process_umask", lambda: 0o027)
        copy_tree(source, tmp_path / "copy", symlinks=True)
        copy_file(source / "file-link", tmp_path / "link", follow_symlinks=False)
        copy_file(outside / "target", tmp_path / "one")
    assert (mode(outside), mode(outside / "target"), mode(tmp_path / "one")) == (0o555, 0o444, 0o640)
    outside.chmod(0o755)
    unlisted = tmp_path / "unlisted"
    unlisted.mkdir()
    unlisted.chmod(0o050)  # a group's folder its owner may not list: the copy's owner may
    _give_folder_modes(unlisted)
    assert mode(unlisted) == 0o750 & ~process_umask()
    for folder in (source / "sub", source):
        folder.chmod(0o555)
    real = shutil.copystat

    def failed(src: str, dst: str, **given: object) -> None:  # the top folder's mode, given last, is refused
        if Path(dst) == tmp_path / "failed":
            raise PermissionError(1, "Operation not permitted", dst)
        real(src, dst, **given)

    monkeypatch.setattr(shutil, "copystat", failed)
    try:
        with pytest.raises(OSError, match="Operation not permitted"):
            copy_tree(source, tmp_path / "failed", symlinks=True)
    finally:
        for folder in (source, source / "sub"):
            folder.chmod(0o755)
    assert mode(tmp_path / "failed" / "sub") & 0o700 == 0o700
