"""Store folders whose names URL parsers read more into: written and read at the folder the name says."""

from __future__ import annotations

from pathlib import Path

import pytest

from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.store_fixtures import build_store, random_shards


@pytest.mark.parametrize("name", ["run::2", "data:v1", "~/st"])
def test_a_store_named_like_a_url_is_written_and_read_at_that_folder(tmp_path: Path, monkeypatch, name: str) -> None:
    """(port58 F1) zarr wrote `run::2`'s shards into `run:` (an fsspec chain), failing a whole precompute at its first
    shard's write, and the readers took `data:v1` for a data URL and `~/st` for $HOME's `st`: `info`, `verify`,
    `ask` and `serve` said "no store", or read another store, at the folder precompute had filled."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    build_store(home / "st", random_shards([1], seed=1))  # the store `~/st` read before: another one
    monkeypatch.setenv("HOME", str(home))
    shards = random_shards([2, 1])
    build_store(Path(name), shards)
    with open_store(name) as store:
        assert len(store) == 3
        assert store.fetch([shards[1][0].id])[0].text == shards[1][0].text
    assert verify_store(name).ok
