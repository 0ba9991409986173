"""Runner choice and Beam options: local defaults, Dataflow and Flink flags, refusals, and graph construction.

Neither Dataflow nor Flink is reachable here, so these tests stop at what can
be checked offline: the assembled PipelineOptions carry the right values and
the whole precompute graph builds for those runners and serialises to the
portable Runner API (which is what gets submitted to a service).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import dask
import pytest

from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.options import (
    DASK_RUNNER,
    LocalDefaults,
    assemble_beam_flags,
    canonical_runner,
    ends_with_this_process,
    pipeline_options,
    runs_here,
    unparsed_words,
)
from dilstore.pipelines.precompute import beam_folder_into, build_pipeline
from dilstore.pipelines.routing import ReadTask
from dilstore.reader.batching import BatchPolicy
from dilstore.runners.precompute_run import pipeline_failure, run_pipeline
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint
from tests.fixtures.limits import address_space_limit
from tests.fixtures.pipeline_fixtures import forked_dask_workers

if TYPE_CHECKING:
    from apache_beam import Pipeline as BeamPipeline
    from apache_beam.options.pipeline_options import PipelineOptions

DATAFLOW_ARGS = ["--project", "p", "--region", "r", "--temp_location", "gs://b/tmp", "--setup_file", "./pyproject.toml"]
# Beam validates names when a Dataflow pipeline object is made: a real-looking project and bucket.
DATAFLOW_BUILD_ARGS = ["--project", "dilstore-demo", "--region", "europe-west4", "--temp_location",
                       "gs://dilstore-demo-bucket/tmp", "--setup_file", "./pyproject.toml"]
FLINK_ARGS = ["--flink_master", "host:8081", "--environment_type", "LOOPBACK"]


def job(tmp_path: Path, runner: str) -> PrecomputeJob:
    fingerprint = Fingerprint("bert", "c" * 64, "w" * 64, "t" * 64, "dilbert", 3, "fp16", 384)
    return PrecomputeJob(
        inputs=(ReadTask(str(tmp_path / "corpus.jsonl"), "jsonl"),),
        store=str(tmp_path / "store"),
        strategy="words",
        num_shards=4,
        max_length=384,
        model="/models/reader",
        fingerprint=fingerprint,
        policy=BatchPolicy(),
        threads=1,
        runner=runner,
        started_at=time.time(),
    )


@pytest.mark.parametrize(
    ("name", "runner"),
    [("direct", "DirectRunner"), ("DirectRunner", "DirectRunner"), ("dask", DASK_RUNNER),
     ("Dataflow", "DataflowRunner"), ("FlinkRunner", "FlinkRunner"), ("portable", "PortableRunner")],
)
def test_runner_names_resolve(name: str, runner: str) -> None:
    assert canonical_runner(name) == runner


def test_stray_words_are_those_no_beam_option_takes() -> None:
    """A word after an on/off flag is no value of it (review45c F2); repeated options, `=` forms and the value of a
    flag Beam does not know (refused on its own) are not stray."""
    assert unparsed_words(["--experiments", "a", "--experiments", "b", "--temp_location=gs://x", "--max_num_workers",
                           "3", "--save_main_session", "--nonsense", "v"]) == (["--nonsense"], [])  # fmt: skip
    assert unparsed_words(["b.jsonl", "--save_main_session", "c.jsonl", "--streaming", "d.jsonl"])[1] == [
        "b.jsonl", "c.jsonl", "d.jsonl"]


def test_an_unknown_runner_is_refused() -> None:
    with pytest.raises(DilstoreError, match="unknown runner 'sparkle'"):
        canonical_runner("sparkle")
    # The message ended "(or DirectRunner, DataflowRunner, ...)", as if any Beam runner would do.
    with pytest.raises(DilstoreError, match=r"unknown runner 'SparkRunner'.*by Beam's names: DirectRunner, "
                       r"DaskRunner, DataflowRunner, FlinkRunner, PortableRunner, FnApiRunner\)$"):  # fmt: skip
        canonical_runner("SparkRunner")


@pytest.mark.parametrize("runner", ["DirectRunner", "FnApiRunner"])  # --workers was ignored with fnapi
def test_the_direct_runner_defaults_to_multi_processing_with_n_workers(runner: str) -> None:
    values = pipeline_options(assemble_beam_flags(runner, [], LocalDefaults(workers=3))).get_all_options()
    assert (values["direct_num_workers"], values["direct_running_mode"]) == (3, "multi_processing")
    one = pipeline_options(assemble_beam_flags(runner, [], LocalDefaults(workers=1))).get_all_options()
    assert one["direct_running_mode"] == "in_memory"
    mine = ["--direct_running_mode", "multi_threading", "--direct_num_workers=5"]
    chosen = pipeline_options(assemble_beam_flags(runner, mine, LocalDefaults(workers=3))).get_all_options()
    assert (chosen["direct_num_workers"], chosen["direct_running_mode"]) == (5, "multi_threading")


@pytest.mark.parametrize("zero", [["--direct_num_workers", "0"], ["--direct_num_workers=0"]])
def test_direct_num_workers_0_is_one_per_usable_cpu(monkeypatch: pytest.MonkeyPatch, zero: list[str]) -> None:
    """(left58 F2) `--direct_num_workers 0`, Beam's "one per core", started the host's count of worker processes
    (multiprocessing.cpu_count), each loading torch and the model: 64 in a container held to 2 CPUs of a 64-core host,
    where --workers (env57 F1) counts 2. It is now the CPUs this process may use, as --workers counts them."""
    import dilstore.pipelines.options as options

    monkeypatch.setattr(options, "usable_cpu_count", lambda: 2)
    values = pipeline_options(assemble_beam_flags("DirectRunner", zero, LocalDefaults(workers=2))).get_all_options()
    assert (values["direct_num_workers"], values["direct_running_mode"]) == (2, "multi_processing")


def test_dask_gets_the_launchers_cluster_and_one_partition_per_shard() -> None:
    defaults = LocalDefaults(workers=2, dask_address="tcp://127.0.0.1:8786", dask_partitions=8)
    values = pipeline_options(assemble_beam_flags(DASK_RUNNER, [], defaults)).get_all_options()
    assert (values["address"], values["npartitions"]) == ("tcp://127.0.0.1:8786", 8)


@contextlib.contextmanager
def constructed(built: PrecomputeJob, options: PipelineOptions) -> Iterator[BeamPipeline]:
    """The pipeline of `built`, never run: Beam deletes the `beam-pipeline-temp*` folder each pipeline makes only in
    `run()`, so this does, rather than leave one in /tmp per test run."""
    pipeline = build_pipeline(built, options)
    try:
        yield pipeline
    finally:
        shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)


def test_dataflow_options_are_assembled_and_the_graph_constructs(tmp_path: Path) -> None:
    flags = assemble_beam_flags("DataflowRunner", DATAFLOW_ARGS, LocalDefaults(workers=4))
    options = pipeline_options(flags)
    values = options.get_all_options(drop_default=True)
    assert values == {"runner": "DataflowRunner", "project": "p", "region": "r", "temp_location": "gs://b/tmp",
                      "setup_file": "./pyproject.toml"}
    with pytest.raises(DilstoreError, match="Invalid Project ID"):
        build_pipeline(job(tmp_path, "DataflowRunner"), options)
    buildable = pipeline_options(assemble_beam_flags("DataflowRunner", DATAFLOW_BUILD_ARGS, LocalDefaults()))
    with constructed(job(tmp_path, "DataflowRunner"), buildable) as pipeline:
        assert type(pipeline.runner).__name__ == "DataflowRunner"
        labels = {transform.unique_name for transform in pipeline.to_runner_api().components.transforms.values()}
    assert {"Precompute/Read", "Precompute/Route", "Precompute/GroupByShard", "Precompute/WriteGroups",
            "Precompute/Finish"} <= labels


def test_beam_s_folder_of_a_local_run_is_made_in_the_command_s_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(leak60 F1) Beam's Pipeline made `$TMPDIR/beam-pipeline-temp*` when built and removed it only as run()
    ended: each `precompute` killed mid-run (SIGKILL, the out-of-memory killer) left one in $TMPDIR that no later run
    removed. It is now made in the run's scratch folder (`progress_dir`), which the next precompute removes."""
    temporary, scratch = tmp_path / "tmp", tmp_path / "scratch"
    temporary.mkdir()
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # $TMPDIR, as tempfile reads it
    local = pipeline_options(assemble_beam_flags("DirectRunner", [], LocalDefaults(workers=2)))
    with constructed(dataclasses.replace(job(tmp_path, "DirectRunner"), progress_dir=str(scratch)), local) as pipeline:
        assert list(temporary.iterdir()) == []
        assert Path(pipeline.local_tempdir).parent == scratch
        assert Path(pipeline.local_tempdir).name.startswith("beam-pipeline-temp")


