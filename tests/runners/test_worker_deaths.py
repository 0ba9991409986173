"""A worker process that died under a run, in the launcher's one line (runners/worker_deaths.py, dask50 F3)."""

from __future__ import annotations

from types import SimpleNamespace

from apache_beam.options.pipeline_options import PipelineOptions

from dilstore.runners import worker_deaths
from dilstore.runners.precompute_run import pipeline_failure
from dilstore.runners.worker_deaths import exit_words, worker_death

RERUN = "run the same command again to go on (the shards it finished are kept)"


def test_a_lost_channel_names_the_first_worker_death_and_the_rerun() -> None:
    """A SIGKILLed worker ended the run with "the pipeline failed: Channel closed prematurely." (dask50 F3)."""
    assert worker_death(RuntimeError("Channel closed prematurely."), exits=[137, 134]) == (
        f"a worker process died (exit 137: killed, e.g. out of memory); {RERUN}"
    )


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
