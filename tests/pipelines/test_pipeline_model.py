"""The run's model in Beam workers: loaded in the DoFns' setup(), once per process, shared, and checked.

Each DoFn goes through Beam's own pickler first, as a runner ships it to a
worker, so the tests see what a worker sees.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from apache_beam.internal import pickler

from dilstore.pipelines import precompute
from dilstore.pipelines.corpora import Document
from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.precompute import RUN_KEY, RouteFn, RunModel, WriteGroupFn
from dilstore.pipelines.routing import SHARD, pieces_of
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.offline.encoding import encode_tokenized, load_checked_reader, load_reader
from dilstore.storage.errors import DilstoreError
from dilstore.storage.finalize import finalize
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.reader import open_store
from tests.fixtures.pipeline_fixtures import TINY_LAYERS, save_tiny_reader, wiki_like_documents

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reader(tmp_path_factory.mktemp("tiny-reader"))


@pytest.fixture(scope="module")
def fingerprint(tiny_dir: Path) -> Fingerprint:
    return model_fingerprint(load_reader(str(tiny_dir), "dilbert", TINY_LAYERS), "dilbert", "fp32", MAX_LENGTH)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The arguments of every model load the pipeline makes while the test runs."""
    calls: list[tuple] = []

    def counted(*args):
        calls.append(args)
        return load_checked_reader(*args)

    monkeypatch.setattr(precompute, "load_checked_reader", counted)
    return calls


def job_for(tiny_dir: Path, store: Path, fingerprint: Fingerprint) -> PrecomputeJob:
    return PrecomputeJob(inputs=(), store=str(store), strategy="words", num_shards=1, max_length=MAX_LENGTH,
                         model=str(tiny_dir), fingerprint=fingerprint, policy=BatchPolicy(), threads=1,
                         runner="DirectRunner", started_at=0.0)  # fmt: skip


def on_worker(fn):
    """`fn` as a worker gets it: through Beam's pickler."""
    return pickler.loads(pickler.dumps(fn))


def test_the_dofns_load_the_model_once_in_setup_and_a_bundle_encodes_with_it(
    tiny_dir: Path, fingerprint: Fingerprint, loads: list[tuple], tmp_path: Path
) -> None:
    job = job_for(tiny_dir, tmp_path, fingerprint)
    model = RunModel(job)
    route = on_worker(RouteFn(job, model))
    write, other_write = on_worker(WriteGroupFn(job, model)), on_worker(WriteGroupFn(job, model))
    assert loads == [], "building and shipping the DoFns loads nothing"
    for fn in (route, write, other_write):
        fn.setup()
    assert loads == [(str(tiny_dir), TINY_LAYERS, fingerprint)], "one load per process, shared by every DoFn"
    assert write.reader is other_write.reader and route.tokenizer is write.reader.tokenizer

    route.start_bundle()
    documents = [Document(id=d["id"], title=d["title"], text=d["text"], source="docs.jsonl", line=n)
                 for n, d in enumerate(wiki_like_documents(3), start=1)]  # fmt: skip
    units = [value for document in documents for key, value in route.process(document) if key[0] == SHARD]
    route.finish_bundle()
    [(key, stats)] = list(write.process(((SHARD, 0), units)))
    assert key == RUN_KEY and stats.passages == len(units) > 0
    assert len(loads) == 1, "process() uses the model setup() loaded"

    finalize(tmp_path, fingerprint)
    reference = load_reader(str(tiny_dir), "dilbert", TINY_LAYERS)
    expected = {record.id: record.states for record in encode_tokenized(reference, "dilbert", pieces_of(units))}
    with open_store(tmp_path) as store:
        for stored in store.fetch(list(expected)):
            np.testing.assert_allclose(stored.states, expected[stored.id], rtol=1e-5, atol=1e-6)


def test_setup_refuses_a_model_unlike_the_one_the_run_started_with(
    tiny_dir: Path, fingerprint: Fingerprint, tmp_path: Path
) -> None:
    job = job_for(tiny_dir, tmp_path, replace(fingerprint, weights_sha256="0" * 64))
    with pytest.raises(DilstoreError, match="does not match the fingerprint"):
        on_worker(WriteGroupFn(job, RunModel(job))).setup()


def test_the_launchers_own_process_takes_the_model_it_fingerprinted(
    tiny_dir: Path, fingerprint: Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-worker run loaded and fingerprinted the model twice in one process: the launch, then the DoFns' setup
    (perf49 F5: 0.7 s of a 300-passage run). Inside the run's block the launched object is taken; a model of
    another fingerprint is loaded and checked as before, and nothing is kept after the block."""
    from dilstore.reader.offline import encoding

    launched = load_reader(str(tiny_dir), "dilbert", TINY_LAYERS)
    loaded: list[str] = []
    monkeypatch.setattr(encoding, "load_reader", lambda *args: (loaded.append(args[0]), launched)[1])
    with encoding.launched_models():
        encoding.keep_launched(launched, fingerprint)
        assert load_checked_reader(str(tiny_dir), TINY_LAYERS, fingerprint) is launched and loaded == []
        with pytest.raises(DilstoreError, match="does not match the fingerprint"):
            load_checked_reader(str(tiny_dir), TINY_LAYERS, replace(fingerprint, weights_sha256="0" * 64))
        assert loaded == [str(tiny_dir)]
    assert load_checked_reader(str(tiny_dir), TINY_LAYERS, fingerprint) is launched and len(loaded) == 2
    encoding.keep_launched(launched, fingerprint)  # outside a run's block: nothing is kept
    assert not encoding._LAUNCHED
