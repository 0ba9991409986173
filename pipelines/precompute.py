"""The precompute pipeline: Beam wiring over the pure steps in routing, shard_sink and finish.

    input files ─ Read ─┬─ documents ─ GroupByKey(id) ─ keep first ─┐
                        └─ dead letters, skipped ───────────────────┴─ Route (split, tokenize, key)
    Route ─┬─ ("shard", s): tokenized passages ┐
           ├─ ("rejected", r): dead letters    ├─ + one seed per shard ─ GroupByKey ─ WriteGroups
           └─ ("counts", c): RunStats          ┘
    WriteGroups (encode + per-shard sink | dead-letter files | sums) ─ sum RunStats ─ Finish (summary, finalize)

The graph is one chain that ends in Finish, uses no side inputs, no tagged
outputs and no finish_bundle outputs, so it means the same on the Dask runner
(which computes only the last transform's ancestors and drops the rest) as
on the DirectRunner, Dataflow and Flink. Workers count what they do in Beam
metrics (namespace "dilstore"); the summary itself is summed in the graph, so
it exists on runners without metrics too.

The model is loaded in the DoFns' `setup()` through one `RunModel` handle:
Route (for its tokenizer) and WriteGroups (to encode) share one loaded copy per
worker process, checked against the run's fingerprint when it is loaded.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.shared import Shared

from dilstore.pipelines.corpora import Document, Record, Rejected
from dilstore.pipelines.duplicate_ids import keep_first
from dilstore.pipelines.finish import finish_run
from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.options import in_process_runner
from dilstore.pipelines.progress import report_planned, report_progress
from dilstore.pipelines.routing import (
    COUNTS,
    REJECTED,
    SHARD,
    GroupKey,
    ReadTask,
    document_key,
    is_not_document,
    pieces_of,
    read_task,
    route,
    shard_seeds,
)
from dilstore.pipelines.run_stats import RunStats, merge_stats
from dilstore.pipelines.shard_sink import write_rejected_part, write_shard_outputs
from dilstore.reader.offline.encoding import load_checked_reader, set_threads
from dilstore.reader.offline.kinds import OfflineModel
from dilstore.storage.errors import DilstoreError

NAMESPACE = "dilstore"
RUN_KEY = "run"


def write_group(job: PrecomputeJob, key: GroupKey, values: Iterable[Any], reader: OfflineModel) -> RunStats:
    """Write one group (a shard, encoded with `reader`; a dead-letter part) or sum one group of counts; its RunStats.

    Shard and dead-letter part `index` are written as number `job.first_shard + index`, so an append's shards
    never take a number the store uses.
    """
    group, index = key
    if group == SHARD:
        pieces = pieces_of(values)

        def progress(done: int) -> None:
            report_progress(job.progress_dir, index, done)

        shard = job.first_shard + index
        stats = write_shard_outputs(job.shard_settings(), shard, pieces, reader, progress, job.resumed_shards)
        if not stats.shards_resumed:  # the launcher counted a committed shard's passages before the run
            report_progress(job.progress_dir, index, stats.passages)
        return stats
    if group == REJECTED:
        return write_rejected_part(job.store, job.first_shard + index, values)
    if group == COUNTS:
        return merge_stats(values)
    raise ValueError(f"unknown group {group!r}")


class RunModel:
    """The run's model in a worker: loaded once per process and shared by every DoFn given this handle.

    The handle pickles with the DoFns that hold it and keeps its `Shared` key,
    so after unpickling on a worker they all acquire the same loaded model. A
    model whose fingerprint differs from the run's is refused when it loads.
    """

    def __init__(self, job: PrecomputeJob) -> None:
        self.job = job
        self.shared = Shared()

    def acquire(self) -> OfflineModel:
        """The model: loaded and checked on the first call in this process, the same object on every later one."""
        job = self.job
        return self.shared.acquire(lambda: load_checked_reader(job.model, job.layers, job.fingerprint))


class ReadCorpusFn(beam.DoFn):
    """Every record of one input file; counts documents read."""

    def __init__(self) -> None:
        self.documents_read = Metrics.counter(NAMESPACE, "documents_read")

    def process(self, task: ReadTask) -> Iterator[Record]:
        for record in read_task(task):
            if isinstance(record, Document):
                self.documents_read.inc()
            yield record


class RouteFn(beam.DoFn):
    """Split, tokenize and key each record (`routing.route`), with the run's tokenizer.

    Also tells the launcher how many stored units this bundle planned, so its
    progress bar has a total once routing is done.
    """

    def __init__(self, job: PrecomputeJob, model: RunModel) -> None:
        self.job = job
        self.model = model
        self.settings = job.route_settings()
        self.tokenizer: Any = None
        self.planned = 0

    def setup(self) -> None:
        set_threads(self.job.threads)
        self.tokenizer = self.model.acquire().tokenizer

    def start_bundle(self) -> None:
        self.planned = 0

    def process(self, record: Document | Rejected) -> Iterator[tuple[GroupKey, Any]]:
        for key, value in route(record, self.settings, self.tokenizer):
            if key[0] == SHARD:
                self.planned += 1
            yield key, value

    def finish_bundle(self) -> None:
        report_planned(self.job.progress_dir, uuid.uuid4().hex, self.planned)


class WriteGroupFn(beam.DoFn):
    """Write one grouped key (`write_group`) with the model loaded in `setup()`, and count it in Beam metrics."""

    def __init__(self, job: PrecomputeJob, model: RunModel) -> None:
        self.job = job
        self.model = model
        self.reader: Any = None
        self.counters = {
            name: Metrics.counter(NAMESPACE, name)
            for name in ("documents", "passages", "tokens", "rejected", "rejected_passages", "skipped", "long_passages")
        }
        self.shards_written = Metrics.counter(NAMESPACE, "shards_written")
        self.shards_resumed = Metrics.counter(NAMESPACE, "shards_resumed")
        self.bytes_written = Metrics.counter(NAMESPACE, "bytes_written")

    def setup(self) -> None:
        set_threads(self.job.threads)
        self.reader = self.model.acquire()

    def process(self, element: tuple[GroupKey, Iterable[Any]]) -> Iterator[tuple[str, RunStats]]:
        key, values = element
        stats = write_group(self.job, key, values, self.reader)
        for name, counter in self.counters.items():
            counter.inc(getattr(stats, name))
        if stats.shards_resumed:
            self.shards_resumed.inc(stats.shards_resumed)
        else:
            self.shards_written.inc(stats.shards)
            self.bytes_written.inc(stats.bytes)
        yield RUN_KEY, stats


def finish(element: tuple[str, RunStats], job: PrecomputeJob) -> dict[str, Any]:
    """Finalize once with the run's totals."""
    _, stats = element
    return finish_run(stats, job)


