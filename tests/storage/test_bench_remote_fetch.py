"""benchmarks/bench_remote_fetch.py measures a store of the settings asked, not one an earlier run left in --work.

bench53 F10: the store was kept under --work/store whatever it was built from, so a second run with other
--passages, --shards or --dim measured the first run's store under a header naming the new settings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dilstore.storage.reader import open_store
from tests.fixtures.benchmarks import benchmark_module


def _run(bench, work: Path, passages: int, shards: int, dim: int, capsys: pytest.CaptureFixture[str]) -> dict:
    argv = ["bench_remote_fetch.py", "--work", str(work), "--passages", str(passages), "--shards", str(shards),
            "--dim", str(dim), "--fetch", "3", "--repeats", "1", "--latency-ms", "0"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        bench.main()
    out = capsys.readouterr().out
    return json.loads(out[out.index("\n{") + 1 :])


def test_a_rerun_with_other_settings_measures_a_store_of_those_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with benchmark_module("bench_remote_fetch") as bench:
        first = _run(bench, tmp_path, 20, 2, 8, capsys)
        second = _run(bench, tmp_path, 15, 3, 32, capsys)  # fewer passages: every id asked is in the old store
        stores = sorted(path for path in tmp_path.iterdir() if (path / "manifest.json").is_file())
    assert len(stores) == 2 and second["store"]["bytes"] > first["store"]["bytes"]
    with open_store(next(store for store in stores if "15p" in store.name)) as store:
        assert (store.manifest.passages, len(store.manifest.shards), store.manifest.state_shape) == (15, 3, (32,))


def test_the_zarr_path_is_measured_checked_and_unchecked_with_the_same_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(left55b F3) The zarr-python path (every compressed store's) checks each answer's file version now; the script
    measures it beside FsspecStore's own reads, which must send the same requests and bytes."""
    from dilstore.storage.zarr_reads import RequiredChunksStore

    checked, entered = RequiredChunksStore._read, []
    with benchmark_module("bench_remote_fetch") as bench, pytest.MonkeyPatch.context() as patch:
        for name in ("answers_unchecked", "zarr_answers_unchecked"):  # (mut55) each path's own unchecked reads
            patch.setattr(bench, name, lambda real=getattr(bench, name), name=name: (entered.append(name), real())[1])
        rows = {row["path"]: row for row in _run(bench, tmp_path, 20, 2, 8, capsys)["rows"]}
    assert sorted(entered) == ["answers_unchecked", "zarr_answers_unchecked"]
    assert RequiredChunksStore._read is checked  # the checked reads are back after the unchecked turn (mut55)
    assert {"http zarr", "http zarr unchecked", "http ranged", "http ranged unchecked"} <= set(rows)
    for key in ("cold_requests", "cold_bytes", "warm_requests", "warm_bytes"):
        assert rows["http zarr"][key] == rows["http zarr unchecked"][key] > 0, key
