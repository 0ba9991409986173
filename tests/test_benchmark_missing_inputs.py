"""Benchmark scripts given an input that is not there: one line naming it and exit status 2, not a traceback.

bench53 F6: plot_k_sweep (a run folder or eval JSON that is not there, or not JSON) and wiki_passages (a dump that
is not there) ended in FileNotFoundError / DilstoreError tracebacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module


def test_only_a_dilstore_error_becomes_a_one_line_error_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """(mut55) `one_line_errors` (benchmarks/script_errors.py) prints a DilstoreError, the user's to fix, as
    `SCRIPT: error: MESSAGE` and returns 2; any other exception is a bug and keeps its traceback, not a line that
    would send the user looking for a mistake of theirs."""
    from dilstore.storage.errors import DilstoreError

    with benchmark_module("script_errors") as script_errors:

        @script_errors.one_line_errors
        def main(argv: list[str]) -> int:
            if argv == ["user"]:
                raise DilstoreError("no such file: x.json")
            if argv == ["bug"]:
                raise KeyError("oops")
            return 0

        assert main([]) == 0 and main.__name__ == "main"
        assert main(["user"]) == 2
        assert capsys.readouterr().err == "test_benchmark_missing_inputs: error: no such file: x.json\n"
        with pytest.raises(KeyError, match="oops"):
            main(["bug"])
        assert capsys.readouterr().err == ""


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


# (script, how it parses, its output option, tiny settings): main() or the parse function each script has.
OUTPUT_CASES = [
    ("bench_listformer", "argv", "--json-out", ["--documents", "2", "--doc-tokens", "8", "--repeats", "1",
                                                "--no-memory", "--rankers", "listformer"]),
    ("bench_serve", "parse_args", "--json-out", ["--store", "STORE"]),
    ("bench_odqa_speed", "main", "--output", ["--q", "1", "--p", "1", "--measure-questions", "1", "--sizes", "minilm",
                                              "--encodings", "fp16", "--threads", "1"]),
    ("bench_dilbert", "parse_arguments", "--json-out", []),
    ("bench_store", "parse_arguments", "--json-out", []),
    ("bench_pipeline", "argv", "--json-out", ["--limit", "2", "--layers", "1"]),
]  # fmt: skip


@pytest.mark.parametrize(("script", "entry", "flag", "tiny"), OUTPUT_CASES, ids=[case[0] for case in OUTPUT_CASES])
def test_an_output_in_a_missing_folder_is_a_usage_error_before_the_run(
    script: str, entry: str, flag: str, tiny: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench53 F16: these wrote --json-out/--output after the whole run (minutes to an hour at the sizes of
    BENCHMARKS.md), so a path in a missing folder was a FileNotFoundError traceback at the end."""
    output = tmp_path / "missing" / "result.json"
    argv = [*tiny, flag, str(output)]
    with benchmark_module(script) as bench, pytest.raises(SystemExit) as stopped:
        if entry == "argv":
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(sys, "argv", [f"{script}.py", *argv])
                bench.main()
        else:
            getattr(bench, entry)(argv)
    assert stopped.value.code == 2
    assert f"error: {flag} {output}: the folder {output.parent} does not exist" in capsys.readouterr().err
