"""The command `dilstore compact` gives for an --output that lacks its BM25 index (read56 F4)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from tests.storage.test_store_compact import appended_store, records


def test_the_index_command_for_an_output_with_a_space_is_quoted_for_the_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `compact --output DIR` whose copy lacks STORE's BM25 index says to run `dilstore index DIR`; a DIR with a
    space was written bare (`dilstore index my copy`), a command that, pasted, indexes a store named "my" and fails
    on "copy" (read56 F4). It is quoted as `shlex` quotes the copy's own command."""
    from dilstore.reader.retrieval import INDEX_RECORD, bm25_index_dir, indexed_state
    from dilstore.runners import cli
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    store = appended_store(tmp_path / "store", [records(["a", "b"], 1)], records(["c"], 2), encoding="fp32")
    index = bm25_index_dir(store)
    index.mkdir()
    (index / "segments_1").write_bytes(b"lucene")
    (index / INDEX_RECORD).write_text(json.dumps(indexed_state(read_manifest(StoreLocation.parse(store)))),
                                      encoding="utf-8")  # fmt: skip
    output = tmp_path / "my copy"
    assert cli.main(["compact", str(store), "--output", str(output), "--no-progress"]) == 0
    shutil.rmtree(bm25_index_dir(output))
    capsys.readouterr()
    assert cli.main(["compact", str(store), "--output", str(output), "--no-progress"]) == 2
    said = capsys.readouterr().err
    assert f"run `dilstore index {shlex.quote(str(output))}`" in said, said


def test_an_in_place_compaction_of_a_store_this_user_could_not_delete_is_refused_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(perm57 F4) An in-place compaction of another user's store (or one `chmod -R a-w`) in a folder this user may
    write said it compacted the store, and left the old one's whole copy hidden at .STORE.dilstore-replaced, which
    its deletion could not remove; every later write of the store then failed. Refused now before any work, with
    nothing written. Root deletes anything, so the refusal is what os.access answers here."""
    import os

    from dilstore.runners import cli

    store = appended_store(tmp_path / "store", [records(["a", "b"], 1)], records(["c"], 2), encoding="fp32")
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    real, locked = os.access, store / "shards"
    monkeypatch.setattr(os, "access", lambda path, mode, **given: Path(path) != locked and real(path, mode, **given))
    assert cli.main(["compact", str(store), "--no-progress"]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"dilstore compact: error: {store} cannot be replaced by this user: its folder {locked} is "
                           "not writable by it"), said  # fmt: skip
    assert "--output writes the compacted store elsewhere" in said and said.count("\n") == 1
    assert sorted(str(path) for path in tmp_path.rglob("*")) == before
