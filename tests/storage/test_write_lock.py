"""One writer per folder (storage/write_lock.py): a second `precompute` on a store being written stops with the first
one's pid."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dilstore.runners.cli import main
from dilstore.storage import write_lock as write_lock_module
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreFormatError
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
from dilstore.storage.write_lock import lock_path, write_lock, writer_of
from tests.fixtures.locks import held_lock


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with held_lock(store) as holder, pytest.raises(DilstoreError, match=rf"being written by pid {holder} "):
        with write_lock(store):
            pass
    with write_lock(store) as path:
        assert path == lock_path(store)
        assert path.read_text().strip() == str(os.getpid())


def test_a_writer_leaves_no_lock_file_and_a_refused_one_no_folder(tmp_path: Path) -> None:
    """A `train` refused for a missing input left `runs/` and `runs/.NAME.dilstore-lock` behind (train41 L3, cli43
    L2); every finished run left its lock file."""
    run = tmp_path / "runs" / "deep" / "run"
    with pytest.raises(DilstoreError, match="no such input"), write_lock(run):
        assert lock_path(run).is_file()
        raise DilstoreError("no such input")
    assert list(tmp_path.iterdir()) == []
    with write_lock(run):
        run.mkdir()
    assert sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*")) == [
        Path("runs"), Path("runs/deep"), Path("runs/deep/run")]  # the run's folder and those above it stay


def test_writers_that_take_turns_never_hold_the_lock_together(tmp_path: Path) -> None:
    """The file goes as its writer lets go: one that opened it just before holds a lock on a removed file, and
    must take the new file's instead, or it and the next writer would both hold "the" lock."""
    store = tmp_path / "store"
    inside, overlaps, turns = [], [], []

    def writer() -> None:
        for _ in range(300):
            try:
                with write_lock(store):
                    inside.append(1)
                    time.sleep(0.0002)  # a moment for another writer to come in, were the lock not exclusive
                    overlaps.append(len(inside) > 1)
                    inside.pop()
                    turns.append(1)
            except DilstoreError:
                pass  # held by another: try again

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert turns and not any(overlaps)
    assert not lock_path(store).exists()


@pytest.mark.skipif(not Path("/proc/locks").is_file(), reason="Linux's /proc/locks names the holder")
def test_a_store_being_written_is_named_so_not_never_finalized(tmp_path: Path) -> None:
    """`info`, `ask`, `serve` and `verify` said a store a live precompute was writing "was never finalized (a
    `dilstore precompute` killed before its end)" (conc39 M2)."""
    store = tmp_path / "store"
    (store / "shards").mkdir(parents=True)
    (store / "precompute.json").write_text("{}")
    assert writer_of(store) is None
    with held_lock(store) as holder:
        assert writer_of(store) == str(holder)
        with pytest.raises(StoreFormatError, match=rf"is being written by pid {holder} \(a `dilstore precompute` or "
                                                   r"`dilstore compact` not finished yet\): wait for it$"):  # fmt: skip
            read_manifest(StoreLocation.parse(store))
    with pytest.raises(StoreFormatError, match="was never finalized"):
        read_manifest(StoreLocation.parse(store))
    with write_lock(store):  # this process holds it: an --append reading the manifest named its own pid (review40 H1)
        assert writer_of(store) is None
        with pytest.raises(StoreFormatError, match="was never finalized"):
            read_manifest(StoreLocation.parse(store))


