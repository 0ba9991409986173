"""benchmarks/bench_length_chunks.py: the padding it counts and the table it prints, on the tiny reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.loop import optimizer_step_batches
from dilstore.reader.training.qa import TrainingConfig, load_training_data
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS
from tests.reader.training.test_shared_norm import write_handful_triples


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("bench_length_chunks") as module:
        yield module


def test_computed_tokens_fall_with_smaller_passes_but_never_below_the_real_ones(
    bench, tiny_base: Path, squad_file: Path
) -> None:
    reader = DilBertReader.from_pretrained(tiny_base, layers=1)
    windows = load_training_data(reader.tokenizer, squad_file, TrainingConfig(layers=1, **SMALL_WINDOWS)).features
    real = sum(len(window.question) + len(window.passage) for window in windows)
    longest = max(len(window.question) for window in windows) + max(len(window.passage) for window in windows)
    assert bench.computed_tokens(windows, 0) == len(windows) * longest
    computed = [bench.computed_tokens(windows, chunk) for chunk in (0, 8, 4, 2)]
    assert computed == sorted(computed, reverse=True)
    assert bench.computed_tokens(windows, 1) == real
    assert computed[-1] >= real


def test_the_script_prints_a_row_per_chunk_size(
    bench, tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    triples = write_handful_triples(tmp_path / "ranking", negatives=3)  # the script's (and train qa's) default
    argv = ["--model", str(tiny_base), "--train", str(squad_file), "--shared-norm", str(triples), "--layers", "1",
            "--questions", "6", "--batch-size", "2", "--micro-batches", "2", "--chunks", "0", "3",
            "--threads", "1", "--precisions", "fp32", "bf16"]  # fmt: skip
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(lines[-1])["rows"]
    assert [(row["precision"], row["dtype"], row["chunk_windows"]) for row in rows] == [
        ("fp32", "float32", 0), ("fp32", "float32", 3), ("bf16", "bfloat16", 0), ("bf16", "bfloat16", 3)
    ]
    assert 0 < rows[0]["real_token_share"] <= rows[1]["real_token_share"] <= 1
    assert all(row["seconds_per_micro_batch"] > 0 for row in rows)
    assert any(line.split()[:2] == ["bfloat16", "all"] for line in lines[2:-1]), "the one-pass row is labelled"


@pytest.mark.parametrize("measure", ["longest", "sum"])
def test_micro_batches_0_counts_the_padding_of_the_order_grouped_by_the_measure_asked(
    bench, tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], measure: str
) -> None:
    triples = write_handful_triples(tmp_path / "ranking", negatives=3)
    argv = ["--model", str(tiny_base), "--train", str(squad_file), "--shared-norm", str(triples), "--layers", "1",
            "--questions", "6", "--batch-size", "2", "--micro-batches", "0", "--chunks", "0", "2",
            "--group-length", measure, "--threads", "1"]  # fmt: skip
    assert bench.main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["group_length"] == measure
    assert all(row["seconds_per_micro_batch"] is None and row["windows_per_second"] is None for row in report["rows"])

    reader = DilBertReader.from_pretrained(tiny_base, layers=1)
    # The script's own windowing (the defaults), so the same order as it counts.
    config = TrainingConfig(layers=1, batch_size=2, train_limit=6, epochs=1, shared_norm=str(triples),
                            group_length=measure)  # fmt: skip
    data = load_training_data(reader.tokenizer, squad_file, config)
    order = [micro for step in optimizer_step_batches(data.examples, config, data.lengths(measure)) for micro in step]
    assert report["rows"][0]["real_token_share"] == pytest.approx(bench.real_share(data, order, 0), abs=1e-4)


def test_windows_per_second_counts_the_windows_of_the_micro_batches_timed(
    bench, tiny_base: Path, squad_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench53 F5: the rate was --batch-size x group size over the mean seconds, also when the order's last
    micro-batch, timed with the others, was short: 3 plain windows in micro-batches of 2 and 1 counted as 4."""
    timed: list[int] = []

    def one_second_each(reader, data, micro_batches, *args) -> float:
        timed[:] = [sum(len(data.windows(index)) for index in groups) for groups in micro_batches]
        return 1.0

    monkeypatch.setattr(bench, "seconds_per_micro_batch", one_second_each)
    argv = ["--model", str(tiny_base), "--train", str(squad_file), "--layers", "1", "--questions", "3",
            "--batch-size", "2", "--micro-batches", "5", "--chunks", "0", "--threads", "1"]  # fmt: skip
    assert bench.main(argv) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"][0]
    assert timed == [2, 1], "three windows, in two micro-batches"
    assert row["windows_per_second"] == 1.5
