"""`dilstore precompute`'s checks around its run, without running Beam: what counts as a finished run, and the
refusals made before anything is created (dask50)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dilstore.runners.cmd_precompute import nothing_stored
from dilstore.runners.precompute_run import finished_summary
from dilstore.storage.errors import DilstoreError


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
