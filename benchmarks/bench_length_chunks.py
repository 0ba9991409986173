"""Shared-normalisation training step time with a micro-batch's windows run in length-sorted chunks (issue #12).

Loads the first --questions SQuAD training questions as shared-normalisation groups (each question's
answer window and the first windows of its BM25-negative paragraphs, as `train qa --shared-norm`; without
--shared-norm, their plain windows, --batch-size of them a micro-batch), takes
the micro-batches of the run's own length-grouped order (--batch-size groups each), and for every
--chunks value measures the seconds of one forward and backward pass per micro-batch (train mode, over
--micro-batches of them after one warm-up) and the share of the tokens computed that are real (not
padding), over all micro-batches of the order. 0 is one pass per micro-batch, the behaviour before.
--precisions repeats the timing under each `train qa --precision` (bf16: autocast, on a CPU too); every row's
speed-up is against the first row.
The weights do not change the work, so any reader will do. --group-length picks what the order's length
groups are sorted by (as `train qa --group-length`); --micro-batches 0 only counts the padding, for
micro-batches too large to time here (the GPU's 32 groups: one fp32 pass of 128 windows needs > 24 GB):

    .venv/bin/python benchmarks/bench_length_chunks.py --model .carry/reader/start \
        --train ../shared/data/squad/train-v1.1.json --shared-norm /work/runs/ranking-data-full/triples.jsonl.gz \
        --layers 4 --questions 87599 --batch-size 32 --micro-batches 0 --chunks 0 64 32 16 8 --group-length sum

    .venv/bin/python benchmarks/bench_length_chunks.py --model /work/runs/sweep/start-k0 \\
        --train ../shared/data/squad/train-v1.1.json --shared-norm /work/runs/ranking-data-full/triples.jsonl.gz \\
        --layers 2 --questions 3000 --micro-batches 12 --threads 2
    # on a lent GPU (the sweep's micro-batch: 32 groups, 128 windows), under training's bf16 autocast:
    python3 benchmarks/bench_length_chunks.py --model .carry/reader/start --train /tmp/train.json \
        --shared-norm .carry/reader/shared-norm/triples.jsonl.gz --layers 4 --batch-size 32 --chunks 0 64 32 16 \
        --micro-batches 12 --device cuda

Prints a table, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from script_errors import one_line_errors

from dilstore.reader.data.qa_features import QAFeature
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.configs import GROUP_LENGTHS
from dilstore.reader.training.length_chunks import length_chunks
from dilstore.reader.training.loop import autocast_dtype, optimizer_step_batches
from dilstore.reader.training.qa import (
    TrainingConfig,
    TrainingData,
    accumulate_gradients,
    load_training_data,
)
from dilstore.runners.arg_types import non_negative_int, positive_int


def computed_tokens(windows: Sequence[QAFeature], chunk: int) -> int:
    """Tokens one micro-batch's forward computes: each pass pads its windows to its longest question and passage."""
    passes = length_chunks(windows, chunk) if chunk else [list(range(len(windows)))]
    return sum(
        len(indices)
        * (max(len(windows[i].question) for i in indices) + max(len(windows[i].passage) for i in indices))
        for indices in passes
    )


def real_share(data: TrainingData, micro_batches: Sequence[Sequence[int]], chunk: int) -> float:
    """Real tokens over computed tokens across `micro_batches` (lists of group indices)."""
    real = computed = 0
    for groups in micro_batches:
        windows = [window for index in groups for window in data.windows(index)]
        real += sum(len(window.question) + len(window.passage) for window in windows)
        computed += computed_tokens(windows, chunk)
    return real / computed


def seconds_per_micro_batch(
    reader: DilBertReader,
    data: TrainingData,
    micro_batches: Sequence[Sequence[int]],
    chunk: int,
    device: torch.device,
    dtype: torch.dtype | None,
) -> float:
    """Mean seconds of forward and backward per micro-batch, after one warm-up pass that is not timed.

    On CUDA the passes run under the autocast `dtype` training uses there, and the clock waits for the GPU.
    """
    reader.train()
    accumulate_gradients(reader, data, [micro_batches[0]], device, dtype=dtype, chunk_windows=chunk)
    _wait_for(device)
    started = time.perf_counter()
    for groups in micro_batches:
        reader.zero_grad(set_to_none=True)
        accumulate_gradients(reader, data, [groups], device, dtype=dtype, chunk_windows=chunk)
    _wait_for(device)
    return (time.perf_counter() - started) / len(micro_batches)


