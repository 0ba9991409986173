"""A memory-mapped store whose files change under an open reader (`check_files`, which `serve` turns on): an
error naming the file, never a SIGBUS.

A map shows the file as it is now. A file cut short under it made the next read a SIGBUS, which killed the
process (`serve`, with every store it served); bytes written in place were read as states. Each case runs in a
child process, so that a SIGBUS fails the test instead of killing the test worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dilstore.storage.format import StoreChangedError
from dilstore.storage.mapped import WatchedFile, check_unchanged
from tests.fixtures.paths import ROOT
from tests.fixtures.store_fixtures import build_store, random_shards

# Opens the store, fetches every passage (mapping both shards and the id index), damages FILE as DAMAGE says,
# then fetches again and prints the error's type and message.
CHILD = textwrap.dedent("""
    import os, shutil, sys, time
    from pathlib import Path
    from dilstore.storage.reader import open_store
    root, relative, damage = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    ids = sys.argv[4:]
    store = open_store(root, read_path="mmap", check_files=True)
    before = store.fetch(ids)
    target = root / relative
    time.sleep(0.05)  # past the file system's timestamp granularity
    if damage == "cut":
        os.truncate(target, 100)
    elif damage == "written":
        with open(target, "r+b") as file:
            file.write(b"\\x7b" * 64)
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
        print(type(error).__name__, error)
    else:
        print("read", all((a.states == b.states).all() for a, b in zip(after, before)))
""")


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
    store: tuple[Path, list[str]], tmp_path: Path, relative: str, damage: str
) -> None:
    root, ids = store
    copy = tmp_path / "store"
    subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
    done = subprocess.run([sys.executable, "-c", CHILD, str(copy), relative, damage, *ids],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0, f"the reader died (status {done.returncode}): {done.stderr[-2000:]}"
    if damage in ("untouched", "deleted"):  # a deleted file stays whole in its map: read as it was (appends)
        assert done.stdout.strip() == "read True"
        return
    if damage.startswith("store"):  # its maps read on, but a shard not opened yet could not be (crash40 M4)
        assert done.stdout.strip() == (f"StoreChangedError {copy / 'manifest.json'} is gone: the store was moved or "
                                       "deleted under this reader; open it where it is now")  # fmt: skip
        return
    change = {"cut": "cut or grown from", "written": "written to in place"}[damage]
    assert done.stdout.startswith(f"StoreChangedError {copy / relative} was {change}"), done.stdout
    assert "after the store was opened" in done.stdout and "open it again" in done.stdout


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