def test_a_writer_refused_before_the_holder_recorded_its_pid_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder writes its pid just after it takes the lock: a writer refused in between said "pid unknown"
    (conc39 L1)."""
    store = tmp_path / "store"
    with held_lock(store) as holder:
        reads = []
        real_pread = os.pread

        def late(descriptor: int, size: int, offset: int) -> bytes:
            reads.append(1)
            return b"" if len(reads) < 3 else real_pread(descriptor, size, offset)  # as if read before the pwrite

        monkeypatch.setattr(write_lock_module.os, "pread", late)
        monkeypatch.setattr(write_lock_module, "writer_of", lambda *args: None)  # a system without /proc/locks
        with pytest.raises(DilstoreError, match=rf"being written by pid {holder} "):
            with write_lock(store):
                pass
    assert len(reads) == 3


def test_two_spellings_of_one_folder_take_one_lock(tmp_path: Path) -> None:
    """`dilstore index lk` and `dilstore index lklink` (a link to lk) each took a lock and built at once."""
    store = tmp_path / "lk"
    store.mkdir()
    (tmp_path / "lklink").symlink_to(store)
    with held_lock(store) as holder, pytest.raises(DilstoreError, match=rf"being written by pid {holder} "):
        with write_lock(tmp_path / "lklink"):
            pass
    with held_lock(tmp_path / "lklink") as holder, pytest.raises(DilstoreError, match=rf"pid {holder} "):
        with write_lock(tmp_path / "sub" / ".." / "lk"):
            pass
    (tmp_path / "loop").symlink_to("loop")  # Path.resolve raised RuntimeError on it: a traceback
    assert lock_path(tmp_path / "loop") == tmp_path / ".loop.dilstore-lock"


def test_the_lock_lives_beside_the_store_not_in_it(tmp_path: Path) -> None:
    store = tmp_path / "stores" / "wiki"
    with write_lock(store) as path:
        assert path.parent == store.parent and path.name == ".wiki.dilstore-lock"
    assert not store.exists()


def test_a_folder_under_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DilstoreError, match=rf"{tmp_path}/afile/sub/store cannot be made: {tmp_path}/afile is a file"):
        with write_lock(tmp_path / "afile" / "sub" / "store"):
            pass


def test_a_lock_that_cannot_be_created_says_which_folder_must_be_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only parent folder (tests run as root, whom file modes do not stop, so os.open is made to refuse)."""

    def refuse(*_: object, **__: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(write_lock_module.os, "open", refuse)
    with pytest.raises(DilstoreError, match=rf"cannot create the lock file .*: Permission denied; .* so its folder "
                                            rf"{tmp_path} must be writable"):  # fmt: skip
        with write_lock(tmp_path / "store"):
            pass


@pytest.mark.parametrize("encoding", ["fp16", "2bit"])
def test_precompute_on_a_locked_store_stops_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], encoding: str
) -> None:
    """Nothing is written, not even the codebook a 2bit run trains before its shards."""
    store = tmp_path / "store"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "one short document"}\n', encoding="utf-8")
    with held_lock(store) as holder:
        status = main(["precompute", "--input", str(corpus), "--output", str(store), "--encoding", encoding,
                       "--no-progress"])
    assert status == 2
    assert f"is being written by pid {holder}" in capsys.readouterr().err
    assert not store.exists()


