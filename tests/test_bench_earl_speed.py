"""benchmarks/bench_earl_speed.py on a tiny protocol: stores reused only for the same settings, and errors in a line.

bench53 F2: the stores in --work were named by size, kind, length and encoding only, and one already there was
reused as it was: a rerun with more --candidates ended in a MissingPassagesError traceback after building nothing
new, and an unwritable --json-out in a traceback after the whole run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module

TINY = ["--lengths", "16", "--unique", "2", "--repeats", "1", "--threads", "1"]


@pytest.mark.shared_data
def test_a_rerun_with_more_candidates_times_all_of_them_in_a_store_of_its_own(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    common = ["--work", str(work), "--data", str(shared_data), *TINY]
    with benchmark_module("bench_earl_speed") as bench:
        assert bench.main([*common, "--candidates", "3", "--json-out", str(tmp_path / "three.json")]) == 0
        assert bench.main([*common, "--candidates", "5", "--json-out", str(tmp_path / "five.json")]) == 0
    capsys.readouterr()
    rows = json.loads((tmp_path / "five.json").read_text(encoding="utf-8"))["rows"]
    assert [row["candidates"] for row in rows] == [5]
    assert len({path.name for path in work.iterdir()}) == 4, "S1 and S2 stores for each of the two settings"


def test_an_unwritable_json_out_and_missing_data_are_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--work", str(tmp_path / "work"), "--candidates", "3", *TINY]
    missing = tmp_path / "no-folder" / "result.json"
    with benchmark_module("bench_earl_speed") as bench:
        assert bench.main([*common, "--json-out", str(missing)]) == 2
        assert capsys.readouterr().err == (
            f"bench_earl_speed: error: --json-out {missing}: the folder {missing.parent} does not exist\n"
        )
        assert not (tmp_path / "work").exists(), "refused before any store was built"
        assert bench.main([*common, "--data", str(tmp_path), "--json-out", str(tmp_path / "out.json")]) == 2
        data = tmp_path / "squad" / "dev-v1.1.json"
        assert capsys.readouterr().err == f"bench_earl_speed: error: {data}: no such file\n"
