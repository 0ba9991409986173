"""The same precompute pipeline on the Dask runner over a dask.distributed LocalCluster of 2 worker processes.

The store it writes must hold the same passages, tokens and states as the
DirectRunner's, byte for byte in the per-shard files, which also shows that
the project's own sink writes real files on Dask (Beam's WriteToParquet and
WriteToText write empty ones there). That cluster's workers are forked from
this process (dask's `fork` method), which has imported torch, transformers
and Beam already: spawned, each spent 8-10 s importing them before its first
task (ci62a F1). The cluster `dilstore precompute --runner dask` starts itself
spawns its worker, as a user's does, in
test_the_local_cluster_s_workers_write_through_the_quiet_filter_and_exit_at_once.
"""

from __future__ import annotations

import gc
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import distributed
import numpy as np
import pytest
from distributed import LocalCluster

from dilstore.pipelines.spec_file import SUMMARY_FILE
from dilstore.runners import cli
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import (
    forked_dask_workers,
    save_tiny_reader,
    store_contents,
    wiki_like_documents,
    write_jsonl,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("dask")
    return save_tiny_reader(folder / "tiny"), write_jsonl(folder / "corpus.jsonl", wiki_like_documents(30))


def arguments(model: Path, corpus: Path, store: Path, *extra: str) -> list[str]:
    return ["precompute", "--input", str(corpus), "--output", str(store), "--model", str(model), "--shards", "4",
            "--max-length", "48", "--threads", "1", "--encoding", "fp16", "--no-progress", *extra]


@pytest.mark.slow
def test_dask_on_a_two_process_local_cluster_writes_the_direct_runners_store(setup, tmp_path: Path) -> None:
    model, corpus = setup
    direct, on_dask = tmp_path / "direct", tmp_path / "dask"
    assert cli.main(arguments(model, corpus, direct, "--workers", "1")) == 0
    with (
        dask.config.set(forked_dask_workers()),
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
    ):
        assert len(cluster.workers) == 2
        assert cli.main(arguments(model, corpus, on_dask, "--runner", "dask",
                                  "--dask_client_address", cluster.scheduler_address)) == 0
        with cluster.get_client() as client:
            worker_pids = set(client.run(lambda: __import__("os").getpid()).values())
    assert len(worker_pids) == 2
    summary = json.loads((on_dask / SUMMARY_FILE).read_text())
    assert summary["runner"].endswith("DaskRunner") and summary["passages"] > 0
    assert verify_store(on_dask).ok
    theirs, mine = store_contents(direct), store_contents(on_dask)
    assert sorted(mine) == sorted(theirs)
    for passage_id, values in mine.items():
        for left, right in zip(values, theirs[passage_id], strict=True):
            assert np.array_equal(left, right) if isinstance(left, np.ndarray) else left == right
    for pattern in ("passages/*.parquet", "passages/jsonl/*.jsonl", "shards/*/tokens/ids/c/*"):
        files = sorted(path.relative_to(on_dask) for path in on_dask.glob(pattern))
        assert files and files == sorted(path.relative_to(direct) for path in direct.glob(pattern))
        for name in files:
            assert (on_dask / name).stat().st_size > 0
            assert (on_dask / name).read_bytes() == (direct / name).read_bytes(), name


@pytest.mark.slow
def test_the_local_cluster_s_workers_write_through_the_quiet_filter_and_exit_at_once(
    setup, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LocalCluster precompute starts was started before stderr was filtered, so its workers printed Beam's
    "apitools not found" warning on the terminal of a quiet run. Closing it after the job took 2 to 4 s: the worker's
    exit collected the garbage of half a million objects, until the nanny killed it at 4 s (dask57 F1)."""
    closes = []

    class TimedCluster(LocalCluster):
        def __exit__(self, *exc_info: object) -> None:
            with self.get_client() as client:
                frozen = list(client.run(gc.get_freeze_count).values())
            start = time.monotonic()
            super().__exit__(*exc_info)
            closes.append((frozen, time.monotonic() - start))

    monkeypatch.setattr(distributed, "LocalCluster", TimedCluster)
    model, corpus = setup
    assert cli.main(arguments(model, corpus, tmp_path / "s", "--runner", "dask", "--workers", "1")) == 0
    err = capfd.readouterr().err
    assert "apitools not found" not in err and "Traceback" not in err, err
    [(frozen, seconds)] = closes
    assert len(frozen) == 1 and frozen[0] > 100_000, frozen  # the job's objects, frozen before the close
    assert seconds < 2.5, f"the close took {seconds:.1f} s"


@pytest.fixture
def nobody_listening() -> Iterator[str]:
    """The address of a port no one listens on (a scheduler that is not running): bound for the test, so that no
    other process (another xdist worker's LocalCluster) can take it, but never listening, so connections fail."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"tcp://127.0.0.1:{bound.getsockname()[1]}"


def test_a_cluster_whose_worker_runs_in_this_process_is_refused(setup, tmp_path: Path, capsys) -> None:
    """Beam's Dask runner shares a step's output list between the tasks of an in-process worker: each repeated
    the ones before, and the run failed on "passage id ... occurs twice in one shard", blaming the corpus (perf43)."""
    model, corpus = setup
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        assert cli.main(arguments(model, corpus, tmp_path / "store", "--runner", "dask",
                                  "--dask_client_address", cluster.scheduler_address)) == 2  # fmt: skip
    said = capsys.readouterr().err
    assert said.strip() == (f"dilstore precompute: error: the Dask scheduler at {cluster.scheduler_address}: a worker "
                            "runs in this process (a LocalCluster or Client started with processes=False), where "
                            "Beam's Dask runner repeats a step's outputs across its tasks: start the cluster with "
                            "processes=True (the default)")  # fmt: skip
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("scheduler", ["missing-file", "not-running", "not-running-dask-config"])
def test_a_scheduler_that_cannot_be_reached_is_named_and_the_run_is_taken_back(
    setup, tmp_path: Path, nobody_listening: str, capsys: pytest.CaptureFixture[str], scheduler: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A missing --dask_scheduler_file hung for ever without a word; Ctrl-C while Beam's runner waited for a
    scheduler kept the run's spec, and the next command with other settings was refused (dask37 M1, M2)."""
    model, corpus = setup
    store = tmp_path / "store"
    given = {"missing-file": ["--dask_scheduler_file", str(tmp_path / "scheduler.json")],
             "not-running": ["--dask_client_address", nobody_listening, "--dask_connection_timeout", "1"],
             "not-running-dask-config": ["--dask_client_address", nobody_listening]}[scheduler]  # fmt: skip
    waits = []
    client = distributed.Client

    def recording(*args, **kwargs):
        waits.append(kwargs.get("timeout"))
        return client(*args, **kwargs)

    monkeypatch.setattr(distributed, "Client", recording)
    # Without --dask_connection_timeout the wait is dask's own connect timeout (30 s unless configured).
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        assert cli.main(arguments(model, corpus, store, "--runner", "dask", *given)) == 2
    assert waits == ([] if scheduler == "missing-file" else [1])
    said = capsys.readouterr().err
    if scheduler == "missing-file":
        assert f"--dask_scheduler_file {tmp_path / 'scheduler.json'} does not exist" in said
    else:
        assert f"cannot reach a Dask scheduler at {nobody_listening}: " in said and "(the wait is 1 s;" in said
    assert not store.exists(), "the spec is taken back: no job was handed over"


def test_an_address_that_accepts_but_never_answers_is_given_up_after_the_wait(
    setup, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """dask.distributed bounds the connection by --dask_connection_timeout but not its handshake: an address that
    accepts and never answers (here a socket that listens but never reads) hung the command for ever."""
    from dilstore.runners import precompute_run

    model, corpus = setup
    store = tmp_path / "store"
    monkeypatch.setattr(precompute_run, "HANDSHAKE_GRACE_SECONDS", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes each connection; nothing ever answers on it
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        given = ["--runner", "dask", "--dask_client_address", address, "--dask_connection_timeout", "1"]
        assert cli.main(arguments(model, corpus, store, *given)) == 2
    said = capsys.readouterr().err
    assert f"no Dask scheduler answered at {address} within 2 s: something there accepts connections" in said
    assert not store.exists(), "the spec is taken back: no job was handed over"


def test_the_local_cluster_s_kill_of_a_slow_worker_at_close_is_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Half the clean runs ended with "Worker process still alive after 4.0 seconds, killing", twice (dask37 L2)."""
    from dilstore.pipelines.options import DASK_RUNNER
    from dilstore.runners.precompute_run import local_runtime

    nanny = logging.getLogger("distributed.nanny")
    with caplog.at_level(logging.WARNING, logger="distributed.nanny"), local_runtime(DASK_RUNNER, 1, 1, []) as found:
        assert found.dask_address
        nanny.warning("Worker process still alive after 4.0 seconds, killing")
        nanny.warning("Worker exceeded 95% memory budget. Restarting")
    nanny.warning("Worker process still alive after 4.0 seconds, killing")  # another cluster's, not dilstore's
    assert [record.getMessage() for record in caplog.records if record.name == "distributed.nanny"] == [
        "Worker exceeded 95% memory budget. Restarting", "Worker process still alive after 4.0 seconds, killing"]


def test_a_worker_forked_from_this_process_is_not_taken_for_it() -> None:
    """A worker forked from the caller (dask's `fork` method) inherits its token and was refused as in-process,
    though each of its tasks gets its own copy of the step's outputs (review43 L2)."""
    import multiprocessing
    import os

    from dilstore.runners.precompute_run import _PROCESS_TOKEN, _is_this_process

    assert _is_this_process(_PROCESS_TOKEN, os.getpid())
    assert not _is_this_process("another process's token", os.getpid())
    with multiprocessing.get_context("fork").Pool(1) as forked:
        assert forked.apply(_is_this_process, (_PROCESS_TOKEN, os.getpid())) is False
