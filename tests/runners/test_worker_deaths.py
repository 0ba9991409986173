"""A worker process that died under a run, in the launcher's one line (runners/worker_deaths.py, dask50 F3)."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from dilstore.reader.quiet_mode import QUIET_ENV
from dilstore.runners import precompute_run, quiet, worker_deaths
from dilstore.runners.precompute_run import pipeline_failure
from dilstore.runners.worker_deaths import exit_words, worker_death
from dilstore.storage.errors import DilstoreError

RERUN = "run the same command again to go on (the shards it finished are kept)"


def test_a_lost_channel_names_the_first_worker_death_and_the_rerun() -> None:
    """A SIGKILLed worker ended the run with "the pipeline failed: Channel closed prematurely." (dask50 F3)."""
    assert worker_death(RuntimeError("Channel closed prematurely."), exits=[137, 134]) == (
        f"a worker process died (exit 137: killed, e.g. out of memory); {RERUN}"
    )


def test_a_lost_channel_under_another_error_counts_and_the_noted_exit_codes_are_read(monkeypatch) -> None:
    """The lost channel may be the cause of the error the run raised, and without `exits` the exit codes the run
    block noted are named (mut58: neither was tested; a death under another error read as another failure, and a
    death's exit code was left out)."""
    wrapped = RuntimeError("the pipeline failed")
    wrapped.__cause__ = RuntimeError("Channel closed prematurely.")
    monkeypatch.setattr(worker_deaths, "worker_exit_codes", lambda wait: [137])
    assert worker_death(wrapped) == f"a worker process died (exit 137: killed, e.g. out of memory); {RERUN}"


def test_a_worker_s_exit_in_the_error_itself_is_named_and_an_unknown_exit_is_left_out() -> None:
    wrapped = RuntimeError("bundle failed")
    wrapped.__cause__ = RuntimeError("Worker subprocess exited with return code 134")
    assert worker_death(wrapped, exits=[]) == f"a worker process died (exit 134: aborted); {RERUN}"
    assert worker_death(RuntimeError("Channel closed prematurely."), exits=[]) == f"a worker process died; {RERUN}"


def test_other_failures_are_no_worker_death() -> None:
    assert worker_death(RuntimeError("ValueError: bad row"), exits=[137]) is None


def test_exit_codes_in_words() -> None:
    assert [exit_words(code) for code in (137, -9, 139, 143, 1)] == [
        "exit 137: killed, e.g. out of memory",
        "exit -9: killed, e.g. out of memory",
        "exit 139: crashed",
        "exit 143: ended by SIGTERM",
        "exit 1",
    ]


def test_pipeline_failure_says_a_worker_died(monkeypatch) -> None:
    monkeypatch.setattr(worker_deaths, "EXIT_CODE_WAIT_SECONDS", 0.0)  # no run block: no exit code comes
    line = pipeline_failure(RuntimeError("Channel closed prematurely."), PipelineOptions([]))
    assert line == f"a worker process died; {RERUN}"


DASK_DIED = ("a Dask worker process died 4 times running one task (killed, or over its memory limit: a LocalCluster "
             f"worker gets RAM/--workers by default); {RERUN}")  # fmt: skip


def test_dask_s_killed_worker_says_the_workers_died_and_the_rerun() -> None:
    """On Dask the run ended with KilledWorker's text: a task key, a worker address, no next step (dask50 F4)."""
    from distributed.scheduler import KilledWorker

    killed = KilledWorker(("from_sequence-apply_dofn_to_bundle-87e4", 0), SimpleNamespace(address="tcp://a:1"), 3)
    assert worker_death(killed) == DASK_DIED
    assert pipeline_failure(killed, PipelineOptions([])) == DASK_DIED


def test_a_killed_worker_is_known_by_its_type_s_name() -> None:
    """The launcher imports no Dask to recognise it (a run on another runner has none loaded)."""

    class KilledWorker(Exception):
        pass

    wrapped = RuntimeError("the job failed")
    wrapped.__cause__ = KilledWorker("Attempted to run task 'x' on 4 different workers, but all those workers died")
    assert worker_death(wrapped) == DASK_DIED
    assert "2 times" in worker_death(KilledWorker("on 2 different workers, but all those workers died"))


def note_worker_death(code: int) -> None:
    """What Beam's `run_worker` thread does as its worker process dies: raise, from Beam's code, the exit code that
    the run block notes (runners/quiet.py)."""
    namespace: dict[str, object] = {"__name__": "apache_beam.runners.portability.local_job_service"}
    exec(f"def run():\n    raise RuntimeError('Worker subprocess exited with return code {code}')\n", namespace)
    thread = threading.Thread(target=namespace["run"], name="run_worker")
    thread.start()
    thread.join()


class WaitsOnADeadWorker:
    """A pipeline whose run, as Beam's DirectRunner did when a worker died as the last shard committed, waits for
    the dead worker (up to `seconds`, then fails the test) after its exit code was noted (hang50)."""

    def __init__(self, seconds: float = 10.0) -> None:
        self.seconds = seconds

    def run(self) -> WaitsOnADeadWorker:
        note_worker_death(137)
        threading.Event().wait(self.seconds)
        raise AssertionError("the launcher waited on for the dead worker")


@pytest.fixture
def direct_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SimpleNamespace:
    """run_pipeline's job for a DirectRunner run of WaitsOnADeadWorker, with a grace of 0.2 s."""
    from dilstore.pipelines import precompute

    monkeypatch.setenv(QUIET_ENV, "1")
    monkeypatch.setattr(worker_deaths, "DEAD_WORKER_GRACE_SECONDS", 0.2, raising=False)  # none before hang50
    monkeypatch.setattr(precompute_run, "with_resumed_shards", lambda job: job)
    monkeypatch.setattr(precompute, "build_pipeline", lambda job, options: WaitsOnADeadWorker())
    return SimpleNamespace(num_shards=1, progress_dir=None, store=str(tmp_path), destination=None, append_to=None)


def test_a_run_left_waiting_on_a_dead_worker_ends_with_the_death_line(direct_run) -> None:
    """A worker SIGKILLed as the last shard committed left the launcher waiting for it for good (hang50)."""
    started = time.monotonic()
    with pytest.raises(DilstoreError) as raised:
        precompute_run.run_pipeline(direct_run, "DirectRunner", [], workers=2, progress=False)
    assert str(raised.value) == f"the pipeline failed: a worker process died ({exit_words(137)}); {RERUN}"
    assert time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL, "the signal's handler is put back"


def test_a_store_the_run_finished_before_its_wait_was_ended_is_done(direct_run, tmp_path: Path) -> None:
    """The other worker may finish the store while Beam waits for the dead one: the run is then done (hang50)."""
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "run-summary.json").write_text('{"passages": 3}')
    assert precompute_run.run_pipeline(direct_run, "DirectRunner", [], workers=2, progress=False) == {"passages": 3}


