"""Where the test suite spends its time: per-file seconds of two pytest runs, side by side.

CI must finish `make test` in 15 minutes on 2 cores, setup included. To see what a change did,
run the suite before and after with a JUnit report, then compare the two reports:

    CI=true .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/before.xml
    (change something)
    CI=true .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/after.xml
    .venv/bin/python benchmarks/suite_times.py /tmp/before.xml /tmp/after.xml --top 20

A file's seconds are the sum of its tests' setup, call and teardown as pytest reports them (xdist
workers run side by side, so the sum over files is test time, not wall time); the run's own time
is pytest's wall time. Prints a table of the files that changed most, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SuiteTimes:
    """One run's wall seconds and, per test file (dotted module name), its tests' summed seconds and count."""

    wall: float
    seconds: dict[str, float]
    tests: dict[str, int]


def read_report(path: Path) -> SuiteTimes:
    """The times of a pytest `--junitxml` report; a clear error if the file is not one."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as error:
        raise SystemExit(f"suite_times: cannot read {path} as a JUnit XML report: {error}") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise SystemExit(f"suite_times: {path} holds no <testsuite>; write it with pytest --junitxml")
    seconds: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for case in root.iter("testcase"):
        seconds[case.get("classname", "")] += float(case.get("time", 0))
        tests[case.get("classname", "")] += 1
    return SuiteTimes(sum(float(suite.get("time", 0)) for suite in suites), dict(seconds), dict(tests))


def compare(before: SuiteTimes, after: SuiteTimes) -> list[dict[str, object]]:
    """Per file: seconds and tests before and after, and the change; files in either run, largest change first."""
    rows = [
        {
            "file": name,
            "before_s": round(before.seconds.get(name, 0.0), 2),
            "after_s": round(after.seconds.get(name, 0.0), 2),
            "change_s": round(after.seconds.get(name, 0.0) - before.seconds.get(name, 0.0), 2),
            "tests_before": before.tests.get(name, 0),
            "tests_after": after.tests.get(name, 0),
        }
        for name in sorted(set(before.seconds) | set(after.seconds))
    ]
    return sorted(rows, key=lambda row: (-abs(row["change_s"]), row["file"]))


def totals(before: SuiteTimes, after: SuiteTimes) -> dict[str, float | int]:
    """Wall time, summed test time and test count of both runs."""
    return {
        "wall_before_s": round(before.wall, 1),
        "wall_after_s": round(after.wall, 1),
        "test_time_before_s": round(sum(before.seconds.values()), 1),
        "test_time_after_s": round(sum(after.seconds.values()), 1),
        "tests_before": sum(before.tests.values()),
        "tests_after": sum(after.tests.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the JUnit XML report of the first run")
    parser.add_argument("after", type=Path, help="the JUnit XML report of the second run")
    parser.add_argument("--top", type=int, default=15, help="files to show in the table (default 15)")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top must be at least 1, got {args.top}")
    before, after = read_report(args.before), read_report(args.after)
    rows, summary = compare(before, after), totals(before, after)
    print(f"{'file':<62} {'before s':>9} {'after s':>9} {'change':>8}")
    for row in rows[: args.top]:
        print(f"{row['file']:<62} {row['before_s']:>9.1f} {row['after_s']:>9.1f} {row['change_s']:>+8.1f}")
    print(f"{'test time (all files)':<62} {summary['test_time_before_s']:>9.1f} {summary['test_time_after_s']:>9.1f}")
    print(f"{'wall time':<62} {summary['wall_before_s']:>9.1f} {summary['wall_after_s']:>9.1f}")
    print(json.dumps({"totals": summary, "files": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
