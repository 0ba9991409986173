"""Precompute throughput: the Beam pipeline vs a bare single-process loop over the same passages.

Both run the same offline half (all-MiniLM-L6-v2 layers 1..k, from the
packaged base model) over the first N MS MARCO passages of
../shared/data/msmarco/passages.dl19-dl20-pool.jsonl, with the same
tokenization, long-passage rule and length-bucketed batch policy.

- bare loop: one process, torch on every CPU thread: read, split, tokenize,
  batch by length, encode under inference_mode. It writes nothing.
- pipeline: `dilstore precompute` (in this process, as the command runs),
  DirectRunner in_memory (1 worker, every thread) and multi_processing (one
  worker per CPU, 1 thread each). Its time is the whole command: model load
  and fingerprint, worker start-up, reading, routing, encoding, writing the
  fp16 store, passage tables and finalize (checksums). Each run loads the
  model as a fresh command does (nothing is cached between runs).

The bare loop runs first and again last; the ratio is taken against the mean
of the two, and their difference shows how much the machine's load drifted.

Prints a table and JSON (also written to --json-out). Passages/s counts the
stored units (passages, plus extra windows of passages over --max-length).

    python benchmarks/bench_pipeline.py --limit 10000 --layers 4 --json-out /tmp/bench-pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

from dilstore.pipelines.corpora import Document, read_corpus
from dilstore.pipelines.duplicate_ids import drop_duplicate_ids
from dilstore.pipelines.passages import split_document
from dilstore.reader.batching import BatchPolicy
from dilstore.reader.offline.encoding import (
    BASE_MODEL_REF,
    encode_tokenized,
    load_reader,
    set_threads,
    tokenize_passage,
)
from dilstore.runners import cli
from dilstore.runners.arg_types import non_negative_int, positive_int
from dilstore.runners.outputs import check_output_option

ROOT = Path(__file__).resolve().parents[1]
PASSAGES = ROOT.parent / "shared" / "data" / "msmarco" / "passages.dl19-dl20-pool.jsonl"


def first_lines(source: Path, destination: Path, limit: int) -> Path:
    """Copy the first `limit` lines of `source` to `destination`."""
    with source.open("rb") as reader, destination.open("wb") as writer:
        for number, line in enumerate(reader):
            if number == limit:
                break
            writer.write(line)
    return destination


def bare_loop(corpus: Path, layers: int, max_length: int, policy: BatchPolicy, threads: int) -> dict[str, float]:
    """Read, split, tokenize and encode in one process; units and seconds (model load excluded)."""
    set_threads(threads)
    reader = load_reader(BASE_MODEL_REF, "dilbert", layers)
    started = time.perf_counter()
    pieces = []
    for record in drop_duplicate_ids(read_corpus(corpus, "jsonl"), "words"):
        if isinstance(record, Document):
            for passage in split_document(record, "words"):
                pieces.extend(tokenize_passage(reader.tokenizer, passage, max_length, "dilbert"))
    tokenized = time.perf_counter()
    records = encode_tokenized(reader, "dilbert", pieces, policy)
    seconds = time.perf_counter() - started
    return {
        "units": len(records),
        "tokens": sum(len(record.token_ids) for record in records),
        "seconds": round(seconds, 2),
        "tokenize_seconds": round(tokenized - started, 2),
        "passages_per_second": round(len(records) / seconds, 2),
    }


def pipeline_run(corpus: Path, store: Path, layers: int, max_length: int, batch_tokens: int, workers: int,
                 threads: int) -> dict[str, float]:
    """`dilstore precompute` on the DirectRunner; its summary's counts and seconds.

    The run pays for loading and fingerprinting the model, as the command does when started fresh.
    """
    shutil.rmtree(store, ignore_errors=True)
    arguments = ["precompute", "--input", str(corpus), "--format", "jsonl", "--output", str(store),
                 "--model", BASE_MODEL_REF, "--layers", str(layers), "--encoding", "fp16",
                 "--max-length", str(max_length), "--batch-tokens", str(batch_tokens),
                 "--workers", str(workers), "--threads", str(threads), "--no-progress"]
    started = time.perf_counter()
    status = cli.main(arguments)
    wall = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"dilstore precompute exited {status}")
    summary = json.loads((store / "run-summary.json").read_text(encoding="utf-8"))
    shutil.rmtree(store, ignore_errors=True)
    return {
        "units": summary["passages"],
        "tokens": summary["tokens"],
        "shards": summary["shards"],
        "store_bytes": summary["bytes"],
        "seconds": round(wall, 2),
        "passages_per_second": round(summary["passages"] / wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=positive_int, default=10_000, help="first N passages of the MS MARCO pool")
    parser.add_argument(
        "--layers", type=non_negative_int, default=4, help="k, offline layers of all-MiniLM-L6-v2 (default 4)"
    )
    parser.add_argument("--max-length", type=positive_int, default=384)
    parser.add_argument("--batch-tokens", type=positive_int, default=8192)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    check_output_option(parser, args.json_out, "--json-out")
    cpus = os.cpu_count() or 1
    policy = BatchPolicy(batch_tokens=args.batch_tokens)
    results: dict[str, object] = {
        "machine": {"cpus": cpus, "platform": platform.platform(), "torch": torch.__version__,
                    "load_average_start": os.getloadavg()},
        "settings": {"passages_file": str(PASSAGES), "limit": args.limit, "model": "all-MiniLM-L6-v2 (packaged)",
                     "layers": args.layers, "encoding": "fp16", "max_length": args.max_length,
                     "batch_tokens": args.batch_tokens, "split": "words"},
    }
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as scratch:
        corpus = first_lines(PASSAGES, Path(scratch) / "passages.jsonl", args.limit)
        bare = f"bare loop (1 process, {cpus} threads)"
        runs = {
            bare: lambda: bare_loop(corpus, args.layers, args.max_length, policy, cpus),
            "pipeline DirectRunner in_memory (1 worker x %d threads)" % cpus: lambda: pipeline_run(
                corpus, Path(scratch) / "store", args.layers, args.max_length, args.batch_tokens, 1, cpus),
            "pipeline DirectRunner multi_processing (%d workers x 1 thread)" % cpus: lambda: pipeline_run(
                corpus, Path(scratch) / "store", args.layers, args.max_length, args.batch_tokens, cpus, 1),
            f"{bare}, again (drift check)": lambda: bare_loop(corpus, args.layers, args.max_length, policy, cpus),
        }
        measured = {}
        for name, run in runs.items():
            before = os.getloadavg()[0]
            measured[name] = {**run(), "load_average_before": round(before, 2),
                              "load_average_after": round(os.getloadavg()[0], 2)}
            print(f"{name}: {measured[name]}", flush=True)
    bare_runs = [values for name, values in measured.items() if name.startswith("bare loop")]
    bare_rate = sum(values["passages_per_second"] for values in bare_runs) / len(bare_runs)
    results["bare_loop_mean_passages_per_second"] = round(bare_rate, 2)
    for values in measured.values():
        values["ratio_to_bare_loop"] = round(values["passages_per_second"] / bare_rate, 3)
    results["runs"] = measured
    print()
    print(f"ratio = passages/s over the mean of the two bare-loop runs ({bare_rate:.2f} passages/s)")
    print("| run | units | seconds | passages/s | ratio to bare loop | load avg before/after |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in measured.items():
        print(f"| {name} | {values['units']} | {values['seconds']} | {values['passages_per_second']} | "
              f"{values['ratio_to_bare_loop']} | {values['load_average_before']} / {values['load_average_after']} |")
    print()
    print(json.dumps(results, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