def test_a_run_that_ends_within_the_grace_after_a_death_is_left_to_end(monkeypatch) -> None:
    """The block ends after its watch saw the death and long before the grace: nothing is raised, no signal is
    sent, and the watch ends with the block, so none can come later. No sleep: the block waits for the watch to
    have seen the death, and a grace of 60 s is one that no test machine reaches."""
    monkeypatch.setenv(QUIET_ENV, "1")
    seen: list[tuple[object, list[int]]] = []  # (the watch, the exit codes it saw)
    saw_death = threading.Event()
    first_death = worker_deaths._DeadWorkerWatch._first_death

    def noted(watch: object) -> list[int]:
        codes = first_death(watch)
        seen.append((watch, codes))
        saw_death.set()
        return codes

    monkeypatch.setattr(worker_deaths._DeadWorkerWatch, "_first_death", noted)
    with quiet.filtered_stderr(), worker_deaths.dead_worker_wait_bounded(grace_seconds=60.0):
        note_worker_death(137)
        assert saw_death.wait(30), "the watch did not see the worker's death"
    watchers = [thread for thread in threading.enumerate() if thread.name == "dilstore-dead-worker-watch"]
    for thread in watchers:
        thread.join(5)
    assert not [thread for thread in watchers if thread.is_alive()], "the watch outlived the block"
    [(watch, codes)] = seen
    assert codes == [137] and watch.codes == [], "the death was seen and no signal was sent"  # type: ignore[attr-defined]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL, "the signal's handler is put back"


def test_a_handler_of_the_wake_signal_set_before_the_block_gets_its_signals_and_is_put_back() -> None:
    """A caller's own SIGUSR1 handler receives a SIGUSR1 sent while no worker died, and is the handler again after
    the block, not the default (which ends the process)."""
    received: list[int] = []

    def callers_handler(number: int, frame: object) -> None:
        received.append(number)

    before = signal.signal(signal.SIGUSR1, callers_handler)
    try:
        with worker_deaths.dead_worker_wait_bounded(grace_seconds=60.0):
            signal.raise_signal(signal.SIGUSR1)
        assert received == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is callers_handler
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_wake_signal_that_arrives_after_the_block_ended_raises_nothing() -> None:
    """The watch had sent its signal (its codes are set) as the block ended: the block has ended, and its handler,
    which may run late, raises no DeadWorkerError into whatever the main thread does next."""
    watch = worker_deaths._DeadWorkerWatch(0.0, signal.SIG_DFL)
    watch.codes = [137]
    with pytest.raises(worker_deaths.DeadWorkerError, match=re.escape(exit_words(137))):
        watch.wake(signal.SIGUSR1, None)
    watch.end()
    assert watch.wake(signal.SIGUSR1, None) is None
