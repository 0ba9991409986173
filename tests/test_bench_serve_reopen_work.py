"""benchmarks/bench_serve_reopen.py empties --work first: never when that would delete the store or other files.

bench53 F4: `--store W/store --work W` deleted the store (and everything else in W), then stopped in a
FileNotFoundError traceback copying the store it had just deleted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module


def _fake_store(folder: Path) -> Path:
    """Enough of a store for the checks, which run before anything is copied or started."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}", encoding="utf-8")
    return folder


@pytest.mark.parametrize("layout", ["store inside work", "work inside store", "work with other files"])
def test_a_work_folder_that_would_lose_data_is_refused_before_it_is_emptied(
    layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    if layout == "store inside work":
        store = _fake_store(work / "store")
    elif layout == "work inside store":
        store = _fake_store(tmp_path / "store")
        work = store / "scratch"
    else:
        store = _fake_store(tmp_path / "store")
        work.mkdir()
        (work / "notes.txt").write_text("keep me", encoding="utf-8")
    before = sorted(tmp_path.rglob("*"))
    with benchmark_module("bench_serve_reopen") as bench, pytest.raises(SystemExit) as stopped:
        bench.main(["--store", str(store), "--work", str(work)])
    assert stopped.value.code == 2
    assert "--work is emptied first" in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before, "nothing deleted"


def test_what_an_earlier_run_left_in_work_may_be_emptied(tmp_path: Path) -> None:
    store, work = _fake_store(tmp_path / "store"), tmp_path / "work"
    _fake_store(work / "store")
    (work / "new.jsonl").write_text("{}\n", encoding="utf-8")
    with benchmark_module("bench_serve_reopen") as bench:
        assert bench.work_problem(store, work) is None
        assert bench.work_problem(store, tmp_path / "absent") is None
        missing = tmp_path / "none"
        assert bench.work_problem(missing, work) == f"--store {missing}: no store there (no manifest.json)"
