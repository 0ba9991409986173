"""Benchmark scripts refuse 0 for counts that must be positive: a usage error naming the option, exit status 2.

Repeats, tokens, passages, batch sizes, threads, steps and the like were plain `type=int`: a 0 ended in a
traceback (an empty median, a zero division, a zero range step, torch refusing 0 threads), a hang, a failure in
a child process, or a figure computed from nothing. They are `positive_int` (runners/arg_types.py) now; a
sample of them per script is checked here.

Only argument parsing runs: every argv ends in an option no script has, so a value a parser let through would
stop at "unrecognized arguments" (and fail here) rather than start the benchmark.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from tests.fixtures.benchmarks import benchmark_module

UNKNOWN = "--no-such-option"

Parse = Callable[[ModuleType, list[str]], Any]


def _from_sys_argv(function: str) -> Parse:
    """Scripts whose `function()` parses sys.argv itself: sys.argv is `argv` for the call."""

    def call(bench: ModuleType, argv: list[str]) -> Any:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", [f"{bench.__name__}.py", *argv])
            return getattr(bench, function)()

    return call


def _main(bench: ModuleType, argv: list[str]) -> Any:
    """main(argv), which parses before any work."""
    return bench.main(argv)


def _parse_arguments(bench: ModuleType, argv: list[str]) -> Any:
    return bench.parse_arguments(argv)


# How each script parses its command line.
PARSE: dict[str, Parse] = {
    "answer_recall": _main,
    "bench_codes": _from_sys_argv("main"),
    "bench_compact": _parse_arguments,
    "bench_compact_memory": _parse_arguments,
    "bench_dask_memory": _parse_arguments,
    "bench_decode_blocks": _parse_arguments,
    "bench_decode_share_earl": _parse_arguments,
    "bench_codes_heldout": _from_sys_argv("main"),
    "bench_dilbert": _parse_arguments,
    "bench_trees": _main,
    "bench_worker_memory": _main,
    "bench_encode": _main,
    "bench_earl_speed": _main,
    "bench_length_chunks": _main,
    "bench_listformer": _from_sys_argv("main"),
    "bench_mapped_checks": _main,
    "bench_odqa_speed": _main,
    "bench_open_shards": _parse_arguments,
    "bench_pipeline": _from_sys_argv("main"),
    "bench_question_batches": _main,
    "bench_remote_fetch": _from_sys_argv("parse_arguments"),
    "bench_rotation": _main,
    "bench_scale": _parse_arguments,
    "bench_serve": lambda bench, argv: bench.parse_args(argv),
    "bench_shared_norm_startup": _main,
    "bench_side_by_side": lambda bench, argv: bench.argument_parser().parse_args(argv),
    "bench_store": _parse_arguments,
    "ensemble_readers": _main,
    "gpu_reader_schedule": _main,
    "mini_opensquad": _main,
    "online_variant_curve": _main,
    "package_default_checkpoint": _main,
    "rank_quality": _main,
    "reader_gap": _main,
    "reader_curve": _main,
    "train_rankers_gpu": _main,
}

# (script, argv): the first option in argv is the one whose 0 is refused.
CASES = [
    ("bench_codes", ["--paragraphs", "0"]),
    ("bench_compact", ["--appends", "0"]),
    ("bench_compact_memory", ["--passages", "1000", "0"]),
    ("bench_compact_memory", ["--append-passages", "0"]),
    ("bench_dask_memory", ["--precompute-timeout", "0"]),
    ("bench_decode_blocks", ["--tokens", "0"]),
    ("bench_decode_share_earl", ["--repeats", "0"]),
    ("bench_codes", ["--threads", "0"]),
    ("bench_codes_heldout", ["--train-paragraphs", "0"]),
    ("bench_dilbert", ["--pairs-questions", "0"]),
    ("bench_dilbert", ["--batch-size", "0"]),
    ("bench_dilbert", ["--repeats", "0"]),
    ("bench_earl_speed", ["--lengths", "128", "0"]),
    ("bench_earl_speed", ["--unique", "0"]),
    ("bench_earl_speed", ["--cross-repeats", "0"]),
    ("bench_length_chunks", ["--questions", "0"]),
    ("bench_length_chunks", ["--batch-size", "0"]),
    ("bench_listformer", ["--repeats", "0"]),
    ("bench_listformer", ["--memory-point", "0"]),
    ("bench_mapped_checks", ["--shards", "0"]),
    ("bench_mapped_checks", ["--ids", "1", "0"]),
    ("bench_odqa_speed", ["--measure-questions", "0"]),
    ("bench_odqa_speed", ["--max-pairs-per-batch", "0"]),
    ("bench_open_shards", ["--fetch", "0"]),
    ("bench_pipeline", ["--limit", "0"]),
    ("bench_pipeline", ["--batch-tokens", "0"]),
    ("bench_question_batches", ["--count", "0"]),
    ("bench_question_batches", ["--group", "0"]),
    ("bench_remote_fetch", ["--shards", "0"]),
    ("bench_remote_fetch", ["--fetch", "0"]),
    ("bench_rotation", ["--every", "0"]),
    ("bench_rotation", ["--held-out", "0"]),
    ("bench_scale", ["--passages", "1000", "0"]),
    ("bench_scale", ["--lookups", "0"]),
    ("bench_serve", ["--concurrency", "1", "0"]),
    ("bench_serve", ["--top-p", "0"]),
    ("bench_serve", ["--cli-questions", "0"]),
    ("bench_shared_norm_startup", ["--questions", "0"]),
    ("bench_shared_norm_startup", ["--negatives", "0"]),
    ("bench_side_by_side", ["--batch-size", "0"]),
    ("bench_side_by_side", ["--threads", "0"]),
    ("bench_store", ["--templates", "0"]),
    ("bench_trees", ["--repeats", "0"]),
    ("bench_trees", ["--requests", "0"]),
    ("bench_worker_memory", ["--every", "0"]),
    ("bench_store", ["--cold-repeats", "0"]),
    ("ensemble_readers", ["--limit", "0"]),
    ("ensemble_readers", ["--threads", "0"]),
    ("gpu_reader_schedule", ["train", "--students", "4", "0"]),
    ("gpu_reader_schedule", ["train", "--smoke", "0"]),
    ("gpu_reader_schedule", ["extend", "--groups", "0"]),
    ("gpu_reader_schedule", ["extend", "--curve-points", "0"]),
    ("gpu_reader_schedule", ["sweep", "--epochs", "0"]),
    ("mini_opensquad", ["--top-p", "29", "0"]),
    ("mini_opensquad", ["--shard-passages", "0"]),
    ("mini_opensquad", ["--msmarco-passages", "0"]),
    ("online_variant_curve", ["--limit", "0"]),
    ("online_variant_curve", ["--top-p", "0"]),
    ("rank_quality", ["--depth", "0"]),
    ("rank_quality", ["--batch-size", "0"]),
    ("reader_curve", ["--limit", "0"]),
    ("train_rankers_gpu", ["train", "--log-every", "0"]),
    ("train_rankers_gpu", ["train", "--eval-batch-size", "0"]),
]


@pytest.mark.parametrize(("script", "argv"), CASES, ids=[f"{script} {' '.join(argv)}" for script, argv in CASES])
def test_zero_is_a_usage_error_naming_the_option(
    script: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    option = next(argument for argument in argv if argument.startswith("--"))
    with benchmark_module(script) as bench, pytest.raises(SystemExit) as stopped:
        PARSE[script](bench, [*argv, UNKNOWN])
    error = capsys.readouterr().err
    assert stopped.value.code == 2, error
    assert f"argument {option}: expected a positive integer, got 0" in error


# (script, argv, message): k, "0: all" counts and numpy seeds, where 0 is valid and a negative is not.
NEGATIVE_CASES = [
    ("bench_length_chunks", ["--layers", "-1"], "expected an integer of at least 0, got -1"),
    ("bench_length_chunks", ["--chunks", "0", "-1"], "expected an integer of at least 0, got -1"),
    ("bench_listformer", ["--delayed-layers", "-1"], "expected an integer of at least 0, got -1"),
    ("bench_pipeline", ["--layers", "-1"], "expected an integer of at least 0, got -1"),
    ("bench_side_by_side", ["--warm-up-steps", "-1"], "expected an integer of at least 0, got -1"),
    ("gpu_reader_schedule", ["sweep", "--layers", "0", "-1"], "expected an integer of at least 0, got -1"),
    ("bench_encode", ["--seed", "-1"], "expected a seed from 0 to 4294967295, got -1"),
    ("bench_remote_fetch", ["--seed", "4294967296"], "expected a seed from 0 to 4294967295, got 4294967296"),
    ("bench_rotation", ["--seed", "-1"], "expected a seed from 0 to 4294967295, got -1"),
    ("bench_scale", ["--seed", "-1"], "expected a seed from 0 to 4294967295, got -1"),
    ("reader_gap", ["--seed", "-1"], "expected a seed from 0 to 4294967295, got -1"),
    ("train_rankers_gpu", ["train", "--seed", "-1"], "expected a seed from 0 to 4294967295, got -1"),
    # Subset seeds (left55b F1): random.Random takes -1 as 1.
    *[(script, ["--seed", "-1"], "expected a seed of at least 0, got -1")
      for script in ["answer_recall", "ensemble_readers", "mini_opensquad", "online_variant_curve", "rank_quality",
                     "reader_curve"]],
    # The card's record of the subset's seed: -1 named the subset seed 1 drew (left56 F2).
    ("package_default_checkpoint", ["--eval-seed", "-1"], "expected a seed of at least 0, got -1"),
]


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    NEGATIVE_CASES,
    ids=[f"{script} {' '.join(argv)}" for script, argv, _ in NEGATIVE_CASES],
)
def test_negative_layers_counts_and_seeds_are_usage_errors_naming_the_option(
    script: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative k failed after the model loaded or in a worker; numpy raised on a negative seed mid-run."""
    option = next(argument for argument in argv if argument.startswith("--"))
    with benchmark_module(script) as bench, pytest.raises(SystemExit) as stopped:
        PARSE[script](bench, [*argv, UNKNOWN])
    error = capsys.readouterr().err
    assert stopped.value.code == 2, error
    assert f"argument {option}: {message}" in error


