"""What commands measure and record while the wall clock steps (an NTP correction, a VM resumed, a date set by hand).

Durations are measured on the monotonic clock: a wall-clock difference went
negative, or hours long, when the clock stepped during a run (time58).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import pytest

from tests.fixtures.store_fixtures import build_store, random_shards


def _wall_clock_stepping_back(monkeypatch: pytest.MonkeyPatch, step: float = 3600.0) -> None:
    """time.time() goes back `step` seconds after its first reading, as an NTP step or a date set by hand does."""
    readings = itertools.chain([time.time()], itertools.count(time.time() - step))
    monkeypatch.setattr(time, "time", lambda: float(next(readings)))


def test_compact_and_index_seconds_stay_true_when_the_wall_clock_steps_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(time58 F1) `dilstore compact` and `dilstore index` timed themselves with time.time(): a clock stepped back
    an hour during the run made them say `in -3600.0 s` (`"seconds": -3600.0` with --json)."""
    from dilstore.runners import cmd_compact, cmd_index
    from dilstore.storage.collection import collection_dir

    store = build_store(tmp_path / "store", random_shards([3]))
    collection_dir(store).mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(cmd_index, "build_index", lambda *args, **kwargs: None)  # no JVM: the timing is the point
    _wall_clock_stepping_back(monkeypatch)
    compacted = cmd_compact.compact_command(argparse.Namespace(store=str(store), output=None, shards=None,
                                                               no_progress=True, json=True))  # fmt: skip
    indexed = cmd_index.index_store(argparse.Namespace(store=str(store), threads=1, no_progress=True, json=True))
    assert compacted["already_compact"] and 0 <= compacted["seconds"] < 60, compacted["seconds"]
    assert 0 <= indexed["seconds"] < 60, indexed["seconds"]
