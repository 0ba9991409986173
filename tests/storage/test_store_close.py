"""Store.close(): a closed store refuses lookups instead of quietly opening its files again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.errors import DilstoreError
from dilstore.storage.reader import open_store
from tests.fixtures.store_fixtures import build_store, passage


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return build_store(tmp_path / "store", [[passage("a", 4, (8,), rng)], [passage("b", 3, (8,), rng)]])


@pytest.mark.parametrize("read_path", ["mmap", "zarr"])
def test_a_closed_store_refuses_every_lookup_and_returned_arrays_stay_valid(store_path: Path, read_path: str) -> None:
    store = open_store(store_path, read_path=read_path)
    fetched = store.fetch(["a", "b"])
    states = fetched[0].states.copy()
    store.close()
    for lookup in (lambda: store.fetch(["a"]), lambda: "a" in store, lambda: store.shard(0)):
        with pytest.raises(DilstoreError, match=r"store .* is closed; open it again"):
            lookup()
    assert np.array_equal(fetched[0].states, states)  # what was returned before still reads


@pytest.mark.parametrize("read_path", ["mmap", "zarr"])
def test_a_closed_store_says_it_is_closed_to_len_checks_and_its_codebook(store_path: Path, read_path: str) -> None:
    """(left55 F8) Closed, `check_unchanged()` passed (no shard open: nothing to compare), `codebook()` loaded the
    codebook again (here: said the store's encoding has none) and `len()` answered, as if the store were open."""
    store = open_store(store_path, read_path=read_path)
    store.fetch(["a"])
    store.check_unchanged()
    assert len(store) == 2
    store.close()
    for lookup in (store.check_unchanged, store.codebook, lambda: len(store)):
        with pytest.raises(DilstoreError, match=r"^store .* is closed; open it again to read from it$"):
            lookup()
    assert store.url and store.manifest.passages == 2  # what it is stays known, for messages


def test_with_closes_the_store_and_a_new_open_reads_again(store_path: Path) -> None:
    with open_store(store_path) as store:
        assert [p.id for p in store.fetch(["b", "a"])] == ["b", "a"]
    with pytest.raises(DilstoreError, match="is closed"):
        store.fetch(["a"])
    with open_store(store_path) as again:
        assert "a" in again and len(again) == 2


@pytest.mark.parametrize("index", [7, "a", None])
def test_a_shard_the_store_lacks_is_named_with_the_shards_it_has(store_path: Path, index: object) -> None:
    """`store.shard('a')` said "the id index points to shard a", blaming the store for the caller's index
    (readme37 L9)."""
    with open_store(store_path) as store, pytest.raises(DilstoreError) as raised:
        store.shard(index)
    assert str(raised.value) == f"store {store.url} has no shard {index!r}: its manifest lists shards 0, 1"