def test_every_script_with_a_case_has_a_way_to_parse() -> None:
    assert {script for script, _ in CASES} | {script for script, _, _ in NEGATIVE_CASES} == set(PARSE)


def test_an_output_onto_an_input_or_into_a_missing_folder_is_refused_before_any_work(tmp_path, capsys) -> None:
    """`run_passages --output CORPUS` cut the corpus to the run's passages, `plot_k_sweep --markdown RUN/eval-dev.json`
    replaced the evaluation with the table and `rank_quality --output TASK` the task with the report, each exiting 0;
    an --output in a missing folder lost mini_opensquad's and rank_quality's result after the whole evaluation, and
    one inside --work (or --store) replaced a file the run keeps there: the store's manifest, the task it saved."""
    corpus, run = tmp_path / "corpus.jsonl", tmp_path / "run.txt"
    corpus.write_text('{"id": "a", "contents": "x"}\n{"id": "b", "contents": "y"}\n', encoding="utf-8")
    run.write_text("1 Q0 a 1 1.0 t\n", encoding="utf-8")
    evaluation = tmp_path / "k0" / "eval-dev.json"
    evaluation.parent.mkdir()
    evaluation.write_text('{"f1": 80.0}', encoding="utf-8")
    task = tmp_path / "task.json.gz"
    task.write_bytes(b"task")
    store, no_data = tmp_path / "store", tmp_path / "no-data"
    store.mkdir()
    (store / "manifest.json").write_text("{}")  # a store: only an output inside one is refused as such
    inside_work = "is inside --work"
    calls = [
        ("run_passages", ["--run", str(run), "--corpus", str(corpus), "--output", str(corpus)], "is the input file"),
        ("plot_k_sweep", [str(evaluation.parent), "--png", str(tmp_path / "k.png"), "--markdown", str(evaluation)],
         "is the input file"),
        ("rank_quality", ["--work", str(tmp_path / "work"), "--task-file", str(task), "--output", str(task)],
         "is the input file"),
        ("rank_quality", ["--work", str(tmp_path), "--tasks", "dl19", "--data", str(no_data), "--output",
                          str(tmp_path / "task.dl19.json.gz")], inside_work),
        ("mini_opensquad", ["--work", str(tmp_path / "mos"), "--output", str(tmp_path / "missing" / "result.json")],
         "does not exist"),
        ("mini_opensquad", ["--work", str(tmp_path), "--data", str(no_data), "--output", str(tmp_path / "r.json")],
         inside_work),
        ("mini_opensquad", ["--work", str(tmp_path / "mos"), "--store", str(store), "--output",
                            str(store / "manifest.json")], f"is inside the store {store}"),
        ("plot_k_sweep", [str(evaluation.parent), "--png", str(tmp_path / "k.json")], "give a file ending in .png"),
        ("online_variant_curve", [str(tmp_path / "run"), "--store", str(store), "--work", str(tmp_path / "ovc"),
                                  "--png", str(tmp_path / "missing" / "c.png")], "does not exist"),
    ]  # fmt: skip
    for name, argv, message in calls:
        with benchmark_module(name) as script:
            assert script.main(argv) == 2, name
        err = capsys.readouterr().err
        assert f"{name}: error: " in err and message in err, (name, err)
    assert corpus.read_text(encoding="utf-8").count("\n") == 2
    assert evaluation.read_text(encoding="utf-8") == '{"f1": 80.0}' and task.read_bytes() == b"task"
