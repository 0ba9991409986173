"""benchmarks/bench_search_start.py refuses arguments that would crash it or time nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module


@pytest.mark.parametrize(("argv", "named"), [
    (["--repeats", "0"], "--repeats: expected a positive integer, got 0"),
    (["--query", " "], "--query is empty"),
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, capsys, argv: list[str], named: str) -> None:
    """--repeats 0 ended in "no median for empty data"; an empty query compared searchers that found nothing."""
    with benchmark_module("bench_search_start") as bench, pytest.raises(SystemExit) as stopped:
        bench.main(["--index", str(tmp_path), *argv])
    assert stopped.value.code == 2 and named in capsys.readouterr().err
