"""`dilstore precompute`'s checks around its run, without running Beam: what counts as a finished run, and the
refusals made before anything is created (dask50)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from dilstore.pipelines.job import SHARDS_KEPT, unmade_if_nothing_stored
from dilstore.pipelines.options import (
    DASK_RUNNER,
    LocalDefaults,
    assemble_beam_flags,
    local_worker_limit,
    pipeline_options,
    refuse_too_many_workers,
    starts_local_workers,
)
from dilstore.runners import cli, cmd_precompute
from dilstore.runners.cmd_precompute import nothing_stored
from dilstore.runners.precompute_run import check_scheduler_file, finished_summary
from dilstore.runners.worker_deaths import RERUN
from dilstore.storage import cpus
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.fingerprint import FingerprintMismatchError
from dilstore.storage.format import SPEC_FILE


def test_a_pipeline_that_ended_without_a_summary_failed(tmp_path: Path) -> None:
    """A Dask run with a negative --dask_npartitions ran no step and exited 0 with `{}` (dask50 F1)."""
    job = SimpleNamespace(store=str(tmp_path), destination=None)
    with pytest.raises(DilstoreError, match=f"ended without finishing {tmp_path}: it wrote no run-summary.json"):
        finished_summary(job)
    (tmp_path / "run-summary.json").write_text('{"passages": 3}\n', encoding="utf-8")
    assert finished_summary(job) == {"passages": 3}


def test_a_summary_without_passages_is_a_failure_unless_the_store_was_already_complete() -> None:
    assert "without a summary" in nothing_stored({}, "/s")
    assert "without a summary" in nothing_stored({"store": "/s"}, "/s")
    assert nothing_stored({"store": "/s", "already_complete": True}, "/s") is None
    assert nothing_stored({"passages": 2}, "/s") is None
    assert nothing_stored({"passages": 0}, "/s").startswith("no passage was stored")


@pytest.mark.parametrize("append", [False, True])
def test_an_append_s_summary_table_says_its_counts_are_the_append_s(
    append: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(obs57 F4) After `--append` of 20 documents to a store of 428 passages, the table read "passages 28, shards 1,
    store wiki-store", as if that were the store now."""
    summary = {"documents": 20, "passages": 28, "shards": 1, "rejected": 0, "store": "/s"}
    monkeypatch.setattr(cmd_precompute, "precompute_store", lambda args: (summary, None, None))
    assert cmd_precompute.run_command(SimpleNamespace(json=False, append=append)) == 0
    first = capsys.readouterr().out.splitlines()[0]
    if append:
        assert first == "precompute summary of this append (`dilstore info STORE` counts the whole store)"
    else:
        assert first == "precompute summary"


@pytest.mark.parametrize(
    ("runner", "beam_args", "local"),
    [
        ("DirectRunner", [], True),
        ("FnApiRunner", [], True),
        ("DirectRunner", ["--direct_num_workers", "2"], False),  # checked as --direct_num_workers
        ("DirectRunner", ["--direct_running_mode", "multi_processing"], True),
        ("DirectRunner", ["--direct_running_mode=multi_threading"], False),  # threads, no process (review50 L5)
        ("FnApiRunner", ["--direct_running_mode", "in_memory"], False),
        (DASK_RUNNER, [], True),  # the LocalCluster dilstore starts
        (DASK_RUNNER, ["--dask_client_address", "tcp://h:8786"], False),  # a cluster of its own size
        (DASK_RUNNER, ["--dask_scheduler_file=s.json"], False),
        ("DataflowRunner", [], False),  # sized by Dataflow's own --num_workers
        ("FlinkRunner", [], False),
    ],
)
def test_workers_is_bounded_only_where_it_starts_processes_here(runner: str, beam_args: list[str], local) -> None:
    assert starts_local_workers(runner, beam_args) is local


@pytest.fixture
def two_of_64_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container held to 2 CPUs (its cpuset) of a 64-core host, with no cgroup CPU quota."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda *where: None)


