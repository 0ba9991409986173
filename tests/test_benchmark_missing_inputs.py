"""Benchmark scripts given an input that is not there: one line naming it and exit status 2, not a traceback.

bench53 F6: plot_k_sweep (a run folder or eval JSON that is not there, or not JSON) and wiki_passages (a dump that
is not there) ended in FileNotFoundError / DilstoreError tracebacks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module


def test_plot_k_sweep_names_a_missing_or_unreadable_evaluation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing, text = tmp_path / "eval-k9.json", tmp_path / "notes.json"
    text.write_text("k = 4\n", encoding="utf-8")
    with benchmark_module("plot_k_sweep") as bench:
        assert bench.main([str(missing), "--png", str(tmp_path / "k.png")]) == 2
        assert capsys.readouterr().err == f"plot_k_sweep: error: {missing}: no such file\n"
        assert bench.main([str(tmp_path), "--png", str(tmp_path / "k.png")]) == 2
        assert capsys.readouterr().err == f"plot_k_sweep: error: {tmp_path / 'eval-dev.json'}: no such file\n"
        assert bench.main([str(text), "--png", str(tmp_path / "k.png")]) == 2
        assert capsys.readouterr().err.startswith(f"plot_k_sweep: error: {text}: not valid JSON")
    assert not (tmp_path / "k.png").exists()


def test_wiki_passages_names_a_missing_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "enwiki.xml.bz2"
    with benchmark_module("wiki_passages") as bench:
        assert bench.main([str(missing)]) == 2
    assert capsys.readouterr() == ("", f"wiki_passages: error: corpus file not found: {missing}\n")


def test_bench_length_chunks_and_ensemble_readers_name_what_they_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench53 F15: a missing model or data, or windows longer than the model's positions, were DilstoreError
    tracebacks."""
    from tests.fixtures.pipeline_fixtures import save_tiny_reader

    missing = tmp_path / "no-model"
    with benchmark_module("bench_length_chunks") as bench:
        assert bench.main(["--model", str(missing), "--train", str(tmp_path / "train.json")]) == 2
    assert capsys.readouterr().err.endswith(f"bench_length_chunks: error: model directory not found: {missing}\n")
    reader = save_tiny_reader(tmp_path / "reader")
    with benchmark_module("ensemble_readers") as bench:
        assert bench.main([str(reader), "--data", str(tmp_path / "dev.json")]) == 2
    assert capsys.readouterr().err.endswith(f"ensemble_readers: error: {tmp_path / 'dev.json'}: no such file\n")
