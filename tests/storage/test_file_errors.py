"""A full disk's errors name the file: a failed write, fsync or truncate carries no name (full49 F4)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dilstore.storage import atomic_files, collection
from dilstore.storage import write_lock as write_lock_module
from dilstore.storage.atomic_files import atomic_write_bytes
from dilstore.storage.file_errors import naming
from dilstore.storage.write_lock import write_lock


def full_disk(*_: object, **__: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_an_error_without_a_name_is_raised_again_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(OSError) as raised, naming(tmp_path / "out.json"):
        full_disk()
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(tmp_path / "out.json"))
    assert str(raised.value) == f"[Errno {errno.ENOSPC}] No space left on device: '{tmp_path / 'out.json'}'"
    assert isinstance(raised.value.__cause__, OSError)


def test_an_error_that_names_its_file_passes_unchanged(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as raised, naming(tmp_path / "other"):
        (tmp_path / "absent").read_bytes()
    assert raised.value.filename == str(tmp_path / "absent")


@pytest.mark.parametrize("call", ["fchmod", "fsync"])
def test_an_atomic_write_on_a_full_disk_names_the_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    target = tmp_path / "predictions.json"
    target.write_bytes(b"old")
    descriptors = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else None
    monkeypatch.setattr(atomic_files.os, call, full_disk)  # the first and the last call on the open temporary
    with pytest.raises(OSError) as raised:
        atomic_write_bytes(target, b"new", named_by_user=True)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(target))
    if descriptors is not None:  # a failed fchmod left the temporary's descriptor open (review49 F6)
        assert len(os.listdir("/proc/self/fd")) == descriptors
    assert [entry.name for entry in tmp_path.iterdir()] == ["predictions.json"] and target.read_bytes() == b"old"


def test_a_lock_that_cannot_record_its_pid_names_the_lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_lock_module.os, "pwrite", full_disk)
    with pytest.raises(OSError) as raised, write_lock(tmp_path / "out"):
        pass
    assert raised.value.filename == str(write_lock_module.lock_path(tmp_path / "out", write_lock_module.WRITE_ROLE))


def test_the_scratch_collection_on_a_full_disk_names_its_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dilstore index` copies the live collection into $TMPDIR: a full $TMPDIR was "No space left on device" alone,
    while the store's own disk had room."""
    monkeypatch.setattr(collection, "_live_parts", lambda store: iter([(store / "part-00000.jsonl", ["{}\n"])]))
    with monkeypatch.context() as patched:
        patched.setattr(Path, "write_text", full_disk)
        with pytest.raises(OSError) as raised:
            collection.write_live_collection(tmp_path / "store", tmp_path / "scratch")
    assert raised.value.filename == str(tmp_path / "scratch" / "part-00000.jsonl")


def test_a_tree_copied_to_a_full_disk_stops_at_the_first_file_naming_where_it_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """shutil.copytree went on past a failed file and raised one shutil.Error of every file's error as text (a
    1,000-character line of tuples from `dilstore compact`), and shutil's copy names the file it read, not the
    one it could not write (disk56 F3). A folder that cannot be made is named as itself."""
    from dilstore.storage import file_errors
    from dilstore.storage.file_errors import copy_file, copy_tree

    source = tmp_path / "index"
    (source / "sub").mkdir(parents=True)
    for name in ("a", "b", "sub/c"):
        (source / name).write_text(name)
    tried = []

    def full_copy(from_path: object, to_path: object, **_: object) -> None:
        tried.append(to_path)  # sendfile's error names both files, the source first
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(from_path), None, str(to_path))

    with monkeypatch.context() as patch:
        patch.setattr(file_errors.shutil, "copy2", full_copy)
        with pytest.raises(OSError) as raised:
            copy_tree(source, tmp_path / "copy")
        assert type(raised.value) is OSError and len(tried) == 1
        assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(tried[0]))
        with pytest.raises(OSError) as raised:
            copy_file(source / "a", tmp_path / "a-copy")
        assert raised.value.filename == str(tmp_path / "a-copy")
    real_makedirs = os.makedirs

    def no_room_for_a_folder(name: object, *args: object, **kwargs: object) -> None:
        if str(name).endswith("sub"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(name))
        real_makedirs(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "makedirs", no_room_for_a_folder)
    with pytest.raises(OSError) as raised:
        copy_tree(source, tmp_path / "again")
    assert (raised.value.errno, raised.value.strerror, raised.value.filename) == (
        errno.ENOSPC, "No space left on device", str(tmp_path / "again" / "sub"))


def test_a_codebook_written_on_a_full_disk_names_its_folder_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2bit/1bit `precompute` (or `train qa --store-encoding 2bit`) whose codebook met a full disk ended in
    "error: No space left on device" alone: zarr's writes name no file (disk56 F7)."""
    import numpy as np

    from dilstore.storage import codebook as codebook_module
    from dilstore.storage.encodings import train_codebook

    codebook = train_codebook("2bit", np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32))
    monkeypatch.setattr(codebook_module, "write_array", full_disk)
    with pytest.raises(OSError) as raised:
        codebook_module.write_codebook(tmp_path / "codebook", "2bit", codebook, (8,))
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(tmp_path / "codebook"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_copy_short_of_room_names_the_destination_for_every_kind_of_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A full quota or a file size limit is named by the file that could not be written, as a full disk is: the
    source, the store's own file, is not where room is missing (mut56b M36). Another error passes as it came."""
    from dilstore.storage import file_errors
    from dilstore.storage.file_errors import copy_file

    def no_room(source: object, destination: object, **_: object) -> None:
        raise OSError(code, os.strerror(code), str(source), None, str(destination))

    monkeypatch.setattr(file_errors.shutil, "copy2", no_room)
    with pytest.raises(OSError) as raised:
        copy_file(tmp_path / "a", tmp_path / "b")
    assert (raised.value.errno, raised.value.filename) == (code, str(tmp_path / "b"))

    def unreadable(source: object, destination: object, **_: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(source))

    monkeypatch.setattr(file_errors.shutil, "copy2", unreadable)
    with pytest.raises(OSError) as raised:
        copy_file(tmp_path / "a", tmp_path / "b")
    assert (raised.value.errno, raised.value.filename) == (errno.EIO, str(tmp_path / "a"))
