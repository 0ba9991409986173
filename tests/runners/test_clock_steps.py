"""What commands measure and record while the wall clock steps (an NTP correction, a VM resumed, a date set by hand).

Durations are measured on the monotonic clock: a wall-clock difference went
negative, or hours long, when the clock stepped during a run (time58).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dilstore.pipelines import job as job_module
from dilstore.pipelines.append import prepare_append
from dilstore.pipelines.finish import run_summary
from dilstore.pipelines.job import PrecomputeJob, prepare_store, run_spec
from dilstore.pipelines.routing import ReadTask
from dilstore.pipelines.run_stats import RunStats
from dilstore.reader.batching import BatchPolicy
from dilstore.runners import cmd_compact, cmd_index
from dilstore.storage.collection import collection_dir
from dilstore.storage.errors import DilstoreError
from dilstore.storage.location import StoreLocation
from dilstore.storage.manifest import read_manifest
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


def _one_input_job(tmp_path: Path) -> tuple[Path, SimpleNamespace]:
    """A one-document corpus and the settings of a 2-shard precompute of it, as run_spec reads them."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "title": "A", "text": "one two three"}\n', encoding="utf-8")
    job = SimpleNamespace(inputs=[ReadTask(str(corpus), "jsonl")], strategy="words", num_shards=2,
                          fingerprint=SimpleNamespace(to_dict=lambda: {}), compressor=None, codebook=None)  # fmt: skip
    return corpus, job


def test_a_store_whose_input_was_copied_again_byte_for_byte_says_how_to_go_on_with_it(tmp_path: Path) -> None:
    """(time58 F3) A store's spec records each input's modification time: an input copied or downloaded again, the
    same bytes, was refused as "differs in: inputs; choose another folder or pass --overwrite", and --overwrite
    started the whole build over. The refusal now names the input, both times in UTC, and the `touch` that gives
    the recorded time back, after which the same command goes on with the store."""
    corpus, job = _one_input_job(tmp_path)
    store = tmp_path / "store"
    assert prepare_store(store, run_spec(job), overwrite=False) is False
    recorded = corpus.stat().st_mtime_ns
    shutil.copyfile(corpus, tmp_path / "copy")  # copied back a day later, as cp without -p does
    os.replace(tmp_path / "copy", corpus)
    os.utime(corpus, ns=(recorded + 86_400 * 10**9,) * 2)
    with pytest.raises(DilstoreError, match="differs in: inputs") as refused:
        prepare_store(store, run_spec(job), overwrite=False)
    said = str(refused.value)
    assert f"`touch -d {job_module._utc(recorded, to_nanosecond=True)} {corpus}`" in said, said
    assert f"{corpus} (recorded 20" in said and "Z, now 20" in said, said
    os.utime(corpus, ns=(recorded, recorded))  # what that touch does
    assert prepare_store(store, run_spec(job), overwrite=False) is False  # the same run: it goes on


def test_a_stopped_append_whose_input_was_copied_again_is_kept_and_named_not_deleted(tmp_path: Path) -> None:
    """(time58 F4) An append is known by its inputs' paths, sizes and modification times: the same command run
    after its input was copied again (the same bytes, a new time) took the stopped append's folder, shards and all,
    for another killed append's leftovers and deleted it without a word, and encoded everything again. Now it is
    refused with the folder kept, naming the input, both times and the `touch` after which the command goes on."""
    store = build_store(tmp_path / "store", random_shards([2]))
    corpus = tmp_path / "more.jsonl"
    corpus.write_text('{"id": "b", "title": "B", "text": "four five six"}\n', encoding="utf-8")
    job = SimpleNamespace(inputs=[ReadTask(str(corpus), "jsonl")], strategy="words", num_shards=1,
                          fingerprint=SimpleNamespace(to_dict=lambda: {}), compressor=None, codebook=None,
                          replace=False)  # fmt: skip
    stopped = prepare_append(store, job, read_manifest(StoreLocation.parse(store)))
    (stopped.folder / "shards").mkdir()
    (stopped.folder / "shards" / "committed-work").write_text("a shard the stopped run committed")
    recorded = corpus.stat().st_mtime_ns
    shutil.copyfile(corpus, tmp_path / "copy")
    os.replace(tmp_path / "copy", corpus)
    os.utime(corpus, ns=(recorded + 3600 * 10**9,) * 2)
    with pytest.raises(DilstoreError, match=f"{stopped.folder}.* stopped append") as refused:
        prepare_append(store, job, read_manifest(StoreLocation.parse(store)))
    assert f"`touch -d {job_module._utc(recorded, to_nanosecond=True)} {corpus}`" in str(refused.value)
    assert (stopped.folder / "shards" / "committed-work").is_file()
    os.utime(corpus, ns=(recorded, recorded))
    resumed = prepare_append(store, job, read_manifest(StoreLocation.parse(store)))
    assert resumed.folder == stopped.folder and (stopped.folder / "shards" / "committed-work").is_file()