def first_of_each_id(element: tuple[str, Iterable[Document]], strategy: str) -> list[Document | Rejected]:
    """The document of an id group the store keeps and a dead letter for every other (`keep_first`)."""
    _, documents = element
    return keep_first(documents, strategy)


class Precompute(beam.PTransform):
    """The whole run, from the job's input files to a finalized store (a PCollection of one summary)."""

    def __init__(self, job: PrecomputeJob) -> None:
        super().__init__()
        self.job = job

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        """The job's shape: read every input, keep the first document of each id, route each to its shard (records
        that are no documents go along to be counted or dead-lettered), write each shard once with its seed (so an
        empty shard is written too), then sum the counts and finalize the store."""
        job = self.job
        model = RunModel(job)
        records = (
            pipeline
            | "Inputs" >> beam.Create(list(job.inputs))
            | "Read" >> beam.ParDo(ReadCorpusFn())
        )
        unique = (
            records
            | "KeyById" >> beam.FlatMap(document_key)
            | "GroupById" >> beam.GroupByKey()
            | "KeepFirst" >> beam.FlatMap(first_of_each_id, job.strategy)
        )
        others = records | "NotDocuments" >> beam.Filter(is_not_document)
        routed = (unique, others) | "AllRecords" >> beam.Flatten() | "Route" >> beam.ParDo(RouteFn(job, model))
        seeds = pipeline | "ShardSeeds" >> beam.Create(shard_seeds(job.num_shards))
        return (
            (routed, seeds)
            | "WithSeeds" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteGroups" >> beam.ParDo(WriteGroupFn(job, model))
            | "SumCounts" >> beam.CombinePerKey(merge_stats)
            | "Finish" >> beam.Map(finish, job)
        )


def build_pipeline(job: PrecomputeJob, options: PipelineOptions) -> beam.Pipeline:
    """A pipeline object holding the whole run, not yet run (`.run()` starts it).

    Beam validates runner options here (e.g. Dataflow project ids and GCS
    paths); its complaint, one problem a line, becomes a one-line DilstoreError.
    """
    try:
        pipeline = beam.Pipeline(runner=in_process_runner(options), options=options)
    except ValueError as error:
        head, *problems = [line.strip() for line in str(error).splitlines() if line.strip()] or [repr(error)]
        said = f"{head.rstrip(': ')}: {'; '.join(problem.rstrip('.') for problem in problems)}" if problems else head
        raise DilstoreError(f"invalid Beam options: {said}") from error
    if job.progress_dir is not None:
        beam_folder_into(pipeline, job.progress_dir)
    _ = pipeline | "Precompute" >> Precompute(job)
    return pipeline


def beam_folder_into(pipeline: beam.Pipeline, scratch: str) -> None:
    """Put the empty folder Beam's Pipeline makes in $TMPDIR (`beam-pipeline-temp*`) into the command's scratch
    folder `scratch` (runners/scratch.py), as `pipeline.local_tempdir`, which run() removes as it ends (leak60 F1).

    Beam removes its folder only as run() ends, so each precompute killed mid-run (SIGKILL, the out-of-memory
    killer) left one in $TMPDIR that nothing removed; in the scratch folder, the next precompute removes it with the
    rest. One Beam has written into (none does) stays where it is.
    """
    try:
        os.rmdir(pipeline.local_tempdir)
    except OSError:
        return
    pipeline.local_tempdir = tempfile.mkdtemp(prefix="beam-pipeline-temp", dir=scratch)