@pytest.mark.skipif(not Path("/proc/locks").is_file(), reason="Linux's /proc/locks names the holder")
def test_a_refused_writer_names_the_process_holding_the_lock_not_an_earlier_pid_in_its_file(tmp_path: Path) -> None:
    """The file holds the last holder's pid until the next one writes its own: a writer refused in between named a
    finished run (crash40 L5)."""
    store = tmp_path / "store"
    path = lock_path(store)
    path.write_text("12345\n")
    code = ("import fcntl, os, sys, time\ndescriptor = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.flock(descriptor, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(120)\n")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(DilstoreError, match=rf"being written by pid {holder.pid} "), write_lock(store):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_file_that_cannot_be_opened_is_named_not_its_folder(tmp_path: Path, monkeypatch) -> None:
    """A lock file of mode 000 in a writable folder was reported as "its folder must be writable" (crash40 L6)."""
    from dilstore.storage import write_lock as module

    store = tmp_path / "store"
    lock_path(store).write_text("")

    def refused(*args: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(module.os, "open", refused)
    with pytest.raises(DilstoreError, match=rf"^cannot open the lock file {lock_path(store)} of {store}: Permission "
                                            "denied; it must be readable and writable by this user; no process this "
                                            "system shows holds it: unless a run of it goes on in another container "
                                            r"or on another machine, a run killed at once \(kill -9 or the "
                                            r"out-of-memory killer\) left it: delete it$"):  # fmt: skip
        with write_lock(store):
            pass


def test_a_lock_no_process_here_is_seen_holding_is_not_called_free(tmp_path: Path, monkeypatch) -> None:
    """(read57b F2) /proc/locks leaves out the holders in other pid namespaces (another container or pod sharing the
    volume) and knows none on other machines, yet a lock file this user could not open was "no process holds it
    ...: delete it": deleting a live writer's lock let a second writer into the store."""
    from dilstore.storage import write_lock as module

    store = tmp_path / "store"
    lock_path(store).write_text("")
    monkeypatch.setattr(module, "_held_by", lambda path: None)  # held in another container: not in /proc/locks

    def refused(*args: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(module.os, "open", refused)
    with pytest.raises(DilstoreError) as refusal, write_lock(store):
        pass
    assert "no process holds it" not in str(refusal.value)
    assert "unless a run of it goes on in another container or on another machine" in str(refusal.value)


@pytest.mark.skipif(not Path("/proc/locks").is_file(), reason="needs Linux's /proc/locks")
def test_a_lock_file_gets_the_umask_s_mode_and_one_held_is_not_called_left(tmp_path: Path, monkeypatch) -> None:
    """(perm57 F5) The lock file was made 0644 whatever the umask: one a killed run left (a writer removes its own as
    it lets go) refused every other writer of the store's group under umask 002, saying only that it must be
    writable. It gets what the umask gives any new file, and a refusal says whether a process still holds it."""
    import fcntl

    from dilstore.storage import write_lock as module

    store = tmp_path / "store"
    saved = os.umask(0o002)
    try:
        with write_lock(store) as path:
            assert path.stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(saved)
    path.write_text("")
    real = os.open

    def refused(target: object, *args: object) -> int:
        if Path(str(target)) == path:
            raise PermissionError(13, "Permission denied")
        return real(target, *args)  # type: ignore[arg-type]

    with path.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a live writer's, as another process would hold it
        monkeypatch.setattr(module.os, "open", refused)
        with pytest.raises(DilstoreError, match="must be readable and writable by this user$"), write_lock(store):
            pass


def test_a_lock_folder_removed_between_its_making_and_the_open_is_made_again(tmp_path: Path, monkeypatch) -> None:
    """A writer letting go removes the folders it made for its lock when empty: a second writer that had just made
    `runs/` for its own lock failed with FileNotFoundError (review43 L3)."""
    run = tmp_path / "runs" / "b"
    real_open, removed = os.open, []

    def open_after_a_cleanup(path, flags, mode=0o777):
        if not removed:  # the first writer's cleanup, between this writer's mkdir and its open
            removed.append(Path(path).parent)
            Path(path).parent.rmdir()
        return real_open(path, flags, mode)

    monkeypatch.setattr(write_lock_module.os, "open", open_after_a_cleanup)
    with write_lock(run) as path:
        assert path.is_file() and removed == [tmp_path / "runs"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_that_takes_no_new_files_is_named_as_such() -> None:
    """/proc answers ENOENT to a new file: the error said the folder "was removed 5 times as it was made"
    (train46 F4)."""
    with pytest.raises(DilstoreError, match=r"^cannot create the lock file /proc/\.dilstore-out\.dilstore-lock: its "
                                            r"folder /proc takes no new files \(No such file or directory\)$"):
        with write_lock(Path("/proc/dilstore-out")):
            pass


def test_a_lock_file_a_killed_writer_left_holds_only_the_new_holder_s_pid(tmp_path: Path) -> None:
    """A writer killed with SIGKILL leaves its lock file; the next holder's shorter pid written over a longer one
    would leave the old one's tail after it, which a refused writer on a system without /proc/locks reads with it."""
    store = tmp_path / "store"
    path = lock_path(store)
    path.write_text("987654321012\n")  # longer than any pid
    with write_lock(store):
        assert path.read_text() == f"{os.getpid()}\n"