def test_a_progress_line_in_a_log_keeps_coming_when_the_wall_clock_steps_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """(time58 F5) tqdm times a bar with time.time(): after a wall clock stepped back an hour, `verify`, `precompute`,
    `train` and the evaluations wrote no progress line (in a log, one is due every 30 s) for that hour, and a
    terminal's bar stood still, as if the run hung. Bars run on a clock that never steps."""
    import io

    import tqdm
    import tqdm.std

    from dilstore.runners.cmd_store import BarProgress

    elapsed = [0.0]  # the true seconds since the bar opened
    wall, steady = time.time(), time.monotonic()
    monkeypatch.setattr(tqdm.std, "time", lambda: wall + elapsed[0] - (3600 if elapsed[0] > 60 else 0))
    monkeypatch.setattr(time, "monotonic", lambda: steady + elapsed[0])
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread reading the clocks meanwhile
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    with BarProgress("verify", disabled=False) as progress:
        progress.phase("hashes", 100_000, "B")
        for _ in range(600):  # ten minutes, the wall clock set back an hour after the first
            elapsed[0] += 1
            progress.advance(10)
        written = log.getvalue().splitlines()
    assert len(written) >= 15, written  # one line per 30 s: 19 in 10 minutes, not 2


def test_a_retimed_input_of_a_run_with_other_settings_too_is_not_offered_a_touch_that_cannot_help(
        tmp_path: Path) -> None:
    """(read58 F2) time58 F3's hint followed any refusal whose spec had a retimed input: a store of 2 shards asked
    for 3, its input copied again meanwhile, was told that `touch -d ...` "gives the recorded time back and this
    command goes on", and after that touch was refused again for its shard count. The touch is offered only where
    the modification times are all that differ."""
    corpus, job = _one_input_job(tmp_path)
    store = tmp_path / "store"
    assert prepare_store(store, run_spec(job), overwrite=False) is False
    os.utime(corpus, ns=(corpus.stat().st_mtime_ns + 86_400 * 10**9,) * 2)
    with pytest.raises(DilstoreError, match="differs in: inputs; shards") as refused:
        prepare_store(store, run_spec(SimpleNamespace(**{**vars(job), "num_shards": 3})), overwrite=False)
    assert "touch" not in str(refused.value), refused.value


@pytest.mark.parametrize(("recorded", "written"), [
    (1_796_150_712_123_456_789, "2026-12-01T18:45:12.123456789Z"),
    (-1_500_000_000, "1969-12-31T23:59:58.500000000Z"),  # before 1970: '@-2.500000000' was a second off
])
def test_the_touch_offered_for_a_retimed_input_is_one_macos_runs_too(recorded: int, written: str) -> None:
    """(read58 F3) time58 F3 and F4 offered `touch -d @SECONDS.NANOS FILE`: GNU's form alone, which macOS's touch
    (its -d takes YYYY-MM-DDThh:mm:SS[.frac][tz] only) refuses as an illegal time, and whose seconds were written
    a second off for a time before 1970. Both touches take the ISO 8601 time in UTC."""
    entry = {"path": "a b.jsonl", "format": "jsonl", "bytes": 3}
    found, wanted = {"inputs": [{**entry, "mtime_ns": recorded}]}, {"inputs": [{**entry, "mtime_ns": 5}]}
    assert f"`touch -d {written} 'a b.jsonl'`" in job_module.retimed_inputs(found, wanted)


def test_a_retimed_input_whose_times_differ_within_a_second_is_named_with_two_times_that_differ() -> None:
    """(read58 F5) The refusal wrote both modification times to the second: an input whose copy kept the second but
    not its fraction (tar, zip, a file system of whole seconds) was "recorded 2026-12-01T18:45:12Z, now
    2026-12-01T18:45:12Z", two equal times for the one thing said to differ. Such times are written to the ns."""
    entry = {"path": "a.jsonl", "format": "jsonl", "bytes": 3}
    recorded = 1_796_150_712_123_456_789
    found = {"inputs": [{**entry, "mtime_ns": recorded}]}
    wanted = {"inputs": [{**entry, "mtime_ns": recorded - recorded % 10**9}]}
    said = job_module.retimed_inputs(found, wanted)
    assert "(recorded 2026-12-01T18:45:12.123456789Z, now 2026-12-01T18:45:12.000000000Z)" in said, said
