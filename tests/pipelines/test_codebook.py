"""pipelines/codebook.py: the codebook in the folder being built belongs to the run's build.

A resumed run (same build) reuses the codebook already there without sampling
again; a run of another build replaces it, as it writes a shard of another
build again. Both record the build and the model's fingerprint hash.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dilstore.pipelines import codebook
from dilstore.pipelines.codebook import prepare_codebook, sample_documents
from dilstore.pipelines.documents import Document
from dilstore.pipelines.duplicate_ids import keep_first
from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.sharding import stable_hash
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


def reference_sample(inputs: list[list[Document]], limit: int, seed: int) -> list[Document]:
    """The sample by its definition: each id's kept document (`keep_first`), then the `limit` smallest seeded keys."""
    by_id: dict[str, list[Document]] = {}
    for document in (document for task in inputs for document in task):
        by_id.setdefault(document.id, []).append(document)
    kept = [keep_first(documents, "words")[0] for documents in by_id.values()]
    return sorted(kept, key=lambda document: (stable_hash(f"{seed}\0{document.id}"), document.id))[:limit]


@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(1, 5), st.sampled_from(["x", "y"])), max_size=12),
        min_size=1, max_size=3,
    ),
    st.integers(0, 6),
    st.integers(0, 3),
)
def test_the_codebook_sample_is_the_smallest_keys_of_the_documents_the_store_keeps(
    files: list[list[tuple[str, int, str]]], limit: int, seed: int
) -> None:
    """A duplicate id across --input files was sampled as first read, so the codebook could learn from a document
    the store rejected; the sample must be the kept documents' `limit` smallest keys, in key order."""
    inputs = [
        [Document(id=doc_id, title="", text=text, source=f"{'zyx'[index]}.jsonl", line=line)
         for doc_id, line, text in documents]
        for index, documents in enumerate(files)
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codebook, "read_task", iter)
        assert sample_documents(inputs, limit, "words", seed) == reference_sample(inputs, limit, seed)
