"""Command-line options shared by `train qa` (its dev evaluation), `evaluate-rc` and `evaluate-qa`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dilstore.runners.arg_types import positive_int, sample_seed, thread_count, torch_device
from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:  # imported lazily at run time, so that `dilstore --help` stays fast
    from dilstore.reader.evaluation.reading_comprehension import ReadingSettings


def add_reading_arguments(parser: argparse.ArgumentParser) -> None:
    """Windowing and decoding options of reading-comprehension evaluation."""
    for option, default, what in (
        ("--eval-batch-size", 32, "windows per forward pass"),
        ("--max-seq-length", 384, "question + window tokens"),
        ("--doc-stride", 128, "word pieces from one window's start to the next's (run_squad's doc_stride: a step, "
                              "not the overlap)"),
        ("--max-question-length", 64, "question tokens"),
        ("--max-answer-length", 30, "longest answer in tokens"),
    ):
        parser.add_argument(option, type=positive_int, default=default, help=f"{what} (default {default})")


def check_window_options(args: argparse.Namespace) -> None:
    """A DilstoreError for --max-seq-length, --doc-stride and --max-question-length that leave a window no passage
    word piece, found before torch loads: `evaluate-rc --max-seq-length 64` was refused at its first window, once
    torch and the model had loaded, 5-8 s (left61 F7)."""
    from dilstore.reader.data.qa_features import check_window_lengths

    check_window_lengths(args.max_seq_length, args.doc_stride, args.max_question_length)


def add_subset_arguments(parser: argparse.ArgumentParser, scored: str) -> None:
    """--limit and --seed: a seeded random subset of the `scored` items (questions)."""
    parser.add_argument("--limit", type=positive_int, help=f"{scored} a seeded random subset of N (default: all)")
    parser.add_argument("--seed", type=sample_seed, help="seed of the --limit subset, at least 0 (default 0)")


def subset_seed(args: argparse.Namespace) -> int:
    """The --limit subset's seed (0 by default); a DilstoreError for a --seed without --limit, which picks nothing
    and was ignored."""
    if args.seed is not None and args.limit is None:
        raise DilstoreError("--seed picks the --limit subset; give --limit too, or leave --seed out to score all")
    return 0 if args.seed is None else args.seed


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and how wide to run."""
    parser.add_argument("--device", type=torch_device, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=thread_count,
                        help="torch CPU threads, at most 4 per CPU this process may use (default: torch's choice, at "
                             "most those CPUs)")


def apply_threads(threads: int | None) -> None:
    """Set torch's intra-op thread count: `threads` when one was asked for, else torch's own choice, held to the CPUs
    this process may use. Torch's choice follows the affinity but not a cgroup CPU quota: under `docker run --cpus 2`
    or a Kubernetes limit of 2 CPUs on a 64-core host, ask, serve, evaluate-*, rerank and train ran 32 threads,
    throttled by the quota (env57 F2). OMP_NUM_THREADS or MKL_NUM_THREADS, where set, stay torch's choice. The
    threads are started here (`start_thread_pool`)."""
    import os

    import torch

    from dilstore.reader.threads import start_thread_pool

    if threads is not None:
        torch.set_num_threads(threads)
    elif not (os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")):
        from dilstore.storage.cpus import usable_cpu_count

        usable = usable_cpu_count()
        if torch.get_num_threads() > usable:
            torch.set_num_threads(usable)
    start_thread_pool()  # before the model's load, which may leave no room for their stacks (left60 F7)


def reading_settings(args: argparse.Namespace) -> ReadingSettings:
    """ReadingSettings from the options add_reading_arguments added."""
    from dilstore.reader.evaluation.reading_comprehension import ReadingSettings

    return ReadingSettings(
        batch_size=args.eval_batch_size,
        max_seq_length=args.max_seq_length,
        doc_stride=args.doc_stride,
        max_question_length=args.max_question_length,
        max_answer_length=args.max_answer_length,
    )
