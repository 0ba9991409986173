"""`dilstore compact` stopped by a file size limit (read56 F3)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.storage.test_store_compact import appended_store, records


def test_a_compaction_stopped_by_a_file_size_limit_says_to_raise_it_not_to_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """EFBIG (a file past `ulimit -f`) is one of the errors `compact` reports as a want of room, and its line said
    "free space on that disk, or give --output on another disk", which changes nothing for a size limit (read56 F3).
    It says to raise the limit, as precompute, the journal and training do."""
    import shutil

    from dilstore.runners import cli
    from dilstore.storage import file_errors

    store = appended_store(tmp_path / "store", [records(["a", "b"], 1)], records(["c"], 2), encoding="fp32")
    (store / "notes.txt").write_text("mine\n", encoding="utf-8")
    real_copy = shutil.copy2

    def too_large(source: object, destination: object, **options: object) -> None:
        if str(destination).endswith("notes.txt"):
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(source))
        real_copy(source, destination, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(file_errors.shutil, "copy2", too_large)
    assert cli.main(["compact", str(store), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert os.strerror(errno.EFBIG) in err and "(`ulimit -f`)" in err and "raise the limit" in err, err
    assert "free space" not in err
