"""benchmarks/bench_trees.py serves as many /ask requests as --requests says, or stops before any tree runs.

bench53 F13: only the first 200 lines of --questions were read, so `--requests 500` timed 200 requests per server
while the report's settings said 500.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module


def _questions(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": ["a"]}) + "\n" for i in range(count)))
    return path


def test_as_many_questions_as_requests_or_a_line_before_any_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tree" / "dilstore" / "storage").mkdir(parents=True)
    (tmp_path / "passages.jsonl").write_text('{"id": "p", "contents": "text"}\n', encoding="utf-8")
    served: list[int] = []

    def one_round(tree: Path, args, questions: list[str], corpus: Path) -> dict[str, float]:
        served.append(len(questions[: args.requests]))
        return {"ask_cold_s": 1.0}

    common = ["--trees", str(tmp_path / "tree"), "--store", str(tmp_path), "--repeats", "1",
              "--passages", str(tmp_path / "passages.jsonl")]  # fmt: skip
    with benchmark_module("bench_trees") as bench:
        monkeypatch.setattr(bench, "one_round", one_round)
        many = _questions(tmp_path / "many.jsonl", 250)
        assert bench.main([*common, "--questions", str(many), "--requests", "240"]) == 0
        assert served == [240, 240]
        capsys.readouterr()
        few = _questions(tmp_path / "few.jsonl", 5)
        with pytest.raises(SystemExit, match=f"--questions {few} holds 5 questions; --requests asks for 6"):
            bench.main([*common, "--questions", str(few), "--requests", "6"])
    assert served == [240, 240], "no round ran"
