"""A worker process that died under a run, in the launcher's one line (runners/worker_deaths.py, dask50 F3)."""

from __future__ import annotations

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