@pytest.mark.usefixtures("two_of_64_cpus")
def test_workers_and_threads_follow_the_cpus_the_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container held to 2 CPUs of a 64-core host, `precompute` started 64 worker processes, each loading torch
    and the model, allowed up to 256, and gave --workers 1 64 torch threads; OMP_NUM_THREADS was overridden (env57 F1).
    """
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cli.build_parser().parse_args(["precompute"]).workers == 2
    assert (cmd_precompute.default_threads(1), cmd_precompute.default_threads(2), local_worker_limit()) == (2, 1, 8)
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda *where: 1)  # `docker run --cpus 0.5`: one CPU's worth
    assert (cli.build_parser().parse_args(["precompute"]).workers, cmd_precompute.default_threads(1)) == (1, 1)
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda *where: None)
    for value, threads in (("1", 1), ("1,1", 1), ("8", 2), ("", 2), ("none", 2)):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert cmd_precompute.default_threads(1) == threads, value


@pytest.mark.usefixtures("two_of_64_cpus")
def test_more_local_workers_than_the_bound_are_refused() -> None:
    """`--workers 100000` forked workers until memory ran out, or hung building a LocalCluster (dask50 F2)."""
    assert local_worker_limit() == 8
    refuse_too_many_workers("--workers", 8)
    with pytest.raises(DilstoreError, match=r"^--workers 9 is more than 8 \(4 per CPU of the 2 this process may use\)"):
        refuse_too_many_workers("--workers", 9)
    processes = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "100000"]
    with pytest.raises(DilstoreError, match=r"^--direct_num_workers 100000 is more than 8 "):
        pipeline_options(assemble_beam_flags("DirectRunner", processes, LocalDefaults()))
    threads = ["--direct_running_mode", "multi_threading", "--direct_num_workers", "12"]  # no process (review50 L5)
    assert pipeline_options(assemble_beam_flags("DirectRunner", threads, LocalDefaults())).get_all_options()[
        "direct_num_workers"] == 12  # fmt: skip


@pytest.mark.usefixtures("two_of_64_cpus")
def test_too_many_workers_exit_2_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s"
    assert cli.main(["precompute", "--output", str(store), "--runner", "dask", "--workers", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dilstore precompute: error: --workers 100000 is more than 8 ") and err.count("\n") == 1
    assert not store.exists()


@pytest.mark.usefixtures("two_of_64_cpus")
@pytest.mark.parametrize(("runner", "refused"), [("direct", True), ("dask", True), ("dataflow", False)])
def test_threads_past_4_per_cpu_are_refused_only_for_workers_that_run_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runner: str, refused: bool
) -> None:
    """(read61 F1) `precompute --threads` sets torch's threads in each worker; a remote runner's workers have CPUs of
    their own, but the bound per CPU of this machine was applied when the option was parsed: `--runner dataflow
    --threads 16` was a usage error on a 2-CPU launcher. Local workers are still held to 4 per CPU (complex61 F9),
    and every runner to what torch takes."""
    store = tmp_path / "s"
    assert cli.main(["precompute", "--output", str(store), "--runner", runner, "--threads", "9"]) == 2
    err = capsys.readouterr().err
    beyond = "--threads: expected at most 8 threads (4 per CPU of the 2 this process may use), got 9"
    assert (beyond in err) == refused and err.count("\n") == 1, err
    assert not store.exists()
    with pytest.raises(SystemExit) as exited:
        cli.main(["precompute", "--output", str(store), "--runner", runner, "--threads", str(2**31)])
    assert exited.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"argument --threads: expected a positive integer of at most {2**31 - 1} (torch's most), got {2**31}")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "it is not a JSON object"),
        ("{not json", "it is not a JSON object"),
        ("[1, 2]", "it is not a JSON object"),
        ('{"address": 5}', 'no string "address" in it'),
        ('{"id": "Scheduler-1"}', 'no string "address" in it'),
    ],
)
def test_a_scheduler_file_that_names_no_scheduler_is_refused_with_what_is_wrong(
    tmp_path: Path, content: str, why: str
) -> None:
    """Each was "cannot reach a Dask scheduler at FILE: AssertionError" (dask50 F5)."""
    path = tmp_path / "scheduler.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DilstoreError, match=f"^--dask_scheduler_file {path} holds no scheduler address: {why} "):
        check_scheduler_file(str(path))
    path.write_text('{"address": "tcp://127.0.0.1:8786", "type": "Scheduler"}', encoding="utf-8")
    check_scheduler_file(str(path))
    with pytest.raises(DilstoreError, match="does not exist"):
        check_scheduler_file(str(tmp_path / "absent.json"))


def test_a_scheduler_file_nested_deeper_than_the_stack_is_refused_in_one_line(tmp_path: Path) -> None:
    """A --dask_scheduler_file holding JSON nested 100,000 deep ended `precompute` in a RecursionError traceback
    before any work (complex61 F6)."""
    path = tmp_path / "scheduler.json"
    path.write_text('{"address": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    with pytest.raises(DilstoreError, match=f"^--dask_scheduler_file {path} holds no scheduler address: its JSON is "
                                            "nested too deep to read "):  # fmt: skip
        check_scheduler_file(str(path))


RUN_AGAIN = "interrupted; run the same command again to go on (the shards it finished are kept)"


def test_a_stop_whose_start_was_taken_back_says_nothing_was_kept(tmp_path: Path) -> None:
    """A Ctrl-C before any shard was written said "run the same command again to go on (the shards it finished are
    kept)" of a folder that the take-back had just removed (dask50 F8)."""
    store = tmp_path / "s"
    with pytest.raises(StoppedBySignal) as stop:
        with unmade_if_nothing_stored(store):
            store.mkdir()
            (store / SPEC_FILE).write_text("{}", encoding="utf-8")
            raise StoppedBySignal(RUN_AGAIN, signal.SIGINT)
    assert (str(stop.value), stop.value.signal_number) == ("interrupted before any shard was stored; nothing was "
                                                            "kept", signal.SIGINT)  # fmt: skip
    assert not store.exists()
    with pytest.raises(StoppedBySignal, match=r"^stopped by SIGTERM before any shard was stored; nothing was kept$"):
        with unmade_if_nothing_stored(store):
            store.mkdir()
            raise StoppedBySignal("stopped by SIGTERM; run the same command again ...", signal.SIGTERM)
    with pytest.raises(StoppedBySignal, match=f"^{re.escape(RUN_AGAIN)}$"):  # a shard kept: the hint stays
        with unmade_if_nothing_stored(store):
            (store / "shards").mkdir(parents=True)
            raise StoppedBySignal(RUN_AGAIN, signal.SIGINT)
    assert (store / "shards").is_dir()


