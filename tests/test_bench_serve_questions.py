"""benchmarks/bench_serve.py's questions: a --questions that cannot be read is an error, not four built-in questions.

bench53 F3: a --questions path that was no file (a typo, a checkout without ../shared) made the load test ask four
fixed questions in turn, silently: the report named neither the file nor the count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from dilstore.storage.errors import DilstoreError
from tests.fixtures.benchmarks import benchmark_module


def test_a_missing_or_empty_questions_file_is_one_line_before_any_server_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing, empty = tmp_path / "missing.jsonl", tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with benchmark_module("bench_serve") as bench:
        assert bench.main(["--store", str(tmp_path), "--questions", str(missing)]) == 2
        assert capsys.readouterr().err == f"bench_serve: error: --questions {missing}: no such file\n"
        assert bench.main(["--store", str(tmp_path), "--questions", str(empty)]) == 2
        assert capsys.readouterr().err == f"bench_serve: error: --questions {empty} holds no questions\n"


def test_the_questions_asked_and_where_they_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": q, "answer": ["x"]}) + "\n" for q in "aba"), encoding="utf-8")
    with benchmark_module("bench_serve") as bench:
        assert bench.load_questions(questions) == (["a", "b"], str(questions))
        monkeypatch.setattr(bench, "DEFAULT_QUESTIONS", tmp_path / "absent.jsonl")
        fixed, source = bench.load_questions(None)
        assert fixed == bench.FALLBACK_QUESTIONS and source == "4 built-in questions about the default corpus"


def test_the_cli_phase_counts_a_refused_question_and_times_the_answered_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """json61 F1: `ask --json` prints `{"line", "error"}` on stdout for a question it refuses (ask50 F2), which has no
    timings, so a refused question ended the load test with a KeyError traceback and no report; every question
    refused is one line, not statistics' error of an empty list."""
    error = "the question is 300 characters long; questions may have at most 64 tokens"
    lines = [json.dumps({"line": 1, "question": "a", "timings": {"total": 0.5}}),
             json.dumps({"line": 2, "error": error}),
             json.dumps({"line": 3, "question": "c", "timings": {"total": 1.5}})]  # fmt: skip

    def ask(stdout: list[str]) -> subprocess.CompletedProcess:
        stderr = "".join(f"dilstore ask: error: {json.loads(line)['error']}\n" for line in stdout if "error" in line)
        return subprocess.CompletedProcess([], 2 if stderr else 0, "".join(f"{line}\n" for line in stdout), stderr)

    args = argparse.Namespace(store=tmp_path, cli_questions=3, top_p=5, threads=1, model=None)
    with benchmark_module("bench_serve") as bench:
        monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: ask(lines))
        report = bench.run_cli(args, ["a", "b", "c"])
        assert (report["questions"], report["refused"], report["median_question_seconds"]) == (2, 1, 1.0)
        monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: ask(lines[1:2]))
        with pytest.raises(DilstoreError, match="refused all 3 questions: dilstore ask: error: the question is 300"):
            bench.run_cli(args, ["a", "b", "c"])


def test_a_cli_phase_of_only_refusals_counts_the_questions_it_asked(tmp_path: Path, monkeypatch) -> None:
    """(mut61 M4) --cli-questions asks the first N of the questions; the line for all of them refused was seen only
    when N was all of them, and could count the questions it never asked."""
    refusal = "dilstore ask: error: the question is 300 characters long\n"
    done = subprocess.CompletedProcess([], 2, json.dumps({"line": 1, "error": "long"}) + "\n", refusal * 2)
    args = argparse.Namespace(store=tmp_path, cli_questions=2, top_p=5, threads=1, model=None)
    with benchmark_module("bench_serve") as bench:
        monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: done)
        with pytest.raises(DilstoreError, match="^`dilstore ask --json` refused all 2 questions: "):
            bench.run_cli(args, ["a", "b", "c", "d"])
