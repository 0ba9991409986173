"""benchmarks/suite_times.py: two pytest JUnit reports compared per test file, and a clear error for other files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module


def write_report(path: Path, wall: float, cases: list[tuple[str, str, float]]) -> Path:
    """A JUnit XML report as pytest --junitxml writes it: (module, test name, seconds) per test."""
    rows = "".join(f'<testcase classname="{module}" name="{name}" time="{seconds}" />'
                   for module, name, seconds in cases)  # fmt: skip
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        f'<testsuite name="pytest" errors="0" failures="0" skipped="0" tests="{len(cases)}" time="{wall}">'
        f"{rows}</testsuite></testsuites>",
        encoding="utf-8",
    )
    return path


def test_files_are_summed_and_listed_by_the_size_of_their_change(tmp_path: Path, capsys) -> None:
    before = write_report(tmp_path / "before.xml", 100.0, [
        ("tests.a", "one", 10.0), ("tests.a", "two", 5.0), ("tests.b", "one", 40.0), ("tests.gone", "one", 1.0),
    ])  # fmt: skip
    after = write_report(tmp_path / "after.xml", 60.0, [
        ("tests.a", "one", 12.0), ("tests.a", "two", 5.5), ("tests.b", "one", 10.0), ("tests.new", "one", 3.0),
    ])  # fmt: skip
    with benchmark_module("suite_times") as suite_times:
        assert suite_times.main([str(before), str(after), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    result = json.loads(lines[-1])
    assert result["totals"] == {"wall_before_s": 100.0, "wall_after_s": 60.0, "test_time_before_s": 56.0,
                                "test_time_after_s": 30.5, "tests_before": 4, "tests_after": 4}  # fmt: skip
    assert [row["file"] for row in result["files"]] == ["tests.b", "tests.new", "tests.a", "tests.gone"]
    assert result["files"][0] == {"file": "tests.b", "before_s": 40.0, "after_s": 10.0, "change_s": -30.0,
                                  "tests_before": 1, "tests_after": 1}  # fmt: skip
    assert result["files"][1]["tests_before"] == 0 and result["files"][3]["tests_after"] == 0
    table = lines[1:-1]
    assert [line.split()[0] for line in table[:2]] == ["tests.b", "tests.new"] and len(table) == 4  # 2 rows + 2 totals


@pytest.mark.parametrize("content", ["not xml at all", "<html><body/></html>"])
def test_a_file_that_is_not_a_junit_report_is_named_in_one_line(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text(content, encoding="utf-8")
    good = write_report(tmp_path / "good.xml", 1.0, [("tests.a", "one", 1.0)])
    with benchmark_module("suite_times") as suite_times, pytest.raises(SystemExit, match=f"suite_times: .*{bad}"):
        suite_times.main([str(good), str(bad)])
