"""A store on a read-only filesystem opens and serves, and reading writes nothing beside it.

Tests here may run as root, for whom `chmod a-w` stops no write. So the proof
does not rest on permissions: a Python audit hook records every write the
process attempts under the stores' folder (opening a file for writing,
mkdir, rename, remove, chmod, utime, a writable memory map), and the folder's
listing with every size and mtime must be unchanged afterwards. Where the
tests do not run as root, the folders are also made read-only for real.
"""

from __future__ import annotations

import mmap
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.serving.odqa import OdqaSettings, OpenDomainReader
from dilstore.runners.cli import main
from dilstore.storage.info import store_info
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.odqa_fixtures import write_reader_and_store
from tests.reader.serving.test_rerank import FIRST_STAGE, save_ranker, write_earl_store, write_inputs
from tests.runners.test_ask import GOOD, OneHitSearcher

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.chown", "os.utime", "os.truncate", "os.link",
                "os.symlink", "shutil.rmtree", "shutil.copyfile", "shutil.move"}  # fmt: skip
_watched: list[tuple[Path, list[str]]] = []  # (folder, writes seen under it) while a `no_writes_under` block runs


def _under(path: Any, folder: Path) -> bool:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # a file descriptor: nothing to place
    return Path(os.fsdecode(path)).resolve().is_relative_to(folder)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Record writes under the watched folder (installed once; idle when nothing is watched)."""
    if not _watched:
        return
    folder, seen = _watched[-1]
    if event == "open":
        path, mode, flags = args
        writing = any(letter in mode for letter in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
        if writing and _under(path, folder):
            seen.append(f"open {path} {mode or flags}")
    elif event in ("os.rename", "os.replace") and (_under(args[0], folder) or _under(args[1], folder)):
        seen.append(f"{event} {args[0]} -> {args[1]}")
    elif event in _PATH_EVENTS and args and (_under(args[0], folder) or (len(args) > 1 and _under(args[1], folder))):
        seen.append(f"{event} {args[0]}")
    elif event == "mmap.__new__" and args[2] not in (mmap.ACCESS_READ,) and args[0] != -1:
        seen.append(f"writable mmap of fd {args[0]} (access {args[2]})")


sys.addaudithook(_audit)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under `folder` (the folder's own listing included) with its size and mtime in nanoseconds."""
    entries = {".": (0, folder.stat().st_mtime_ns)}
    for path in sorted(folder.rglob("*")):
        status = path.lstat()
        entries[str(path.relative_to(folder))] = (status.st_size if path.is_file() else 0, status.st_mtime_ns)
    return entries


