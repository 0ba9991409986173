"""Running the precompute pipeline: on local runners a runtime (worker processes, a Dask LocalCluster) and a
progress bar; on every runner Beam's failures turned into one line, and Ctrl-C into a clean stop.

`run_pipeline` is what `dilstore precompute` (runners/cmd_precompute.py) runs once the job is built.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dilstore.runners.exception_chain import exception_chain
from dilstore.runners.quiet import failures_unlogged, filtered_stderr, records_unlogged
from dilstore.runners.stop_signals import interrupt_number, interrupt_words
from dilstore.runners.worker_deaths import RERUN, DeadWorkerError, dead_worker_wait_bounded
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.file_errors import FILE_SIZE_ADVICE
from dilstore.storage.read_failures import address_space_words

if TYPE_CHECKING:  # imported lazily at run time, so that `dilstore --help` stays fast
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.pipeline import Pipeline
    from apache_beam.runners.runner import PipelineResult

    from dilstore.pipelines.job import BuildAttempt, PrecomputeJob
    from dilstore.pipelines.options import LocalDefaults

_PROGRESS_POLL_SECONDS = 0.5
HANDSHAKE_GRACE_SECONDS = 5  # past the connection wait, for a scheduler that answers slowly under load
# Beam's Dask runner (2.77) hands one output list to all the tasks of a step; a worker in another process gets a
# copy for each task, one in the caller's process shares it, and each task's outputs repeated the ones before (a
# corpus refused as "passage id ... occurs twice in one shard"). A worker in another process imports this module
# afresh, with a token of its own.
_PROCESS_TOKEN = uuid.uuid4().hex
IN_PROCESS_WORKERS = ("a worker runs in this process (a LocalCluster or Client started with processes=False), where "
                      "Beam's Dask runner repeats a step's outputs across its tasks: start the cluster with "
                      "processes=True (the default)")  # fmt: skip

E = TypeVar("E", bound=BaseException)


class ProgressBar:
    """A tqdm bar over the progress files local workers write: passages/s and ETA.

    Beam metrics are not live on the local runners and workers may be other
    processes, so the bar polls `pipelines.progress` files in a thread; the
    total appears once routing has planned every stored unit. The passages
    of shards an earlier attempt committed (`resumed`) start the bar and are
    named in it, without counting in its rate: a resumed run's time left is
    that of the passages still to encode.
    """

    def __init__(self, progress_dir: Path | None, resumed: int = 0) -> None:
        self.progress_dir = progress_dir
        self.resumed = resumed
        self.enabled = progress_dir is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="dilstore-progress", daemon=True)

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()

    def _poll(self) -> None:
        from tqdm import tqdm

        from dilstore.pipelines.progress import passages_done, passages_planned
        from dilstore.reader.progress_lines import bar_options, steady_bar

        resumed = f"{self.resumed} resumed" if self.resumed else None
        with steady_bar(tqdm)(unit="passage", desc="precompute", smoothing=0.1, initial=self.resumed, postfix=resumed,
                  **bar_options(mininterval=1.0)) as bar:  # fmt: skip
            while True:
                stopping = self._stop.wait(_PROGRESS_POLL_SECONDS)
                planned = passages_planned(self.progress_dir)
                done = self.resumed + passages_done(self.progress_dir)
                if planned and bar.total != max(planned, done):
                    bar.total = max(planned, done)
                    bar.refresh()
                bar.update(done - bar.n)
                if stopping:
                    return


@contextlib.contextmanager
def callers_torch_threads() -> Iterator[None]:
    """Give this process its torch thread count back after the block.

    The precompute DoFns set `--threads` in the process they run in, which an
    in-process runner (`--workers 1`, or `dilstore.precompute` from Python)
    shares with its caller.
    """
    import torch

    previous = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def local_runtime(runner: str, workers: int, num_shards: int, beam_args: Sequence[str]) -> Iterator[LocalDefaults]:
    """LocalDefaults for the runner; for Dask without a scheduler given, a LocalCluster of `workers` processes."""
    from dilstore.pipelines.options import DASK_RUNNER, LocalDefaults, has_flag

    scheduler_given = has_flag(beam_args, "dask_client_address") or has_flag(beam_args, "dask_scheduler_file")
    if runner != DASK_RUNNER or scheduler_given:
        yield LocalDefaults(workers=workers, dask_partitions=num_shards if runner == DASK_RUNNER else None)
        return
    from distributed import LocalCluster

    # The nanny's "Worker process still alive after 4.0 seconds, killing": a worker slower than that to exit (a
    # loaded machine) is killed at close, and that warning on a clean run reads as a failure.
    with records_unlogged("distributed.nanny", _killed_at_close), LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        yield LocalDefaults(workers=workers, dask_address=cluster.scheduler_address, dask_partitions=num_shards)
        _frozen_for_exit(cluster)


def _frozen_for_exit(cluster: Any) -> None:
    """Freeze the garbage collector in the workers of `cluster`, a LocalCluster about to close after a finished job.

    A worker that ran the job holds half a million objects (torch, transformers, Beam); the interpreter's exit
    runs full collections over all of them, seconds of CPU, and closing the cluster waited 2 to 4 s for it, until
    the nanny killed the worker at 4 s (dask57 F1). Frozen objects are left out of those collections: the worker
    exits in a fraction of a second. Nothing of the job is lost: the pipeline has finished and its results are in
    the store; the objects are only not collected by a process that is ending (and that was killed before).
    Only dilstore's own cluster: a worker of a cluster given to it outlives the job, and must collect its garbage.
    """
    import gc

    try:
        with cluster.get_client() as client:
            client.run(gc.freeze, on_error="ignore")
    except (OSError, TimeoutError):  # a worker gone meanwhile: it is not waited on at close either
        pass


def _killed_at_close(record: logging.LogRecord) -> bool:
    return record.getMessage().startswith("Worker process still alive after")


def run_pipeline(
    job: PrecomputeJob,
    runner: str,
    beam_args: Sequence[str],
    workers: int,
    progress: bool,
    attempt: BuildAttempt | None = None,
) -> dict[str, Any]:
    """Run the precompute pipeline for `job` to the end; the run summary.

    Local runners get defaults (worker processes, a Dask LocalCluster) and a
    progress bar; a failed pipeline raises DilstoreError with Beam's message, and so does one that ended without
    finishing the store (`finished_summary`).
    `attempt` is marked launched once a runner whose workers outlive this
    process has the job (pipelines/job.py: its files must then stay).
    """
    from dilstore.pipelines.options import (
        DASK_RUNNER,
        assemble_beam_flags,
        ends_with_this_process,
        pipeline_options,
        runs_here,
    )
    from dilstore.pipelines.precompute import build_pipeline

    job = with_resumed_shards(job)
    # The stderr filter is in place before a LocalCluster's workers start: they inherit its pipe, not the terminal.
    runtime = local_runtime(runner, workers, job.num_shards, beam_args)
    with callers_torch_threads(), filtered_stderr(), runtime as defaults:
        options = pipeline_options(assemble_beam_flags(runner, beam_args, defaults))
        if runner == DASK_RUNNER and defaults.dask_address is None:
            reach_dask_scheduler(options)
        if runner in ("PortableRunner", "FlinkRunner"):  # Beam's FlinkRunner is a PortableRunner, --job_endpoint too
            reach_job_server(options)
        pipeline = build_pipeline(job, options)
        shown = progress and runs_here(options) and job.progress_dir
        result = None
        bar = ProgressBar(Path(job.progress_dir), job.resumed_passages()) if shown else ProgressBar(None)
        with failures_unlogged(), bar, dead_worker_wait_bounded():  # (hang50) a dead worker is not waited on for ever
            try:
                # The LocalCluster started here for Dask ends with this call, and its workers with it.
                outlives_us = not ends_with_this_process(options) and defaults.dask_address is None
                result = _launch(pipeline, attempt if outlives_us else None)
                result.wait_until_finish()
            except DeadWorkerError:  # done if Finish put the result in place meanwhile, as when a worker dies last
                if finished_by_now(job) is None:
                    raise
            except DilstoreError:
                raise
            except (Exception, KeyboardInterrupt) as error:  # Beam wraps worker errors in runner-specific types
                interrupt = _cause_of(error, KeyboardInterrupt)
                if interrupt is not None:
                    raise stopped(job, interrupt) from None
                raise DilstoreError(f"the pipeline failed: {pipeline_failure(error, options, job.store)}") from error
            finally:
                client = getattr(result, "client", None)  # the Dask runner's distributed.Client
                if client is not None:
                    client.close()
    return finished_summary(job)


def finished_by_now(job: PrecomputeJob) -> str | None:
    """Where the job's Finish has put its result, in words (`finished_where`); None while it has not, or while a
    manifest being replaced cannot tell. A run stopped or left waiting on a dead worker (hang50: killed as the last
    shard committed, while the other worker finished the store) is done if it has."""
    from dilstore.pipelines.finish import finished_where

    with contextlib.suppress(DilstoreError):
        return finished_where(job)
    return None


def finished_summary(job: PrecomputeJob) -> dict[str, Any]:
    """The summary the run's Finish wrote; a DilstoreError when the pipeline ended without one.

    A runner can end "successfully" having run no step at all (Dask with a negative --dask_npartitions: a bag of no
    partitions), leaving the store unfinished; that exited 0 with an empty summary (dask50 F1).
    """
    from dilstore.pipelines.finish import read_summary
    from dilstore.pipelines.spec_file import SUMMARY_FILE

    summary = read_summary(Path(job.store))
    if not summary:
        raise DilstoreError(f"the pipeline ended without finishing {job.destination or job.store}: it wrote no "
                            f"{SUMMARY_FILE} (its runner ran none of its steps; check the Beam options that split "
                            "the work)")  # fmt: skip
    return summary


def with_resumed_shards(job: PrecomputeJob) -> PrecomputeJob:
    """`job` with the shards committed before it starts, so that only those count as resumed (dask50 F7)."""
    import dataclasses

    from dilstore.pipelines.shard_sink import committed_shards

    shards = range(job.first_shard, job.first_shard + job.num_shards)
    return dataclasses.replace(job, resumed_shards=committed_shards(job.shard_settings(), shards))


def _launch(pipeline: Pipeline, attempt: BuildAttempt | None) -> PipelineResult:
    """`pipeline.run()`, with `attempt` (given for a job that runs on without this process) marked launched.

    A remote service may accept the job inside run() (Dataflow's create
    call) before an interrupt or a lost reply: launched from the call on,
    unless run() itself refuses the job with an error, when no job runs.
    """
    if attempt is not None:
        attempt.launched = True
    try:
        return pipeline.run()
    except Exception:
        if attempt is not None:
            attempt.launched = False
        raise


def stopped(job: PrecomputeJob, interrupt: KeyboardInterrupt) -> StoppedBySignal:
    """The stop an interrupt of the run ends in. One that came after the job's Finish put its store (or append) in
    place says so: Finish runs on in a Dask worker while the launcher unwinds, so "run the same command again"
    would only answer "already complete"."""
    done = finished_by_now(job)  # None too for a manifest being replaced: the stop is still a stop (130, 143)
    if done is not None:
        return StoppedBySignal(f"{interrupt_words(interrupt)} after the run had finished: {done}",
                               interrupt_number(interrupt))  # fmt: skip
    return StoppedBySignal(
        f"{interrupt_words(interrupt)}; {RERUN}",
        interrupt_number(interrupt),
    )


def reach_dask_scheduler(options: PipelineOptions) -> None:
    """Connect to the Dask scheduler the options name, then let go; a DilstoreError naming it if none answers.

    Beam's runner connects inside the call that hands the job over, after which the run's files must stay (its
    tasks may run on): Ctrl-C while it waited for a scheduler kept them, and the next command with other
    settings was refused. It waited for ever for a --dask_scheduler_file that does not exist.

    The attempt runs on a thread of its own and is given up after the wait (plus HANDSHAKE_GRACE_SECONDS):
    dask.distributed bounds the connection by it but not the handshake, so an address that accepts connections and
    never answers (a port forward to nothing, another service) hung for ever. The given-up attempt stays blocked on
    its daemon thread until the process ends.
    """
    import dask
    from apache_beam.runners.dask.dask_runner import DaskOptions
    from dask.utils import parse_timedelta
    from distributed import Client

    values = options.view_as(DaskOptions)
    where = values.scheduler_file or values.address
    if values.scheduler_file:
        check_scheduler_file(values.scheduler_file)
    default = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")
    timeout = values.timeout if isinstance(values.timeout, int) else default
    outcome: list[Exception | None] = []

    def attempt() -> None:
        try:
            with Client(address=values.address, scheduler_file=values.scheduler_file, timeout=timeout) as client:
                # A worker that cannot run the check (no dilstore there) is in another process: its error is
                # the pipeline's to report.
                answers = client.run(_is_this_process, _PROCESS_TOKEN, os.getpid(), on_error="return")
                shared = any(answer is True for answer in answers.values())
            outcome.append(DilstoreError(IN_PROCESS_WORKERS) if shared else None)
        except Exception as error:  # OSError when no one answers; anything from a server that is not a scheduler
            outcome.append(error)

    reaching = threading.Thread(target=attempt, name="dilstore-dask-reach", daemon=True)
    reaching.start()
    waited = timeout + HANDSHAKE_GRACE_SECONDS
    reaching.join(waited)
    if not outcome:
        raise DilstoreError(f"no Dask scheduler answered at {where} within {waited} s: something there accepts "
                            "connections but does not answer as a scheduler (--dask_connection_timeout sets the "
                            "wait)")  # fmt: skip
    if isinstance(outcome[0], DilstoreError):
        raise DilstoreError(f"the Dask scheduler at {where}: {outcome[0]}")
    if outcome[0] is not None:
        raise DilstoreError(f"cannot reach a Dask scheduler at {where}: {_last_line(outcome[0])} (the wait is "
                            f"{timeout} s; --dask_connection_timeout sets it)")  # fmt: skip


def reach_job_server(options: PipelineOptions) -> None:
    """Connect to the job server a PortableRunner's (or FlinkRunner's) --job_endpoint names, then let go; a
    DilstoreError naming it when the connection fails (refused, an unknown host, an address gRPC cannot parse, or
    a listener that never completes gRPC's handshake).

    Beam waits for the endpoint's channel to be ready for --job_server_timeout (300 s by default), through every
    failed attempt: `--job_endpoint localhost:1` ran for five minutes, and Ctrl-C meanwhile kept the run's spec
    (multi53 F1). gRPC's first failed attempt ends the wait: at once for a refused connection, after gRPC's own
    handshake timeout (about 20 s) for a silent listener. `embed` starts its job server in this process: nothing to
    reach.
    """
    import grpc

    values = options.get_all_options()
    endpoint = values.get("job_endpoint")
    if not endpoint or endpoint == "embed":
        return
    failed = threading.Event()
    ready = threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            failed.set()
        elif state is grpc.ChannelConnectivity.READY:
            ready.set()

    channel = grpc.insecure_channel(endpoint)
    try:
        channel.subscribe(watch, try_to_connect=True)
        deadline = time.monotonic() + (values.get("job_server_timeout") or 0)
        while not (failed.is_set() or ready.is_set()) and time.monotonic() < deadline:
            failed.wait(0.05)
    finally:
        channel.unsubscribe(watch)
        channel.close()
    if failed.is_set() and not ready.is_set():
        raise DilstoreError(f"cannot reach a job server at {endpoint} (--job_endpoint): no gRPC connection could be "
                            "made (nothing listening, an unknown host, or no job server there); start the job server "
                            "first, or check its HOST:PORT")  # fmt: skip


def check_scheduler_file(path: str) -> None:
    """Refuse a --dask_scheduler_file that does not exist or names no scheduler: an empty file, one that is not JSON
    or one without a string "address" failed inside dask.distributed as "AssertionError" (dask50 F5)."""
    import json

    written_by = "a scheduler started with `dask scheduler --scheduler-file FILE` writes it"
    if not Path(path).is_file():
        raise DilstoreError(f"--dask_scheduler_file {path} does not exist ({written_by})")
    try:
        address = json.loads(Path(path).read_text(encoding="utf-8")).get("address")
    except (OSError, UnicodeError, ValueError, AttributeError) as error:  # AttributeError: JSON, but no object
        why = error.strerror if isinstance(error, OSError) else "it is not a JSON object"
        raise DilstoreError(f"--dask_scheduler_file {path} holds no scheduler address: {why} ({written_by})") from None
    except RecursionError:  # Python's parser recurses once per level: a traceback (complex61 F6)
        raise DilstoreError(f"--dask_scheduler_file {path} holds no scheduler address: its JSON is nested too deep "
                            f"to read ({written_by})") from None  # fmt: skip
    if not isinstance(address, str) or not address.strip():
        raise DilstoreError(f'--dask_scheduler_file {path} holds no scheduler address: no string "address" in it '
                            f"({written_by})")  # fmt: skip


def _is_this_process(token: str, pid: int) -> bool:
    """Run on each Dask worker: whether it is the process that asks (a worker forked from it has its token but
    not its pid; a worker on another host may have its pid but not its token)."""
    return token == _PROCESS_TOKEN and os.getpid() == pid


def _cause_of(error: BaseException, kind: type[E]) -> E | None:
    """`error` or the first exception it was raised from or during that is a `kind` (Beam wraps a DoFn's errors)."""
    return next((each for each in exception_chain(error) if isinstance(each, kind)), None)


# A folder or mount made read-only part way (scale53 F3): said only "PermissionError: [Errno 1] ...", not that the
# store was as it was and the same command goes on from the shards it finished.
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
# How a worker's failed allocation reads: Python's MemoryError, torch's CPU allocator's refusal, a map's ENOMEM.
_OUT_OF_MEMORY = ("MemoryError", "can't allocate memory", f"[Errno {errno.ENOMEM}]")


def pipeline_failure(error: BaseException, options: PipelineOptions, store: str = "the store") -> str:
    """What failed, in a line: a job server that never answered is named with the option that bounds the wait (it
    was only "FutureTimeoutError", after minutes), a full disk, memory that ran out or a path that cannot be written
    any more with what to do (a worker's OSError reaches the launcher as text), a worker process that died (Beam's
    with its exit code, or Dask's KilledWorker) and the rerun that goes on (dask50 F3, F4), anything else is its most
    telling line."""
    if type(error).__name__ == "FutureTimeoutError":  # grpc's, waiting for the portable job server
        values = options.get_all_options()
        return (f"no job server answered at {values.get('job_endpoint')} within {values.get('job_server_timeout')} s "
                "(--job_endpoint, --job_server_timeout)")  # fmt: skip
    from dilstore.runners.worker_deaths import worker_death

    died = worker_death(error)
    if died is not None:
        return died
    line = _last_line(error)
    if f"[Errno {errno.ENOSPC}]" in line:
        return f"{line}: free space on the disk of {store} (or of $TMPDIR), then {RERUN}"
    if f"[Errno {errno.EDQUOT}]" in line:  # a quota is full, not the disk: said nothing of what to do (disk56 F5)
        return f"{line}: free space under your quota on the disk of {store} (or of $TMPDIR), then {RERUN}"
    if f"[Errno {errno.EFBIG}]" in line:  # a file past `ulimit -f`, or past what the filesystem holds (disk56 F5)
        return f"{line}: {FILE_SIZE_ADVICE}, then {RERUN}"
    if any(f"[Errno {number}]" in line for number in _UNWRITABLE):  # before the commit: the store as it was
        return f"{line}: give this run access to that path again (a read-only mount or folder, its mode), then {RERUN}"
    if any(mark in line for mark in _OUT_OF_MEMORY):
        return f"{line}: {memory_advice()}, then {RERUN}"
    if f"[Errno {errno.EIO}]" in line:  # a failing disk, or one that failed once: the commit may have happened
        return (f"{line}: check the disk of {store}, then run the same command again (it goes on from the shards "
                "it finished, or says the store is complete)")  # fmt: skip
    return line


def memory_advice() -> str:
    """What to do once the run ran out of memory, in words. Under `ulimit -v` it ended in torch's "[enforce fail at
    alloc_cpu.cpp:127] ... DefaultCPUAllocator: can't allocate memory" alone, naming neither the limit nor the
    options that bound what a worker holds at once (limits59 F8)."""
    lower = "lower --batch-tokens or --workers, or give it more memory"
    return f"the run ran out of memory{address_space_words()}: {lower}"


def _last_line(error: BaseException) -> str:
    """The most telling line of a (possibly multi-line, worker-side) error message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":", 1)[0]]
    return (errors or lines or [type(error).__name__])[-1]
