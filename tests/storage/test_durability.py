"""replace_dir: a finished folder takes a folder's place with a whole one, old or new, there throughout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dilstore.storage import durability
from dilstore.storage.atomic_files import atomic_write_bytes
from dilstore.storage.durability import replace_dir


def folder(path: Path, name: str) -> Path:
    path.mkdir()
    (path / name).write_text(name, encoding="utf-8")
    return path


def test_the_old_folder_is_whole_at_one_of_the_names_until_the_new_one_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The BM25 rebuild deleted the old index before renaming the new one in: no index at all meanwhile."""
    target = folder(tmp_path / "bm25", "old")
    finished = folder(tmp_path / ".bm25.building", "new")
    renames = []
    real_rename = os.rename

    def observed_rename(source: Path, destination: Path) -> None:
        old_somewhere = any((path / "old").is_file() for path in tmp_path.iterdir())
        renames.append(old_somewhere or (target / "new").is_file())
        real_rename(source, destination)

    monkeypatch.setattr(durability.os, "rename", observed_rename)
    replace_dir(finished, target)
    assert renames == [True, True]
    assert [path.name for path in tmp_path.iterdir()] == ["bm25"] and (target / "new").read_text() == "new"


def test_a_failed_rename_puts_the_old_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old folder was left under its `.tmp-old-` name alone when the new one could not be renamed in."""
    target = folder(tmp_path / "bm25", "old")
    finished = folder(tmp_path / ".bm25.building", "new")
    real_rename = os.rename

    def rename(source: Path, destination: Path) -> None:
        if Path(source) == finished:
            raise KeyboardInterrupt  # what a Ctrl-C between the two renames raises
        real_rename(source, destination)

    monkeypatch.setattr(durability.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        replace_dir(finished, target)
    assert sorted(path.name for path in tmp_path.iterdir()) == [".bm25.building", "bm25"]
    assert (target / "old").read_text() == "old"


def test_an_interrupt_after_the_new_folder_is_in_leaves_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rolled back regardless, the old folder's rename back failed on the new one and hid the interrupt."""
    target = folder(tmp_path / "bm25", "old")
    finished = folder(tmp_path / ".bm25.building", "new")
    real_rename = os.rename

    def rename(source: Path, destination: Path) -> None:
        real_rename(source, destination)
        if Path(source) == finished:
            raise KeyboardInterrupt  # a Ctrl-C just after the rename

    monkeypatch.setattr(durability.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        replace_dir(finished, target)
    assert (target / "new").read_text() == "new"


def test_a_folder_with_nothing_at_its_target_is_renamed_there(tmp_path: Path) -> None:
    replace_dir(folder(tmp_path / "built", "new"), tmp_path / "bm25")
    assert [path.name for path in tmp_path.iterdir()] == ["bm25"] and (tmp_path / "bm25" / "new").is_file()


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_what_stood_at_the_target_is_removed_whatever_it_was(tmp_path: Path, kind: str) -> None:
    """A file or a link at the target was renamed aside and left there: rmtree deletes neither."""
    target = tmp_path / "bm25"
    if kind == "file":
        target.write_text("stray", encoding="utf-8")
    else:
        target.symlink_to(folder(tmp_path / "elsewhere", "kept"))
    replace_dir(folder(tmp_path / "built", "new"), target)
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == (["bm25", "elsewhere"] if kind == "symlink" else ["bm25"])
    assert (target / "new").is_file() and not target.is_symlink()
    if kind == "symlink":
        assert (tmp_path / "elsewhere" / "kept").is_file()  # the link went, not what it pointed to


def disk_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every fsync (with the path its descriptor names) and every rename from now on, in order."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(descriptor: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def renamed(real):
        def rename(source, destination) -> None:
            real(source, destination)
            events.append(("rename", str(destination)))
        return rename

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", renamed(real_rename))
    monkeypatch.setattr(os, "replace", renamed(real_replace))
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's path through /proc")
def test_a_published_folder_reaches_the_disk_before_its_rename_and_the_rename_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's crash safety rests on these calls; removing any of them passed every test (tests39 L1)."""
    target = folder(tmp_path / "bm25", "old")
    finished = folder(tmp_path / ".bm25.building", "new")
    (finished / "sub").mkdir()
    (finished / "sub" / "deep").write_text("deep")
    events = disk_events(monkeypatch)
    replace_dir(finished, target)
    published = events.index(("rename", str(target)))
    flushed = {path for event, path in events[:published] if event == "fsync"}
    assert {str(finished / "new"), str(finished / "sub" / "deep"), str(finished / "sub"), str(finished)} <= flushed
    assert ("fsync", str(tmp_path)) in events[published:], "the rename itself is flushed"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's path through /proc")
def test_an_atomic_file_reaches_the_disk_before_its_rename_and_the_rename_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "manifest.json"
    events = disk_events(monkeypatch)
    atomic_write_bytes(target, b"{}")
    published = events.index(("rename", str(target)))
    assert [event for event, _ in events[:published]] == ["fsync"]  # the temporary file, under its own name
    assert events[published + 1:] == [("fsync", str(tmp_path))]