def test_a_beam_folder_beam_has_written_into_stays_beam_s_to_remove(tmp_path: Path) -> None:
    """(mut60 M2) `beam_folder_into` moves Beam's `beam-pipeline-temp*` folder into the scratch folder only while it
    is empty. One with a file in it stays the pipeline's `local_tempdir`, which run() removes as it ends: a new
    folder in its place would leave it, and what it holds, in $TMPDIR for good. Only the empty case was tested. A
    stand-in pipeline holds the folder (no Beam pipeline is built)."""
    from types import SimpleNamespace

    scratch, written = tmp_path / "scratch", tmp_path / "beam-pipeline-temp-written"
    scratch.mkdir()
    written.mkdir()
    (written / "part").write_text("x")
    pipeline = SimpleNamespace(local_tempdir=str(written))
    beam_folder_into(pipeline, str(scratch))  # type: ignore[arg-type]
    assert pipeline.local_tempdir == str(written)
    assert (written / "part").read_text() == "x"
    assert list(scratch.iterdir()) == []


def test_flink_options_are_assembled_and_the_graph_constructs(tmp_path: Path) -> None:
    options = pipeline_options(assemble_beam_flags("FlinkRunner", FLINK_ARGS, LocalDefaults(workers=4)))
    values = options.get_all_options(drop_default=True)
    assert values == {"runner": "FlinkRunner", "flink_master": "host:8081", "environment_type": "LOOPBACK"}
    with constructed(job(tmp_path, "FlinkRunner"), options) as pipeline:
        assert type(pipeline.runner).__name__ == "FlinkRunner"
        assert len(pipeline.to_runner_api().components.transforms) > 10