@contextmanager
def no_writes_under(folder: Path) -> Iterator[list[str]]:
    """Watch `folder` (read-only for real unless running as root); yields the writes seen, which must be none."""
    folder = folder.resolve()
    before = snapshot(folder)
    modes = {path: path.stat().st_mode for path in [folder, *folder.rglob("*")]}
    if os.geteuid() != 0:
        for path, mode in modes.items():
            path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    seen: list[str] = []
    _watched.append((folder, seen))
    try:
        yield seen
    finally:
        _watched.pop()
        for path, mode in sorted(modes.items(), key=lambda item: len(item[0].parts)):
            path.chmod(mode)
    assert seen == [], f"reading wrote beside the store: {seen}"
    assert snapshot(folder) == before, "the stores' folder changed while it was only read"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dilbert store with its reader, and an EARL S1 store with its ranker, side by side in one folder."""
    root = tmp_path_factory.mktemp("read-only")
    model_dir, store_dir, _ = write_reader_and_store(root / "qa")
    ranker_dir = save_ranker(root / "ranker", seed=0)
    from dilstore.reader.modeling.earl import EarlRanker

    earl = write_earl_store(root / "stores" / "earl-s1", EarlRanker.from_pretrained(ranker_dir), "earl-s1", "fp16")
    qa = store_dir.rename(root / "stores" / "qa")
    return {"folder": root / "stores", "qa": qa, "earl": earl, "reader": model_dir, "ranker": ranker_dir}


def test_info_verify_and_fetch_write_nothing(stores: dict[str, Path], capsys) -> None:
    expected = {read_path: open_store(stores["qa"], read_path=read_path).fetch(["tram#0", "kili#0"])
                for read_path in ("mmap", "ranged", "zarr")}  # fmt: skip
    with no_writes_under(stores["folder"]):
        for read_path, passages in expected.items():
            store = open_store(stores["qa"], read_path=read_path)
            assert [passage.text for passage in store.fetch(["tram#0", "kili#0"])] == [p.text for p in passages]
        assert store_info(stores["earl"])["passages"] == 6
        assert verify_store(stores["earl"]).ok
        assert main(["info", str(stores["qa"]), "--json"]) == 0
        assert main(["verify", str(stores["qa"])]) == 0
    assert capsys.readouterr().out.endswith("OK\n")


def test_ask_and_rerank_write_nothing(stores: dict[str, Path], tmp_path: Path, capsys) -> None:
    arguments = write_inputs(tmp_path, FIRST_STAGE)  # the run is written outside the stores' folder
    with no_writes_under(stores["folder"]):
        odqa = OpenDomainReader(DilBertReader.from_pretrained(stores["reader"]), open_store(stores["qa"]),
                                OneHitSearcher(), OdqaSettings())  # fmt: skip
        assert odqa.answer(GOOD).to_dict()["passage_id"] == "tram#0"
        status = main(["rerank", str(stores["earl"]), *map(str, arguments), "--model", str(stores["ranker"]),
                       "--threads", "1", "--json"])  # fmt: skip
        assert status == 0, capsys.readouterr().err
    assert (tmp_path / "out.trec").read_text().count("dilstore-earl") == sum(map(len, FIRST_STAGE.values()))


def test_the_watch_sees_a_lock_file_beside_a_store(stores: dict[str, Path]) -> None:
    """The check above can fail: a lock file created beside a store is caught (or refused, when not root)."""
    lock = stores["folder"] / ".qa.dilstore-lock"
    with pytest.raises((AssertionError, PermissionError), match="wrote beside the store|Permission denied"):
        with no_writes_under(stores["folder"]):
            lock.open("w").close()
    lock.unlink(missing_ok=True)


def test_a_bm25_folder_this_user_cannot_list_is_named_not_called_missing(tmp_path: Path, monkeypatch) -> None:
    """(perm57 F2) A BM25 index folder another account made unreadable (`chmod 000`) globbed as empty: `ask` said "no
    Lucene index at STORE/bm25: build it with `dilstore index`" of an index that was there, `verify` passed over it
    and said OK, and `serve` served a rerank store without its index. Root lists any folder, so the refusal is what
    os.listdir raises here."""
    from dilstore.reader.retrieval import Bm25Searcher, require_index_files
    from dilstore.runners.cmd_serve import served_index
    from dilstore.runners.cmd_store import bm25_problems
    from dilstore.storage.errors import DilstoreError

    index = tmp_path / "store" / "bm25"
    index.mkdir(parents=True)
    (index / "segments_1").write_bytes(b"")
    real = os.listdir

    def listdir(path: Any = ".") -> list[str]:
        if Path(path) == index:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    said = f"cannot read the BM25 index folder {index}: Permission denied; the folder and its files must be readable"
    with pytest.raises(DilstoreError, match=said):
        require_index_files(index, index.parent, given=False, local_root=index.parent)
    with pytest.raises(DilstoreError, match=said):
        Bm25Searcher(index)
    with pytest.raises(DilstoreError, match=said):
        served_index("earl", str(index.parent), "earl-s1", None)
    assert [problem.startswith(said) for problem in bm25_problems(str(index.parent)) or []] == [True]
