"""Many readers at once: threads sharing one Store, spawned processes opening their own, forked children."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.reader import Store, open_store
from dilstore.storage.records import PassageRecord, StoredPassage
from tests.fixtures.paths import ROOT
from tests.fixtures.store_fixtures import build_store, random_shards

READ_PATHS = ("mmap", "ranged", "zarr")


def _digest(passage_id: str, text: str, token_ids: np.ndarray, states: np.ndarray) -> str:
    digest = hashlib.sha256(passage_id.encode() + text.encode())
    digest.update(np.ascontiguousarray(token_ids, dtype=np.int32).tobytes())
    digest.update(np.ascontiguousarray(states, dtype=np.float32).tobytes())
    return digest.hexdigest()


def _digests(passages: list[StoredPassage]) -> list[str]:
    return [_digest(p.id, p.text, p.token_ids, p.states) for p in passages]


def _open_and_fetch(job: tuple[str, str, list[str]]) -> list[str]:
    """Run in a spawned process: open the store there and fetch."""
    root, read_path, ids = job
    return _digests(open_store(root, read_path=read_path).fetch(ids))


_INHERITED: dict[str, Store] = {}


def _fetch_inherited(job: tuple[str, list[str]]) -> list[str]:
    """Run in a forked process: fetch through the Store the parent opened before forking."""
    read_path, ids = job
    return _digests(_INHERITED[read_path].fetch(ids))


@pytest.fixture(scope="module")
def records() -> list[list[PassageRecord]]:
    return random_shards([6, 5, 7, 4], state_shape=(6,), seed=11, max_words=20)


@pytest.fixture(scope="module")
def root(records, tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("concurrent") / "store", records)


@pytest.fixture(scope="module")
def expected(records) -> dict[str, str]:
    return {r.id: _digest(r.id, r.text, r.token_ids, r.states) for shard in records for r in shard}


def _batches(ids: list[str], count: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [list(rng.choice(ids, size=int(rng.integers(1, 12)))) for _ in range(count)]


@pytest.mark.parametrize("read_path", READ_PATHS)
def test_threads_share_one_store_even_while_shards_are_evicted(root, expected, read_path) -> None:
    store = open_store(root, read_path=read_path, max_open_shards=2)  # threads keep reopening shards
    batches = _batches(sorted(expected), 32, seed=1)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda ids: _digests(store.fetch(ids)), batches))
    for ids, digests in zip(batches, results, strict=True):
        assert digests == [expected[passage_id] for passage_id in ids]
    assert len(store.manifest.shards) == 4 and len(store._shards) <= 2, "the open shards stay within the bound"


def test_spawned_processes_open_and_read_the_store(root, expected) -> None:
    batches = _batches(sorted(expected), 2, seed=2)
    jobs = [(str(root), read_path, ids) for read_path in READ_PATHS for ids in batches]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_open_and_fetch, jobs)
    for (_, _, ids), digests in zip(jobs, results, strict=True):
        assert digests == [expected[passage_id] for passage_id in ids]


def _fork_and_fetch(root: Path, expected: dict[str, str]) -> None:
    """Open the store once per read path, fetch, then fetch through it in forked children."""
    for read_path in READ_PATHS:
        _INHERITED[read_path] = open_store(root, read_path=read_path)
        _INHERITED[read_path].fetch(sorted(expected)[:3])  # shards opened, zarr's event loop running
    batches = _batches(sorted(expected), 4, seed=3)
    jobs = [(read_path, ids) for read_path in READ_PATHS for ids in batches]
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map(_fetch_inherited, jobs)
    finally:
        _INHERITED.clear()
    for (_, ids), digests in zip(jobs, results, strict=True):
        assert digests == [expected[passage_id] for passage_id in ids]


# The fork, from a fresh interpreter (no JVM in it): argv[1] the store, argv[2] the digests as JSON.
FORK_CHILD = (
    "import json, sys; from pathlib import Path\n"
    "from tests.storage.test_store_concurrency import _fork_and_fetch\n"
    "_fork_and_fetch(Path(sys.argv[1]), json.loads(sys.argv[2]))\n"
)


def test_forked_processes_read_through_a_store_opened_before_the_fork(root, expected) -> None:
    if "jnius" in sys.modules:
        # An earlier test on this worker started the JVM (pyserini), and a process must never fork after
        # that (the child can hang on a lock the JVM held): fork from a fresh interpreter instead.
        done = subprocess.run([sys.executable, "-c", FORK_CHILD, str(root), json.dumps(expected)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return
    _fork_and_fetch(root, expected)