@pytest.mark.parametrize(
    ("runner", "args", "here", "ends"),
    [("DirectRunner", [], True, True), ("FnApiRunner", [], True, True), (DASK_RUNNER, [], True, False),
     ("PortableRunner", ["--job_endpoint", "embed", "--environment_type", "LOOPBACK"], True, True),
     ("PortableRunner", ["--job_endpoint=embed", "--environment_type=LOOPBACK"], True, True),
     ("PortableRunner", ["--job_endpoint", "localhost:8099", "--environment_type", "LOOPBACK"], False, False),
     ("PortableRunner", ["--job_endpoint", "embed", "--setup_file", "./setup.py"], False, False),
     ("FlinkRunner", FLINK_ARGS, False, False)],
)  # fmt: skip
def test_which_runs_run_here_and_end_with_this_process(runner: str, args: list[str], here: bool, ends: bool) -> None:
    """A Portable run on the embedded job server with LOOPBACK workers is local: it got Beam's INFO lines, no
    progress bar, and its files were kept as a job's that might go on (arch42 M1)."""
    options = pipeline_options(assemble_beam_flags(runner, args, LocalDefaults()))
    assert (runs_here(options), ends_with_this_process(options)) == (here, ends)


@pytest.mark.parametrize(
    ("runner", "args", "message"),
    [
        ("DirectRunner", ["--bogus_option", "1"], "unknown Beam option.*--bogus_option"),
        # Beam dropped it with a log line and the run went on without it; the dashed Dask one was named back with
        # underscores, the spelling Beam knows (readme37 M3).
        ("DirectRunner", ["--temp-location", "/tmp/t"],
         r"unknown Beam option\(s\): --temp-location \(Beam spells it --temp_location\)$"),
        ("DaskRunner", ["--dask-client-address=tcp://h:1"],
         r"unknown Beam option\(s\): --dask-client-address \(Beam spells it --dask_client_address\)$"),
        ("DataflowRunner", ["--project", "p", "--setup_file", "./pyproject.toml"], "needs --region, --temp_location"),
        ("DataflowRunner", ["--project", "p", "--region", "r", "--temp_location", "gs://b/t"], "ship dilstore"),
        ("FlinkRunner", ["--flink_master", "host:8081", "--environment_type", "DOCKER"], "ship dilstore"),
        # It passed the checks and failed inside Beam 11 s later, "You must specify a --job_endpoint" (arch42 M1).
        ("PortableRunner", ["--environment_type", "LOOPBACK"], "PortableRunner needs --job_endpoint: .* or embed"),
        # Beam's parser printed its whole usage (129 lines) and exited; -3 workers failed inside the run.
        ("DirectRunner", ["--direct_running_mode", "bogus"],
         "bad Beam option value: argument --direct_running_mode: invalid choice: 'bogus'"),
        ("DirectRunner", ["--direct_num_workers", "abc"],
         "bad Beam option value: argument --direct_num_workers: invalid int value: 'abc'"),
        ("DirectRunner", ["--direct_num_workers=-3"], "--direct_num_workers must be 0 .one per core. or more, got -3"),
        # A Dask bag of no partitions ran no step, and the run exited 0 with nothing stored (dask50 F1).
        (DASK_RUNNER, ["--dask_npartitions", "-1"], r"--dask_npartitions must be 1 or more \(or 0 .*\), got -1$"),
        (DASK_RUNNER, ["--dask_partition_size=-5"], r"--dask_partition_size must be 1 or more \(or 0 .*\), got -5$"),
        # It failed inside the run as "could not convert string to float: '1-1'", naming no option (multi53 F4).
        (DASK_RUNNER, ["--dask_connection_timeout", "-1"], r"^--dask_connection_timeout must be 0 or more seconds, "
                                                             r"got -1$"),
    ],
)  # fmt: skip
def test_options_that_cannot_work_are_refused(runner: str, args: list[str], message: str, capsys) -> None:
    with pytest.raises(DilstoreError, match=message):
        pipeline_options(assemble_beam_flags(runner, args, LocalDefaults()))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag", ["--dask_npartitions", "--dask_partition_size"])
