"""What commands measure and record while the wall clock steps (an NTP correction, a VM resumed, a date set by hand).

Durations are measured on the monotonic clock: a wall-clock difference went
negative, or hours long, when the clock stepped during a run (time58).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from pathlib import Path

import pytest

from dilstore.pipelines import job as job_module
from dilstore.pipelines.finish import run_summary
from dilstore.pipelines.job import PrecomputeJob
from dilstore.pipelines.run_stats import RunStats
from dilstore.reader.batching import BatchPolicy
from dilstore.runners import cmd_compact, cmd_index
from dilstore.storage.collection import collection_dir
from tests.fixtures.store_fixtures import build_store, fingerprint_for, random_shards


def _wall_clock_stepping_back(monkeypatch: pytest.MonkeyPatch, step: float = 3600.0) -> None:
    """time.time() goes back `step` seconds after its first reading, as an NTP step or a date set by hand does."""
    readings = itertools.chain([time.time()], itertools.count(time.time() - step))
    monkeypatch.setattr(time, "time", lambda: float(next(readings)))


def test_compact_and_index_seconds_stay_true_when_the_wall_clock_steps_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(time58 F1) `dilstore compact` and `dilstore index` timed themselves with time.time(): a clock stepped back
    an hour during the run made them say `in -3600.0 s` (`"seconds": -3600.0` with --json)."""
    store = build_store(tmp_path / "store", random_shards([3]))
    collection_dir(store).mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(cmd_index, "build_index", lambda *args, **kwargs: None)  # no JVM: the timing is the point
    _wall_clock_stepping_back(monkeypatch)
    compacted = cmd_compact.compact_command(argparse.Namespace(store=str(store), output=None, shards=None,
                                                               no_progress=True, json=True))  # fmt: skip
    indexed = cmd_index.index_store(argparse.Namespace(store=str(store), threads=1, no_progress=True, json=True))
    assert compacted["already_compact"] and 0 <= compacted["seconds"] < 60, compacted["seconds"]
    assert 0 <= indexed["seconds"] < 60, indexed["seconds"]


def test_a_precompute_summary_s_seconds_and_rate_stay_true_when_the_wall_clock_steps_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(time58 F2) The run summary's `seconds` was the worker's time.time() less the launcher's: a clock stepped back
    an hour during a run gave `seconds -3590.0` and `passages_per_second 3e+12` (the passages over 1e-9 s), in the
    summary printed, run-summary.json and the manifest. A worker on another machine with a clock behind the
    launcher's now says 0 s and no rate."""
    launched_wall, launched_monotonic = time.time(), time.monotonic()
    job = PrecomputeJob(inputs=(), store="unused", strategy="words", num_shards=1, max_length=64, model="unused",
                        fingerprint=fingerprint_for(), policy=BatchPolicy(), threads=1, runner="DirectRunner",
                        started_at=launched_wall, started_monotonic=launched_monotonic - 10,
                        started_on=job_module.this_machine())  # fmt: skip
    monkeypatch.setattr(time, "time", lambda: launched_wall - 3590.0)
    summary = run_summary(RunStats(passages=3000), job)
    assert 10 <= summary["seconds"] < 70 and 40 < summary["passages_per_second"] <= 300, summary
    elsewhere = run_summary(RunStats(passages=3000), dataclasses.replace(job, started_on="another machine"))
    assert elsewhere["seconds"] == 0 and elsewhere["passages_per_second"] is None, elsewhere
