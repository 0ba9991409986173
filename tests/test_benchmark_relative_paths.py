"""Benchmark scripts whose children run in another folder take relative paths from the folder they were started in.

bench53 F8: bench_serve, bench_serve_reopen and bench_worker_memory run their `dilstore` children in the
repository's folder, bench_trees and bench_compact_memory in each source tree's: a relative --store, --work or
--work-dir was handed on as given and named another path there ("no store at REPO/…", after a copy, a build or a
server start; a CalledProcessError traceback in bench_worker_memory).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures.benchmarks import benchmark_module


@pytest.fixture
def started_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder, holding a fake store and a fake source tree (enough for the argument checks)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "manifest.json").write_text("{}", encoding="utf-8")
    (tmp_path / "tree" / "dilstore" / "storage").mkdir(parents=True)
    return tmp_path


def test_store_work_and_model_paths_are_absolute_after_parsing(started_here: Path) -> None:
    with benchmark_module("bench_serve") as bench:
        args = bench.parse_args(["--store", "store", "--model", "model"])
        assert (args.store, args.model) == (started_here / "store", started_here / "model")
    with benchmark_module("bench_serve_reopen") as bench:
        assert bench.parse_args(["--store", "store", "--work", "scratch"]).work == started_here / "scratch"
    with benchmark_module("bench_trees") as bench:
        assert bench.parse_args(["--trees", "tree", "--store", "store"]).store == started_here / "store"
    with benchmark_module("bench_compact_memory") as bench:
        assert bench.parse_arguments(["--work-dir", "work"]).work_dir == started_here / "work"


def test_bench_worker_memory_hands_its_children_the_absolute_store(
    started_here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    commands: list[list[str]] = []

    def child(command: list[str], **kwargs: object) -> SimpleNamespace:
        commands.append(command)
        return SimpleNamespace(stdout=json.dumps([]) + "\n")

    with benchmark_module("bench_worker_memory") as bench:
        monkeypatch.setattr(subprocess, "run", child)
        assert bench.main(["--store", "store", "--model", "model", "--batches", "1"]) == 0
    capsys.readouterr()
    for command in commands:
        assert command[command.index("--store") + 1] == str(started_here / "store")
        assert command[command.index("--model") + 1] == str(started_here / "model")
    assert len(commands) == 2