def windows_per_micro_batch(data: TrainingData, micro_batches: Sequence[Sequence[int]]) -> float:
    """The mean number of windows in `micro_batches` (lists of group indices): what a timed pass computed.

    Not --batch-size times the group size: the order's last micro-batch can be short, and a group can hold fewer
    windows, so a rate over full micro-batches counted windows never run (bench53 F5).
    """
    return sum(len(data.windows(index)) for groups in micro_batches for index in groups) / len(micro_batches)


def _wait_for(device: torch.device) -> None:
    """Let queued GPU work finish, so that the clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a reader (or base model) folder")
    parser.add_argument("--train", type=Path, required=True, help="SQuAD v1.1 training JSON")
    parser.add_argument("--shared-norm", type=Path, help="`train ranking-data` triples (without: plain windows)")
    parser.add_argument("--layers", type=non_negative_int, default=2, help="k of the reader trained")
    parser.add_argument("--questions", type=positive_int, default=3000, help="first N training questions")
    parser.add_argument(
        "--batch-size", type=positive_int, default=8, help="question groups (or plain windows) per micro-batch"
    )
    parser.add_argument("--micro-batches", type=int, default=12,
                        help="micro-batches timed per chunk size (0: count the padding only, no timing)")  # fmt: skip
    parser.add_argument(
        "--chunks", type=non_negative_int, nargs="+", default=[0, 16, 8, 4], help="windows per pass (0: all)"
    )
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (timed under the autocast training uses)")
    parser.add_argument("--group-length", choices=GROUP_LENGTHS, default="longest",
                        help="what length groups are sorted by (train qa --group-length)")  # fmt: skip
    parser.add_argument("--precisions", nargs="+", choices=("auto", "fp32", "bf16"), default=["auto"],
                        help="train qa --precision values to time, each over every chunk size (bf16 on a CPU too)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    reader = DilBertReader.from_pretrained(args.model, layers=args.layers).to(device)
    shared_norm = None if args.shared_norm is None else str(args.shared_norm)
    config = TrainingConfig(layers=args.layers, batch_size=args.batch_size, train_limit=args.questions, epochs=1,
                            shared_norm=shared_norm, group_length=args.group_length)  # fmt: skip
    dtypes = {precision: autocast_dtype(replace(config, precision=precision), device) for precision in args.precisions}
    data = load_training_data(reader.tokenizer, args.train, config)
    lengths = data.lengths(args.group_length)
    order = [micro for step in optimizer_step_batches(data.examples, config, lengths) for micro in step]
    # Timed micro-batches spread evenly over the order: its length groups run from long to short windows.
    timed = order[:: max(1, len(order) // max(1, args.micro_batches))][: args.micro_batches]
    rows: list[dict[str, Any]] = []
    windows = windows_per_micro_batch(data, timed) if timed else 0.0
    for precision, dtype in dtypes.items():
        for chunk in args.chunks:
            seconds = seconds_per_micro_batch(reader, data, timed, chunk, device, dtype) if timed else None
            rows.append({
                "precision": precision, "dtype": str(dtype or torch.float32).removeprefix("torch."),
                "chunk_windows": chunk, "real_token_share": round(real_share(data, order, chunk), 4),
                "seconds_per_micro_batch": None if seconds is None else round(seconds, 3),
                "windows_per_second": None if seconds is None else round(windows / seconds, 2),
            })  # fmt: skip
    first = rows[0]["seconds_per_micro_batch"]
    print(f"{data.examples} examples of {data.group_size} window(s), k={args.layers}, {args.batch_size} examples a "
          f"micro-batch, {len(timed)} timed, {args.threads} threads, {device}")  # fmt: skip
    print(f"{'dtype':>9} {'windows/pass':>12} {'real tokens':>12} {'s/micro-batch':>14} {'windows/s':>10} "
          f"{'vs row 1':>9}")  # fmt: skip
    for row in rows:
        seconds, rate = row["seconds_per_micro_batch"], row["windows_per_second"]
        speedup = f"{first / seconds:.2f}x" if first and seconds else "-"
        label = row["chunk_windows"] or "all"
        print(f"{row['dtype']:>9} {label:>12} {row['real_token_share']:>12.3f} "
              f"{'-' if seconds is None else f'{seconds:.3f}':>14} {'-' if rate is None else f'{rate:.2f}':>10} "
              f"{speedup:>9}")  # fmt: skip
    print(json.dumps({"questions": args.questions, "layers": args.layers, "threads": args.threads,
                      "device": str(device), "group_length": args.group_length, "rows": rows}))  # fmt: skip
    return 0


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    """run(), with a DilstoreError (a missing --model, --train or --shared-norm, windows longer than the model's
    positions) as one line and exit status 2, not a traceback (bench53 F15)."""
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
