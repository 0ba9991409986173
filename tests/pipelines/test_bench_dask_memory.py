"""benchmarks/bench_dask_memory.py's building blocks, at a tiny scale and without a Dask cluster.

The benchmark runs precompute on a LocalCluster (tests/pipelines/test_pipeline_dask.py
already proves Dask = Direct there); this checks the parts that decide what it
reports: the corpus it sizes and writes, the store comparison (which must
catch a changed state and a missing passage), the RSS sampler and the reading
of memory events from worker logs, so the benchmark code cannot silently rot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.store_fixtures import build_store, random_shards


@pytest.fixture(scope="module")
def bench():
    """benchmarks/bench_dask_memory.py as module `bench_dask_memory`."""
    with benchmark_module("bench_dask_memory") as module:
        yield module


def test_corpus_is_sized_by_state_bytes_and_every_word_is_one_token(bench, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from dilstore.reader.modeling.checkpoints import base_model_dir

    limit = 1 << 30
    documents = bench.documents_for(2 * limit, 121)
    assert documents == -(-2 * limit // (121 * 768))
    assert (documents - 1) * 121 * 768 < 2 * limit <= documents * 121 * 768
    assert bench.shards_for(2 * limit, limit) == 64 and bench.shards_for(1, limit) == 2
    plan = bench.plan_for(limit, 2.0, words=120, encoding="fp32")
    assert (plan.documents, plan.shards, plan.tokens_per_document) == (-(-2 * limit // (121 * 1536)), 64, 121)
    assert plan.documents * 121 * 1536 >= 2 * limit and plan.max_length > 121

    paths = bench.write_corpus(tmp_path, 10, words=7, files=3, seed=1)
    rows = [json.loads(line) for path in paths for line in path.read_text(encoding="utf-8").splitlines()]
    assert [len(path.read_text().splitlines()) for path in paths] == [3, 4, 3]
    assert [row["id"] for row in rows] == [f"doc-{n:08d}" for n in range(10)]
    assert all(len(row["text"].split()) == 7 for row in rows)

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir(), local_files_only=True)
    pieces = tokenizer(list(bench.WORDS), add_special_tokens=False)["input_ids"]
    assert [word for word, ids in zip(bench.WORDS, pieces, strict=True) if len(ids) != 1] == []


def test_compare_stores_finds_a_changed_state_and_a_missing_passage(bench, tmp_path: Path) -> None:
    shards = random_shards([5, 4], state_shape=(16,), seed=2)
    same = [build_store(tmp_path / name, shards, encoding="fp16") for name in ("a", "b")]
    report = bench.compare_stores(*same, chunk=3)
    assert report == {"passages": 9, "ids_equal": True, "differing_passages": 0, "first_differing": [],
                      "max_abs_difference": 0.0, "equal": True}  # fmt: skip

    changed = random_shards([5, 4], state_shape=(16,), seed=2)
    record = changed[1][2]
    record.states[-1, 3] += 1.0
    report = bench.compare_stores(same[0], build_store(tmp_path / "changed", changed, encoding="fp16"))
    assert (report["equal"], report["ids_equal"], report["differing_passages"]) == (False, True, 1)
    assert report["first_differing"] == [record.id] and report["max_abs_difference"] >= 0.99

    fewer = random_shards([5, 4], state_shape=(16,), seed=2)
    del fewer[0][0]
    report = bench.compare_stores(same[0], build_store(tmp_path / "fewer", fewer, encoding="fp16"))
    assert (report["equal"], report["ids_equal"], report["differing_passages"]) == (False, False, 0)
    assert bench.state_bytes(same[0]) >= sum(len(r.token_ids) for s in shards for r in s) * 16 * 2


def test_peak_rss_samples_this_process_and_a_child(bench) -> None:
    child = subprocess.Popen([sys.executable, "-c", 'import time; b = b"x" * (64 << 20); time.sleep(30)'])
    try:
        tree = bench.process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        sampler = bench.PeakRss(lambda: {os.getpid(): "me", child.pid: "child"}, interval=0.05)
        with sampler:
            deadline = time.monotonic() + 20  # until the child has touched its 64 MiB (or 20 s)
            while sampler.peaks.get(child.pid, ("", 0))[1] < 64 << 20 and time.monotonic() < deadline:
                time.sleep(0.05)
        rows = {row["pid"]: row for row in sampler.report()}
        assert sorted(rows) == sorted([os.getpid(), child.pid])
        assert rows[os.getpid()]["role"].startswith("me (python") and rows[os.getpid()]["peak_rss_bytes"] > 10 << 20
        assert rows[child.pid]["role"].startswith("child (python") and rows[child.pid]["peak_rss_bytes"] >= 64 << 20
    finally:
        child.kill()
        child.wait()
    assert bench.process_tree(child.pid) == []
    sampler = bench.PeakRss(lambda: {child.pid: "gone"})
    sampler.sample()
    assert sampler.peaks == {}


def test_memory_events_keep_memory_warnings_oldest_first(bench) -> None:
    logs = {  # as Client.get_worker_logs() gives them: newest first
        "tcp://w1": [("WARNING", "Worker is at 73% memory usage. Resuming worker."),
                     ("WARNING", "Worker is at 81% memory usage. Pausing worker."),
                     ("INFO", "Memory: 1.00 GiB"), ("WARNING", "Heartbeat took long")],
        "tcp://w2": [("WARNING", "Unmanaged memory use is high.\nmore detail")],
    }  # fmt: skip
    assert bench.memory_events(logs) == [
        "tcp://w1: WARNING Worker is at 81% memory usage. Pausing worker.",
        "tcp://w1: WARNING Worker is at 73% memory usage. Resuming worker.",
        "tcp://w2: WARNING Unmanaged memory use is high.",
    ]
    assert bench.memory_events({"tcp://w1": [("INFO", "Starting worker")]}) == []
