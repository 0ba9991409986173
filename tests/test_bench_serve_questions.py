"""benchmarks/bench_serve.py's questions: a --questions that cannot be read is an error, not four built-in questions.

bench53 F3: a --questions path that was no file (a typo, a checkout without ../shared) made the load test ask four
fixed questions in turn, silently: the report named neither the file nor the count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