def test_a_zero_dask_partitioning_flag_is_beam_s_own_guess(flag: str) -> None:
    options = pipeline_options(assemble_beam_flags(DASK_RUNNER, [flag, "0"], LocalDefaults(dask_partitions=4)))
    assert options.get_all_options()[flag.removeprefix("--dask_")] == 0


def test_bad_values_from_two_threads_leave_stderr_alone(capsys) -> None:
    """The refusal was read off a redirected stderr: two threads' precompute calls could leave sys.stderr a
    StringIO for good, every later traceback lost (api42 H1)."""
    stderr = sys.stderr
    failures: list[str] = []

    def refuse() -> None:
        for _ in range(15):
            try:
                pipeline_options(assemble_beam_flags("DirectRunner", ["--direct_num_workers", "abc"], LocalDefaults()))
            except DilstoreError as error:
                failures.append(str(error))

    threads = [threading.Thread(target=refuse) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sys.stderr is stderr and capsys.readouterr().err == ""
    assert failures == ["bad Beam option value: argument --direct_num_workers: invalid int value: 'abc'"] * 30


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--output", "gs://bucket/store"), ("--output", "s3://bucket/store"), ("--input", "gs://bucket/corpus.jsonl")],
)
def test_object_storage_urls_are_refused_before_anything_is_written(
    flag: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dilstore.runners.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["precompute", flag, value]) == 2
    assert "URLs are not supported by `dilstore precompute`" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_job_server_that_never_answers_is_named_with_the_options_that_bound_the_wait() -> None:
    """grpc's FutureTimeoutError has no message: after minutes the run said only "the pipeline failed:
    FutureTimeoutError"."""
    class FutureTimeoutError(Exception):
        """grpc's, by name (the one a PortableRunner raises when the job server does not answer)."""

    options = pipeline_options(assemble_beam_flags(
        "PortableRunner", ["--job_endpoint", "localhost:1", "--job_server_timeout", "10",
                           "--environment_type", "LOOPBACK"], LocalDefaults()))  # fmt: skip
    assert pipeline_failure(FutureTimeoutError(), options) == (
        "no job server answered at localhost:1 within 10 s (--job_endpoint, --job_server_timeout)"
    )
    assert pipeline_failure(RuntimeError("a\nValueError: bad row\nlater"), options) == "ValueError: bad row"
    failing_disk = OSError(errno.EIO, os.strerror(errno.EIO))  # an fsync after the commit: the store may be whole
    assert pipeline_failure(failing_disk, options, "/s") == (
        "[Errno 5] Input/output error: check the disk of /s, then run the same command again (it goes on from the "
        "shards it finished, or says the store is complete)"
    )  # full49 F6


