"""pipelines/codebook.py: the codebook in the folder being built belongs to the run's build.

A resumed run (same build) reuses the codebook already there without sampling
again; a run of another build replaces it, as it writes a shard of another
build again. Both record the build and the model's fingerprint hash.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dilstore.pipelines.codebook import prepare_codebook
from dilstore.pipelines.job import PrecomputeJob
from dilstore.reader.batching import BatchPolicy
from dilstore.storage.codebook import codebook_build, read_codebook, write_codebook
from dilstore.storage.encodings import train_codebook
from dilstore.storage.fingerprint import fingerprint_sha256
from tests.fixtures.store_fixtures import fingerprint_for

DIMS = 8
FINGERPRINT = fingerprint_for("dilbert", "2bit")


def job_for(store: Path, given: Path | None, generation: str) -> PrecomputeJob:
    """A 2bit job with no inputs: were it to sample, it would stop with 'holds no passage'."""
    return PrecomputeJob(inputs=(), store=str(store), strategy="words", num_shards=1, max_length=48, model="unused",
                         fingerprint=FINGERPRINT, policy=BatchPolicy(), threads=1, runner="DirectRunner",
                         started_at=0.0, codebook=None if given is None else str(given), generation=generation)


def test_a_resumed_run_reuses_its_codebook_and_another_build_replaces_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    books = {name: train_codebook("2bit", rng.standard_normal((64, DIMS)).astype(np.float32)) for name in "ab"}
    for name, book in books.items():
        write_codebook(tmp_path / name, "2bit", book, (DIMS,))
    store = tmp_path / "store"
    path = prepare_codebook(job_for(store, tmp_path / "a", "g1"), reader=None)
    assert codebook_build(path) == {"generation": "g1", "fingerprint_sha256": fingerprint_sha256(FINGERPRINT)}
    assert prepare_codebook(job_for(store, None, "g1"), reader=None) == path, "resumed: reused, not sampled"
    assert all(np.array_equal(read_codebook(path, "2bit")[0][k], v) for k, v in books["a"].items())
    prepare_codebook(job_for(store, tmp_path / "b", "g2"), reader=None)
    assert codebook_build(path)["generation"] == "g2"
    assert all(np.array_equal(read_codebook(path, "2bit")[0][k], v) for k, v in books["b"].items())
