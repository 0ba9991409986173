"""Live progress from pipeline workers to the launcher, through small files.

Beam metrics are not readable while a local pipeline runs, and workers may be
other processes (multi-processing DirectRunner, Dask). So each shard writer
records how many of its passages are encoded so far in one small file per
shard, replaced atomically after every batch, and the launcher sums the files
to drive its progress bar. Routing bundles likewise record how many stored
units they planned, which gives the bar its total before encoding starts
(grouping by shard waits for all routing). The folder lives outside the store
and is only used by local runners.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from dilstore.storage.atomic_files import atomic_write_text

_PREFIX = "shard-"
_PLANNED_PREFIX = "planned-"


def report_progress(progress_dir: str | None, shard: int, passages_done: int) -> None:
    """Record that `passages_done` passages of `shard` are finished (no-op without a folder)."""
    if progress_dir is None:
        return
    _write_count(Path(progress_dir) / f"{_PREFIX}{shard:05d}", passages_done)


def _write_count(path: Path, count: int) -> None:
    """Write `count` to `path` in a folder that still exists, else nothing: the launcher removes the folder as it
    stops, and an external Dask cluster's tasks, which run on, re-created it without its owner lock, a folder left
    in $TMPDIR for good (dask50 F6)."""
    with contextlib.suppress(FileNotFoundError):
        atomic_write_text(path, str(count), make_folder=False)


def passages_done(progress_dir: str | Path) -> int:
    """The number of passages finished over all shards, as last reported."""
    return _sum_counts(Path(progress_dir).glob(f"{_PREFIX}*"))


def _sum_counts(paths: Iterable[Path]) -> int:
    """The sum of the integers held by `paths` (files replaced or removed meanwhile count 0)."""
    total = 0
    for path in paths:
        try:
            total += int(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):  # replaced or removed while we looked
            continue
    return total


def report_planned(progress_dir: str | None, bundle: str, units: int) -> None:
    """Record that one routing bundle (named `bundle`, unique) planned `units` stored units."""
    if progress_dir is None or units == 0:
        return
    _write_count(Path(progress_dir) / f"{_PLANNED_PREFIX}{bundle}", units)


def passages_planned(progress_dir: str | Path) -> int:
    """The number of stored units all routing bundles so far planned."""
    return _sum_counts(Path(progress_dir).glob(f"{_PLANNED_PREFIX}*"))