@pytest.mark.parametrize("after", ["[while running 'Commit: shard-00001 (ErrorCount 0)']", "log: see ErrorHandler"])
def test_a_worker_s_error_line_is_told_even_when_a_later_line_mentions_an_error_after_its_colon(after: str) -> None:
    """The telling line is the one whose exception name holds "Error" (before its colon): a later line that names
    one only in its text is not taken for it, and a full disk still gets its advice."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from dilstore.runners.worker_deaths import RERUN

    full = "OSError: [Errno 28] No space left on device: '/s/shards/shard-00001'"
    line = pipeline_failure(RuntimeError(f"Traceback (most recent call last):\n{full}\n{after}"), PipelineOptions([]),
                            "/s")  # fmt: skip
    assert line == f"{full}: free space on the disk of /s (or of $TMPDIR), then {RERUN}"


@pytest.mark.parametrize(("number", "said"), [
    (errno.EDQUOT, "free space under your quota on the disk of /s (or of $TMPDIR)"),
    (errno.EFBIG, "a file grew past the size this process may write (`ulimit -f`) or its filesystem holds: raise the "
                  "limit"),
])  # fmt: skip
def test_a_full_quota_or_a_file_size_limit_is_told_with_what_to_do_and_the_rerun_that_goes_on(
    number: int, said: str
) -> None:
    """A full quota ("Disk quota exceeded") or a file size limit met ("File too large", `ulimit -f`) ended precompute
    in the bare error line, where a full disk is told to free space and that the same command goes on (disk56 F5)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from dilstore.runners.worker_deaths import RERUN

    error = f"OSError: [Errno {number}] {os.strerror(number)} [while running 'Precompute/WriteGroups']"
    line = pipeline_failure(RuntimeError(f"Traceback (most recent call last):\n{error}"), PipelineOptions([]), "/s")
    assert line == f"{error}: {said}, then {RERUN}"


