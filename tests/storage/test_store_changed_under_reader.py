"""A memory-mapped store whose files change under an open reader (`check_files`, which `serve` turns on): an
error naming the file, never a SIGBUS.

A map shows the file as it is now. A file cut short under it made the next read a SIGBUS, which killed the
process (`serve`, with every store it served); bytes written in place were read as states. The cases run in a
child process, so that a SIGBUS fails the test instead of killing the test worker: one child runs them one after
another, each on its own copy of the store, as `serve` reads many stores in one process; a case that kills it
fails, and the next case starts a new one.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dilstore.storage.format import StoreChangedError
from dilstore.storage.mapped import WatchedFile, check_unchanged
from tests.fixtures.paths import ROOT
from tests.fixtures.store_fixtures import build_store, random_shards

# For each line [STORE, FILE, DAMAGE, *IDS] on its standard input: opens the store, fetches every passage (mapping
# both shards and the id index), damages FILE as DAMAGE says, then fetches again and writes one JSON line: the
# error's type and message, or whether the passages read as before.
CHILD = textwrap.dedent("""
    import json, os, shutil, sys, time
    from pathlib import Path
    from dilstore.storage.reader import open_store

    def case(root, relative, damage, ids):
        store = open_store(root, read_path="mmap", check_files=True)
        before = store.fetch(ids)
        target = root / relative
        time.sleep(0.05)  # past the file system's timestamp granularity
        if damage == "cut":
            os.truncate(target, 100)
        elif damage == "written":
            with open(target, "r+b") as file:
                file.write(b"\x7b" * 64)
        elif damage == "deleted":
            target.unlink()
        elif damage == "store moved":
            root.rename(root.with_name("moved"))
        elif damage == "store deleted":
            shutil.rmtree(root)
        else:
            target.rename(root / "aside")
            (root / "aside").rename(target)  # the same file back: nothing changed
        try:
            after = store.fetch(ids)
        except Exception as error:
            return f"{type(error).__name__} {error}"
        return f"read {all((a.states == b.states).all() for a, b in zip(after, before))}"

    for line in sys.stdin:
        root, relative, damage, *ids = json.loads(line)
        print(json.dumps(case(Path(root), relative, damage, ids)), flush=True)
""")
WAIT_SECONDS = 120  # for one case's answer


class CaseReader:
    """The child that runs CHILD's cases; started at the first case and again after a case it died in."""

    def __init__(self, stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        self.process: subprocess.Popen[str] | None = None

    def run(self, root: Path, relative: str, damage: str, ids: list[str]) -> str:
        """The child's answer to one case; fails the test, with the child's stderr, when it died or said nothing."""
        if self.process is None or self.process.poll() is not None:
            with self.stderr_path.open("w") as stderr:
                self.process = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT)  # fmt: skip
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps([str(root), relative, damage, *ids]) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], WAIT_SECONDS)
        line = self.process.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        self.process.kill()
        status = self.process.wait()
        self.process = None
        pytest.fail(f"the reader died (status {status}): {self.stderr_path.read_text()[-2000:]}")

    def close(self) -> None:
        if self.process is not None:
            self.process.communicate(timeout=WAIT_SECONDS)  # its input ends: it exits


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaseReader]:
    child = CaseReader(tmp_path_factory.mktemp("reader") / "stderr")
    yield child
    child.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    shards = random_shards([40, 40], state_shape=(8,), seed=5, max_words=30)
    root = build_store(tmp_path_factory.mktemp("changed") / "store", shards, encoding="fp16")
    return root, [record.id for shard in shards for record in shard]


STATES = "shards/shard-00001/states/values/c/0/0"


@pytest.mark.parametrize(
    ("relative", "damage"),
    [(STATES, "cut"), ("shards/shard-00000/passages/ids/bytes/c/0", "cut"), ("index/hashes/c/0", "cut"),
     (STATES, "written"), ("index/rows/c/0", "deleted"), (STATES, "deleted"), (STATES, "untouched"),
     (".", "store moved"), (".", "store deleted")],
)  # fmt: skip
def test_a_mapped_file_changed_under_an_open_store_is_a_store_error(
    store: tuple[Path, list[str]], reader: CaseReader, tmp_path: Path, relative: str, damage: str
) -> None:
    root, ids = store
    copy = tmp_path / "store"
    subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
    said = reader.run(copy, relative, damage, ids)
    if damage in ("untouched", "deleted"):  # a deleted file stays whole in its map: read as it was (appends)
        assert said == "read True"
        return
    if damage.startswith("store"):  # its maps read on, but a shard not opened yet could not be (crash40 M4)
        assert said == (f"StoreChangedError {copy / 'manifest.json'} is gone: the store was moved or deleted under "
                        "this reader; open it where it is now")  # fmt: skip
        return
    change = {"cut": "cut or grown from", "written": "written to in place"}[damage]
    assert said.startswith(f"StoreChangedError {copy / relative} was {change}"), said
    assert "after the store was opened" in said and "open it again" in said


@pytest.mark.parametrize(("change", "words"), [
    ("replaced", "replaced by another file"),  # another file of the same size and time: only its inode tells
    ("grown", "cut or grown from 8 to 9 bytes"),  # grown, its time set back: only its size tells
    ("rewritten", "written to in place"),  # same size, same inode: only its time tells
])  # fmt: skip
def test_each_of_inode_size_and_time_alone_tells_a_changed_file(tmp_path: Path, change: str, words: str) -> None:
    """A watched file is found changed by any one of its inode, size or modification time (mut58: without the
    inode check, a file replaced by one of the same size and time, as `cp -p` or `rsync -t` leave it, was read
    on; the child-process cases above change the time too, so they did not notice)."""
    path = tmp_path / "file"
    path.write_bytes(b"12345678")
    status = path.stat()
    watched = WatchedFile.of(path, status)
    if change == "replaced":
        (tmp_path / "other").write_bytes(b"87654321")
        (tmp_path / "other").replace(path)
    elif change == "grown":
        with path.open("ab") as file:
            file.write(b"9")
    else:
        with path.open("r+b") as file:
            file.write(b"x")
    later = status.st_mtime_ns + 10**9 if change == "rewritten" else status.st_mtime_ns
    os.utime(path, ns=(status.st_atime_ns, later))
    assert watched.change() == words
    with pytest.raises(StoreChangedError, match=f"{path} was {words} after the store was opened"):
        check_unchanged([watched])
