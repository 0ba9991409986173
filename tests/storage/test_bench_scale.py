"""benchmarks/bench_scale.py's builder makes a real store: it verifies, and fetches what was written.

The scale benchmark builds its stores with the project's writer and finalize;
this runs its builder and in-process measurement at a tiny N (2,000 passages,
2 shards) so the benchmark code cannot silently rot.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from dilstore.storage.codebook import read_codebook
from dilstore.storage.encodings import get_encoding
from dilstore.storage.format import CODEBOOK_DIR
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.paths import ROOT

PASSAGES, PER_SHARD, SEED = 2_000, 1_000, 3


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "benchmarks" / "bench_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("encoding", ["1bit", "fp16"])
def test_builder_store_verifies_and_fetches_what_was_written(bench, tmp_path: Path, encoding: str) -> None:
    root = tmp_path / "store"
    build = bench.build_store(root, PASSAGES, PER_SHARD, encoding, seed=SEED, pool_tokens=4096)
    assert (build["passages"], build["shards"]) == (PASSAGES, 2)
    report = verify_store(root)
    assert report.ok, report.problems
    assert (report.passages, report.shards, report.tokens) == (PASSAGES, 2, build["tokens"])

    # The builder's records again, from the same seeds, then compare a few across both shards.
    pool = bench.state_pool(4096, SEED)
    rng = np.random.default_rng(SEED + 1)
    records = [record for first in range(0, PASSAGES, PER_SHARD)
               for record in bench.shard_records(first, PER_SHARD, pool, rng)]
    assert {len(record.token_ids) for record in records} <= set(range(bench.MIN_TOKENS, bench.MAX_TOKENS + 1))
    chosen = [records[i] for i in (0, 999, 1000, 1999, 1234)]
    encoder = get_encoding(encoding)
    codebook = read_codebook(root / CODEBOOK_DIR, encoding)[0] if encoder.codebook else None
    with open_store(root) as store:
        fetched = store.fetch([record.id for record in chosen])
        for record, passage in zip(chosen, fetched, strict=True):
            assert passage.id == record.id and passage.text == record.text
            np.testing.assert_array_equal(passage.token_ids, record.token_ids)
            expected = encoder.decode(encoder.encode(np.asarray(record.states, dtype=np.float32), codebook))
            np.testing.assert_array_equal(passage.states, expected.astype(passage.states.dtype))


def test_measure_open_and_report_run_on_a_tiny_store(bench, tmp_path: Path) -> None:
    root = tmp_path / "store"
    bench.build_store(root, PASSAGES, PER_SHARD, "1bit", seed=SEED, pool_tokens=4096)
    opened = bench.measure_open(root, PASSAGES, lookups=20, fetch=10, seed=0, drop_cache=False)
    assert opened["fetch_passages"] == 10 and opened["open_s"] > 0 and not opened["fetch_first_is_cold"]
    disk = bench.disk_sizes(root)
    assert disk["index_bytes"] >= 16 * PASSAGES and disk["manifest_bytes"] > 0
    store = {"passages": PASSAGES, "tokens": 160_000, "shards": 2, "open": opened, "disk": disk,
             "build": {"write_s": 1.0, "finalize_s": 1.0}}
    result = {"stores": [store], "extrapolation": bench.extrapolate([store], PER_SHARD), "cost": bench.cost_table(12)}
    assert result["cost"]["1bit"]["state_bytes_per_token"] == 384 // 8 + 2
    assert result["cost"]["fp16"]["state_bytes_per_token"] == 768
    assert "EXTRAPOLATION" in bench.render(result)
