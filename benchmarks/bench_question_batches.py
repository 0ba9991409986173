"""Several questions read in one call (`evaluate-qa`, `serve`, `answer_many`): time, and the tokens the online
layers run, for two source trees side by side.

When a batch of question–passage pairs mixes questions of different lengths, how each row is laid out decides
how wide the batch runs: padded apart (the longest question, then the longest passage) or joined (each question
then its passage, padding only at the end). This reads the same seeded OpenSQuAD dev questions through each tree,
`--group` at a time (evaluate-qa's --question-batch default is 8) and all in one call, and counts, at the input of
the first online layer, the rows × width that run, the real tokens among them, and the batches wider than
`--pair-batch-tokens`. Trees alternate within each repeat; each tree reads every group once first, unmeasured.

    git clone -q . /tmp/before && git -C /tmp/before checkout -q REV && \\
        for l in storage reader pipelines runners; do ln -sfn ../$l /tmp/before/dilstore/$l; done
    .venv/bin/python benchmarks/bench_question_batches.py --trees /tmp/before . --store STORE --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dilstore.runners.arg_types import positive_int

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUESTIONS = ROOT.parent / "shared" / "data" / "opensquad" / "questions.dev-v1.1.jsonl"
PAIR_BATCH_TOKENS = 8192


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=Path, nargs="+", help="trees with the layer links, the first the baseline")
    parser.add_argument("--store", type=Path, required=True, help="a dilbert store with its BM25 index (read only)")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="OpenSQuAD-style JSONL questions")
    parser.add_argument("--count", type=positive_int, default=48, help="questions sampled (seed 0)")
    parser.add_argument("--group", type=positive_int, default=8, help="questions per call in the grouped reading")
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)  # one tree's measurement, in its process
    args = parser.parse_args(argv)
    if args.child_out is None:
        if not args.trees:
            parser.error("--trees is required")
        for tree in args.trees:
            if not (tree / "dilstore" / "storage").exists():
                parser.error(f"{tree} has no dilstore/storage link: make the layer links (see the docstring)")
    return args


def sampled_questions(path: Path, count: int) -> list[str]:
    questions = [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()]
    return random.Random(0).sample(questions, min(count, len(questions)))


def measure_here(args: argparse.Namespace) -> dict[str, Any]:
    """In the tree's own process: each reading's seconds, answers and the token counts at the first online layer."""
    import torch

    from dilstore.api import open_reader

    torch.set_num_threads(args.threads)
    reader = open_reader(args.store)
    model = reader.model
    counts = {"rows_x_width": 0, "real": 0, "batches": 0, "over_budget": 0}

    def count(module: Any, inputs: tuple[Any, ...]) -> None:
        hidden, additive = inputs[0], inputs[1]  # (b, n, d), (b, 1, n, n)
        rows, width = hidden.shape[:2]
        counts["rows_x_width"] += rows * width
        counts["real"] += int((additive[:, 0, 0, :] == 0).sum())
        counts["batches"] += 1
        counts["over_budget"] += int(rows > 1 and rows * width > PAIR_BATCH_TOKENS)

    questions = sampled_questions(args.questions, args.count)
    readings = {
        f"by {args.group}": [questions[i : i + args.group] for i in range(0, len(questions), args.group)],
        "all in one call": [questions],
    }
    for groups in readings.values():  # unmeasured: caches, first-call costs
        for group in groups:
            reader.answer_many(group)
    hook = model.architecture.layer_module(model.model, model.layers).register_forward_pre_hook(count)
    results = {}
    for name, groups in readings.items():
        for key in counts:
            counts[key] = 0
        started = time.perf_counter()
        answers = [answer for group in groups for answer in reader.answer_many(group)]
        seconds = time.perf_counter() - started
        results[name] = {
            "seconds": seconds,
            **counts,
            "answers": [[a.text, a.best.passage_id, a.best.reader_score] if a.best else None for a in answers],
        }
    hook.remove()
    return results


def measure_tree(tree: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child-out", str(out), "--store", str(args.store),
               "--questions", str(args.questions), "--count", str(args.count), "--group", str(args.group),
               "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the measurement failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_out is not None:
        args.child_out.write_text(json.dumps(measure_here(args)))
        return 0
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-question-batches-{os.getpid()}.json"
    runs: dict[str, list[dict[str, Any]]] = {str(tree): [] for tree in args.trees}
    try:
        for _ in range(args.repeats):
            for tree in args.trees:
                runs[str(tree)].append(measure_tree(tree, args, out))
    finally:
        out.unlink(missing_ok=True)
    baseline = runs[str(args.trees[0])]
    report: dict[str, Any] = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                              "threads": args.threads, "questions": args.count, "repeats": args.repeats,
                              "pair_batch_tokens": PAIR_BATCH_TOKENS, "rows": []}  # fmt: skip
    print(f"| tree | reading | median s | ratio | tokens run | real | padding | batches | over {PAIR_BATCH_TOKENS} | "
          "answers as the first tree |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tree, measured in runs.items():
        for name in measured[0]:
            seconds = statistics.median(run[name]["seconds"] for run in measured)
            base = statistics.median(run[name]["seconds"] for run in baseline)
            first, reference = measured[0][name], baseline[0][name]
            same = sum(a is not None and b is not None and a[:2] == b[:2]
                       for a, b in zip(first["answers"], reference["answers"], strict=True))  # fmt: skip
            gaps = [abs(a[2] - b[2]) for a, b in zip(first["answers"], reference["answers"], strict=True) if a and b]
            row = {"tree": tree, "reading": name, "seconds": seconds, "ratio": seconds / base,
                   "rows_x_width": first["rows_x_width"], "real": first["real"], "batches": first["batches"],
                   "over_budget": first["over_budget"], "same_answers": same, "answers": len(first["answers"]),
                   "max_score_gap": max(gaps, default=0.0)}  # fmt: skip
            report["rows"].append(row)
            print(f"| {tree} | {name} | {seconds:.2f} | ×{row['ratio']:.2f} | {row['rows_x_width']:,} | "
                  f"{row['real']:,} | +{100 * (row['rows_x_width'] / row['real'] - 1):.0f}% | {row['batches']} | "
                  f"{row['over_budget']} | {same}/{len(first['answers'])} (score gap {row['max_score_gap']:.1e}) |")
    print(json.dumps(report))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