@pytest.mark.parametrize("number", [errno.EPERM, errno.EACCES, errno.EROFS])
def test_a_folder_made_read_only_part_way_is_told_with_the_rerun_that_goes_on(number: int) -> None:
    """An append whose folder was made read-only part way said only "PermissionError: [Errno 1] Operation not
    permitted: ..." (scale53 F3): the store is as it was, and the same command goes on once it can write."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from dilstore.runners.worker_deaths import RERUN

    denied = f"PermissionError: [Errno {number}] {os.strerror(number)}: '/s/appends/0123456789abcdef/passages'"
    line = pipeline_failure(RuntimeError(f"Traceback (most recent call last):\n{denied}\n[while running 'Finish']"),
                            PipelineOptions([]), "/s")  # fmt: skip
    said = "give this run access to that path again (a read-only mount or folder, its mode)"
    assert line == f"{denied}: {said}, then {RERUN}"


@pytest.mark.parametrize(
    ("runner", "args", "launched"),
    [
        ("FlinkRunner", FLINK_ARGS, [True, False, True]),
        (DASK_RUNNER, ["--dask_client_address", "tcp://127.0.0.1:1"], [True, False, True]),
        ("DirectRunner", [], [False, False, False]),
        (DASK_RUNNER, [], [False, False, False]),  # on the LocalCluster precompute starts, and stops with it
    ],
    ids=["flink", "dask-cluster-given", "direct", "dask-local-cluster"],
)
def test_a_job_a_remote_runner_took_is_marked_launched_and_a_refused_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: str, args: list[str], launched: list[bool]
) -> None:
    """The take-back of a failed start (pipelines/job.py) deleted the spec and codebook of a job still running on a
    remote runner: one whose launcher failed or was interrupted while it ran, or while run() was submitting it.
    A job on Dask's LocalCluster, which ends with the launcher, was kept as if remote."""
    from dilstore.pipelines.job import BuildAttempt

    class Failing:
        def wait_until_finish(self) -> None:
            raise RuntimeError("the launcher lost the job")  # an interrupt would end pytest itself

    class CutShort(BaseException):
        """Stands for a Ctrl-C inside run(), after the service may have taken the job (pytest ends on a real one)."""

    class Pipeline:
        def __init__(self, how: str) -> None:
            self.how = how

        def run(self) -> Failing:
            if self.how == "refused":
                raise RuntimeError("the service refused the job")
            if self.how == "cut":
                raise CutShort
            return Failing()

    # No Dask scheduler runs at the address the options name: the probe of it stands aside.
    monkeypatch.setattr("dilstore.runners.precompute_run.reach_dask_scheduler", lambda options: None)
    seen = []
    # The LocalCluster of "dask-local-cluster", started three times, runs no task: its worker process is forked from
    # this one, not spawned to import dask.distributed again (ci62a F6).
    with dask.config.set(forked_dask_workers()):
        for how in ("lost", "refused", "cut"):
            attempt = BuildAttempt()
            monkeypatch.setattr("dilstore.pipelines.precompute.build_pipeline", lambda job, options: Pipeline(how))
            with pytest.raises(CutShort if how == "cut" else DilstoreError):
                run_pipeline(job(tmp_path, runner), runner, args, 1, False, attempt)
            seen.append(attempt.launched)
    assert seen == launched


def test_values_dataflow_rejects_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Beam's validation errors came one a line after the error line, and two warnings repeating them came before
    it: six lines (dask37 L1). The command runs in this process (a fresh `python -m dilstore` spent 8-10 s importing
    torch, transformers and Beam, ci62a F2), where Beam's warnings are log records, not lines on stderr: none of
    Beam's may be logged at WARNING or above."""
    from dilstore.runners import cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "hello world"}\n', encoding="utf-8")
    (tmp_path / "pyproject.toml").touch()
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert cli.main(["precompute", "--input", str(corpus), "--output", str(tmp_path / "store"), "--runner",
                     "DataflowRunner", "--project", "p", "--region", "r", "--temp_location", "/local/t",
                     "--setup_file", str(tmp_path / "pyproject.toml")]) == 2  # fmt: skip
    said = capfd.readouterr().err
    assert said.startswith("dilstore precompute: error: invalid Beam options: Pipeline has validations errors: "
                           "Invalid GCS path (/local/t), given for the option: temp_location; Missing GCS path "
                           "option: staging_location; Invalid Project ID (p)"), said  # fmt: skip
    assert len(said.splitlines()) == 1, said
    beam_said = [record.getMessage() for record in caplog.records
                 if record.name.startswith("apache_beam") and record.levelno >= logging.WARNING]  # fmt: skip
    assert beam_said == [], beam_said
    assert not (tmp_path / "store").exists()


