"""replace_dir: a finished folder takes a folder's place with a whole one, old or new, there throughout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dilstore.storage import durability
from dilstore.storage.durability import replace_dir


def folder(path: Path, name: str) -> Path:
    path.mkdir()
    (path / name).write_text(name, encoding="utf-8")
    return path


@pytest.mark.parametrize("durable", [True, False])
def test_the_old_folder_is_whole_at_one_of_the_names_until_the_new_one_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
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
    replace_dir(finished, target, durable=durable)
    assert renames == [True, True]
    assert [path.name for path in tmp_path.iterdir()] == ["bm25"] and (target / "new").read_text() == "new"


def test_a_folder_with_nothing_at_its_target_is_renamed_there(tmp_path: Path) -> None:
    replace_dir(folder(tmp_path / "built", "new"), tmp_path / "bm25")
    assert [path.name for path in tmp_path.iterdir()] == ["bm25"] and (tmp_path / "bm25" / "new").is_file()