def test_the_runners_rerun_advice_ends_as_the_take_back_rewrites_it() -> None:
    assert RERUN.endswith(SHARDS_KEPT)


def test_a_build_taken_back_says_no_shard_was_kept_and_a_replaced_store_is_as_it_was(tmp_path: Path) -> None:
    """A worker that died before any shard was stored said "(the shards it finished are kept)" of a folder the
    take-back removed (review50 L3); a stopped --overwrite said "nothing was kept" of a store still whole (L2)."""
    building, store = tmp_path / ".s.dilstore-building", tmp_path / "s"
    died = f"the pipeline failed: a worker process died (exit 137); run the same command again to go on {SHARDS_KEPT}"
    with pytest.raises(DilstoreError) as failed:
        with unmade_if_nothing_stored(building):
            building.mkdir()
            raise DilstoreError(died)
    assert str(failed.value) == ("the pipeline failed: a worker process died (exit 137); run the same command again "
                                 "to go on (none was stored: it starts anew)")  # fmt: skip
    with pytest.raises(StoppedBySignal) as stopped:
        with unmade_if_nothing_stored(building, replaces=store):
            building.mkdir()
            raise StoppedBySignal(RUN_AGAIN, signal.SIGINT)
    assert str(stopped.value) == f"interrupted before any shard was stored; nothing was kept; {store} is as it was"
    refused = FingerprintMismatchError("another model's store")  # promises nothing: raised as it is, of its type
    with pytest.raises(FingerprintMismatchError) as kept:
        with unmade_if_nothing_stored(building, replaces=store):
            building.mkdir()
            raise refused
    assert kept.value is refused and not building.exists()


def test_a_second_ctrl_c_while_the_first_stop_unwinds_keeps_its_resume_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second Ctrl-C, raised as a LocalCluster closed after the first, printed only "interrupted" (dask50 F8)."""

    def stopped_twice(args: object) -> None:
        try:
            raise StoppedBySignal(RUN_AGAIN, signal.SIGINT)
        finally:
            raise KeyboardInterrupt  # the second Ctrl-C, in the unwinding

    monkeypatch.setattr(cmd_precompute, "precompute_store", stopped_twice)
    assert cli.main(["precompute"]) == 130
    assert capsys.readouterr().err == f"dilstore precompute: {RUN_AGAIN}\n"