def test_an_options_class_defined_twice_still_parses(tmp_path: Path) -> None:
    """A notebook cell that defines a PipelineOptions subclass, run twice, registers two classes of one name:
    Beam takes the first, and dilstore's check of the flags raised argparse's "conflicting option string"
    (style38 M2)."""
    import gc

    from apache_beam.options.pipeline_options import PipelineOptions

    def define() -> type[PipelineOptions]:
        class NotebookOptions(PipelineOptions):
            @classmethod
            def _add_argparse_args(cls, parser) -> None:
                parser.add_argument("--dilstore_notebook_flag", default="x")

        return NotebookOptions

    classes = [define(), define()]
    try:
        options = pipeline_options(assemble_beam_flags("DirectRunner", ["--dilstore_notebook_flag", "y"],
                                                       LocalDefaults()))  # fmt: skip
        assert options.get_all_options()["dilstore_notebook_flag"] == "y"
    finally:
        classes.clear()
        gc.collect()  # the two classes leave PipelineOptions' subclasses, so later tests parse without them


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port no one listens on: bound for the test, so that no other process takes it, but never listening."""
    import socket

    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


@pytest.mark.parametrize("runner", ["PortableRunner", "FlinkRunner"])
def test_a_job_endpoint_no_one_listens_on_is_refused_at_once_and_nothing_is_launched(
    tmp_path: Path, closed_port: int, runner: str
) -> None:
    """`--runner portable --job_endpoint localhost:1` waited Beam's --job_server_timeout (300 s by default) for a
    connection refused at once, and Ctrl-C meanwhile kept the run's spec, so the next run with other settings was
    refused (multi53 F1); a FlinkRunner given a --job_endpoint waited the same way."""
    from dilstore.pipelines.job import BuildAttempt

    attempt = BuildAttempt()
    endpoint = f"127.0.0.1:{closed_port}"
    args = ["--job_endpoint", endpoint, "--environment_type", "LOOPBACK", "--job_server_timeout", "6"]
    started = time.monotonic()
    with pytest.raises(DilstoreError) as refused:
        run_pipeline(job(tmp_path, runner), runner, args, 1, False, attempt)
    assert time.monotonic() - started < 4, "refused at once, not after --job_server_timeout"
    assert str(refused.value).startswith(f"cannot reach a job server at {endpoint} (--job_endpoint): ")
    assert not attempt.launched


def test_a_job_endpoint_that_answers_grpc_passes_the_check(closed_port: int) -> None:
    """The check refuses only endpoints that cannot be reached: a gRPC server there (a job server) passes."""
    from concurrent import futures

    import grpc

    from dilstore.runners.precompute_run import reach_job_server

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        reach_job_server(pipeline_options(assemble_beam_flags(
            "PortableRunner", ["--job_endpoint", f"127.0.0.1:{port}", "--environment_type", "LOOPBACK"],
            LocalDefaults())))  # fmt: skip
    finally:
        server.stop(None)
    unreached = pipeline_options(assemble_beam_flags(
        "PortableRunner", ["--job_endpoint", f"127.0.0.1:{closed_port}", "--environment_type", "LOOPBACK"],
        LocalDefaults()))  # fmt: skip
    with pytest.raises(DilstoreError, match=r"cannot reach a job server at 127\.0\.0\.1:\d+ \(--job_endpoint\)"):
        reach_job_server(unreached)


@pytest.mark.parametrize(("address_space", "under"), [
    (None, ""),
    (3000 << 20, " under its address-space limit (ulimit -v) of 3,000 MiB"),
])  # fmt: skip
def test_a_run_out_of_memory_names_the_limit_and_the_options_that_bound_what_a_worker_holds(
    monkeypatch: pytest.MonkeyPatch, address_space: int | None, under: str
) -> None:
    """Under `ulimit -v 3000000` a run with a large --batch-tokens ended in torch's allocator line alone, naming
    neither the limit nor what to lower (limits59 F8)."""

    from apache_beam.options.pipeline_options import PipelineOptions

    from dilstore.runners.worker_deaths import RERUN

    address_space_limit(monkeypatch, address_space)
    torch_line = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 4732416 bytes. Error code 12 (Cannot allocate memory) [while running "
                  "'Precompute/WriteGroups']")  # fmt: skip
    # (mut59b M8) a map refused for want of memory, as a worker's OSError reaches the launcher: its text alone
    for error in (RuntimeError(torch_line), MemoryError(), RuntimeError(str(OSError(errno.ENOMEM, "Cannot allocate "
                                                                                   "memory")))):  # fmt: skip
        line = pipeline_failure(error, PipelineOptions([]), "/s")
        assert line.endswith(f": the run ran out of memory{under}: lower --batch-tokens or --workers, or give it "
                             f"more memory, then {RERUN}"), line  # fmt: skip
