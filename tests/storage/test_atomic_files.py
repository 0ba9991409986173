"""storage/atomic_files.py: whole files or nothing, with the mode the umask gives any new file."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.atomic_files import atomic_write_bytes, atomic_write_text
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
    with pytest.raises(FileNotFoundError):
        atomic_write_bytes(tmp_path / "nowhere" / "run.trec", b"x", create_parents=False)


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
