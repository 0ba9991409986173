"""Temporary folders a killed command left in $TMPDIR are removed by the next command that makes one of their kind.

SIGKILL cannot be caught: each killed `precompute` left its progress folder and each killed `index` of an appended
store a copy of its passage text in $TMPDIR, and nothing removed them (crash36 8).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dilstore.runners import scratch
from dilstore.runners.scratch import OWNER_LOCK, remove_abandoned, scratch_dir
from dilstore.storage.errors import DilstoreError
from tests.fixtures.paths import ROOT

HOLD = """
import sys, time
from dilstore.runners.scratch import scratch_dir
with scratch_dir("dilstore-test-") as folder:
    (folder / "part.jsonl").write_text("{}")
    print(folder, flush=True)
    time.sleep(120)
"""


@pytest.fixture(autouse=True)
def _temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_folder_of_a_killed_command_is_removed_and_one_of_a_running_command_kept(tmp_path: Path) -> None:
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    children = [subprocess.Popen([sys.executable, "-c", HOLD], cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                                 text=True) for _ in range(2)]  # fmt: skip
    try:
        killed, running = (Path(child.stdout.readline().strip()) for child in children)
        children[0].send_signal(signal.SIGKILL)
        children[0].wait(timeout=60)
        assert killed.is_dir(), "SIGKILL leaves the folder"
        with scratch_dir("dilstore-test-") as mine:
            assert not killed.exists()
            assert running.is_dir() and (running / "part.jsonl").is_file()
            assert mine.is_dir() and mine.parent == tmp_path
        assert not mine.exists()
    finally:
        for child in children:
            child.kill()
            child.wait(timeout=60)


def test_the_folder_is_removed_when_its_block_ends_by_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), scratch_dir("dilstore-test-") as folder:
        (folder / "part.jsonl").write_text("{}")
        raise KeyboardInterrupt
    assert not folder.exists() and not list(tmp_path.iterdir())


def test_a_new_scratch_folder_sweeps_abandoned_ones_of_every_kind(tmp_path: Path) -> None:
    """(left61 F6) The sweep was by kind: the copy of an appended store's passage text a SIGKILLed `index` left in
    $TMPDIR stayed there through every `precompute`, until the next `index`."""
    collection = tmp_path / "dilstore-collection-killed"
    collection.mkdir()
    (collection / OWNER_LOCK).write_text("")
    (collection / "part-00000.jsonl").write_text("{}")
    with scratch_dir("dilstore-progress-"):
        assert not collection.exists()


def test_folders_without_an_owner_lock_or_of_another_kind_are_left(tmp_path: Path) -> None:
    unowned = tmp_path / "dilstore-test-old"
    unowned.mkdir()
    other = tmp_path / "dilstore-other-1"
    other.mkdir()
    (other / OWNER_LOCK).write_text("")
    assert remove_abandoned("dilstore-test-") == []
    assert unowned.is_dir() and other.is_dir()
    assert remove_abandoned("dilstore-other-") == [other]


def test_a_folder_whose_lock_is_held_is_kept(tmp_path: Path) -> None:
    held = tmp_path / "dilstore-test-held"
    held.mkdir()
    descriptor = os.open(held / OWNER_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        assert remove_abandoned("dilstore-test-") == []
        assert held.is_dir()
    finally:
        os.close(descriptor)
    assert remove_abandoned("dilstore-test-") == [held]


def test_a_folder_whose_lock_file_is_a_link_is_left_alone(tmp_path: Path) -> None:
    """Only a lock file the folder holds itself marks it as dilstore's: a link (to a file no one locks) is not
    followed, and the folder is kept."""
    target = tmp_path / "elsewhere"
    target.write_text("")
    folder = tmp_path / "dilstore-test-linked"
    folder.mkdir()
    (folder / OWNER_LOCK).symlink_to(target)
    (folder / "part.jsonl").write_text("{}")
    assert remove_abandoned("dilstore-test-") == []
    assert (folder / "part.jsonl").is_file()


@pytest.mark.parametrize("where", ["missing", "a file", "read-only"])
def test_a_tmpdir_that_is_no_writable_folder_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Python's tempfile passed over such a TMPDIR for /tmp without a word: a run told to keep its scratch on a big
    volume filled the small root file system instead (env57 F4)."""
    configured = tmp_path / "scratch"
    if where == "a file":
        configured.write_text("", encoding="utf-8")
    elif where == "read-only":  # os.access says so on a read-only mount, for root too; chmod does not stop root
        configured.mkdir()
        monkeypatch.setattr(scratch.os, "access", lambda path, mode: not (Path(path) == configured and
                                                                          mode & os.W_OK))  # (mut57c) write alone
    monkeypatch.setenv("TMPDIR", str(configured))
    why = {"missing": "does not exist", "a file": "is a file, not a folder", "read-only": "is not writable"}[where]
    with pytest.raises(DilstoreError, match=f"^TMPDIR={re.escape(str(configured))} {why}"), scratch_dir("dilstore-t-"):
        pass
    assert not list(tmp_path.glob("dilstore-t-*"))


def test_a_full_tmpdir_says_it_is_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`index` on a full $TMPDIR said only "No space left on device: /tmp/dilstore-collection-x1/part-00000.jsonl"
    (env57 F4). A full disk elsewhere (the store's) stays as it was."""
    monkeypatch.delenv("TMPDIR", raising=False)
    room = r"\(the temporary folder .*, \$TMPDIR\): set TMPDIR to a folder with room"
    with pytest.raises(DilstoreError, match=room) as full, scratch_dir("dilstore-t-") as folder:
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "part-00000.jsonl"))
    assert f"(the temporary folder {folder.parent}, $TMPDIR)" in str(full.value)  # TMPDIR, not the scratch (mut57c)
    with pytest.raises(OSError, match="^\\[Errno 28\\] No space left on device$"), scratch_dir("dilstore-t-"):
        raise OSError(errno.ENOSPC, "No space left on device")  # names no file: not told to be TMPDIR's (mut57c)
    with pytest.raises(OSError, match="No space left on device"), scratch_dir("dilstore-t-"):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "store" / "bm25"))
