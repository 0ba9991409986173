"""benchmarks/bench_rotation.py: the states it codes are the store's own every-N-th passages, too few is a clear
error, and on correlated states its rows show the rotated codes' smaller error at both widths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.records import PassageRecord
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.store_fixtures import build_store

DIMS = 24


@pytest.fixture(scope="module")
def bench_rotation():
    """benchmarks/bench_rotation.py as module `bench_rotation`."""
    with benchmark_module("bench_rotation") as module:
        yield module


def _store(root: Path) -> list[np.ndarray]:
    """A two-shard fp32 store of correlated states (near a 4-dimensional subspace); each passage's states."""
    rng = np.random.default_rng(2)
    basis = rng.standard_normal((4, DIMS)) * np.array([[6], [4], [2], [1]])  # (4, d)
    lengths = rng.integers(20, 40, size=(2, 60))  # (shards, passages)
    shards = [[PassageRecord(id=f"s{shard}-{row:02d}", title="", text="", token_ids=np.arange(n, dtype=np.int32),
                             char_spans=np.full((n, 2), -1, dtype=np.int32),
                             states=(rng.standard_normal((n, 4)) @ basis + 0.2 * rng.standard_normal((n, DIMS))
                                     ).astype(np.float32))  # (n, d)
               for row, n in enumerate(lengths[shard].tolist())] for shard in range(2)]
    build_store(root, shards)
    return [record.states for records in shards for record in records]


def test_it_codes_every_nth_passage_and_rotation_wins_on_correlated_states(bench_rotation, tmp_path: Path,
                                                                          capsys) -> None:
    passages = _store(tmp_path)
    taken = bench_rotation.passage_states(str(tmp_path), 3)
    np.testing.assert_array_equal(taken, np.concatenate(passages[0:60:3] + passages[60:120:3]))
    assert bench_rotation.main([str(tmp_path), "--every", "1", "--sample", "2000", "--held-out", "1000",
                                "--repeats", "1"]) == 0
    rows = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]
    assert set(rows) == {"2bit buckets", "2bit rotated", "1bit buckets", "1bit rotated"}
    for bits in ("2bit", "1bit"):
        assert rows[f"{bits} rotated"]["relative_error"] < 0.7 * rows[f"{bits} buckets"]["relative_error"]
        assert all(rows[f"{bits} {codes}"]["decode_us_per_token"] > 0 for codes in ("rotated", "buckets"))
    with pytest.raises(SystemExit, match="fewer than --sample"):
        bench_rotation.main([str(tmp_path), "--every", "1", "--sample", "100000"])
