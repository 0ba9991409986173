"""Ranking quality (seed 004, Table 2 layout): RR@10, nDCG@10 and R@100 of BM25 and each ranker on two tasks.

- DL19: the 43 judged TREC 2019 Deep Learning passage queries, reranking
  their BM25 top-100 (../shared/data/msmarco).
- SQuAD dev: paragraph ranking over the 2,067 SQuAD v1.1 dev paragraphs, each
  question's BM25 top-`depth` reranked, its own paragraph relevant (a seeded
  --squad-limit subset of the 10,570 questions; the index is cached in --work).

Rankers come from `--model DIR` (a checkpoint written by `dilstore train
earl|cross-encoder|siamese`; its dilstore_training.json says how long it was
trained) or `--untrained KIND` (a ranker initialised from --base-model and
never trained, labelled as such: EARL's score head is random there, so its
numbers are a floor, not a result). `--reference-bi-encoder` adds the base
model scored by cosine, as sentence-transformers ranks with it: for
all-MiniLM-L6-v2 the published DL19 figure is nDCG@10 0.642, a check of this
whole evaluation path. `--dl19-run CHECKPOINT RUN` scores a DL19 run that
a ranker made elsewhere (`dilstore rerank` through its store, as the
Listformer is served) as that checkpoint's DL19 row. Qrels, the BM25 runs and every ranker's
run are written to --work as TREC files, and each task as
WORK/task.NAME.json.gz: `--task-file` evaluates such a file where the data,
the index and Java are absent (a GPU machine). The table and then the JSON go
to stdout, and the JSON to --output too.

    .venv/bin/python benchmarks/rank_quality.py --work /tmp/rank-quality \\
        --model runs/earl-squad --model runs/cross-encoder-squad --model runs/siamese-squad --untrained earl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dilstore.reader.data.trec import read_qrels, read_run, write_run
from dilstore.reader.evaluation.rank_metrics import METRICS, evaluate_run
from dilstore.reader.evaluation.ranking import (
    RankingTask,
    load_dl19_task,
    load_task,
    rerank,
    save_task,
    squad_dev_task,
    write_task_files,
)
from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE, base_model_dir
from dilstore.reader.modeling.ranker_base import RankerBase
from dilstore.reader.modeling.rankers import checkpoint_kind, load_ranker, new_ranker
from dilstore.reader.modeling.ranking_inputs import RANKER_KINDS
from dilstore.reader.modeling.siamese import CosineBiEncoder
from dilstore.runners.arg_types import positive_int, sample_seed
from dilstore.runners.outputs import check_output_file
from dilstore.storage.errors import DilstoreError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbours, when loaded by path
from script_errors import one_line_errors  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TASKS = ("dl19", "squad-dev")


def load_tasks(args: argparse.Namespace) -> list[RankingTask]:
    """The tasks asked for (built from --data, or read from --task-file), each with qrels and BM25 run in --work."""
    if args.task_file:
        tasks = [load_task(path) for path in args.task_file]
        for task in tasks:
            write_task_files(task, args.work)
        return tasks
    tasks = []
    if "dl19" in args.tasks:
        msmarco = args.data / "msmarco"
        qrels = read_qrels(msmarco / "qrels.dl19-passage.txt")
        tasks.append(load_dl19_task(msmarco / "bm25-top100-with-text.dl19-passage.json", qrels, args.depth))
    if "squad-dev" in args.tasks:
        log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        tasks.append(
            squad_dev_task(args.data / "squad" / "dev-v1.1.json", args.work / "squad-dev-index", args.depth,
                           limit=args.squad_limit, seed=args.seed, threads=args.threads, log=log)
        )  # fmt: skip
    for task in tasks:
        write_task_files(task, args.work)
        save_task(task, args.work / f"task.{task.name.lower().replace(' ', '-')}.json.gz")
    return tasks


def described(path: Path, kind: str, via: str = "") -> dict[str, Any]:
    """A checkpoint's row description from its training record, so no untrained model passes as trained."""
    training_file = path / TRAINING_METADATA_FILE
    training = json.loads(training_file.read_text()) if training_file.is_file() else None
    steps = None if training is None else training.get("steps")
    trained = bool(steps)
    status = f"{steps} steps" if trained else "UNTRAINED: no training recorded"
    name = "" if path.name == kind else f" {path.name}"  # a folder named for its kind: "cross-encoder cross-encoder"
    label = f"{kind}{name} ({status}{via})"
    return {"model": label, "kind": kind, "path": str(path), "trained": trained, "training": training}


def rankers(args: argparse.Namespace) -> list[tuple[dict[str, Any], RankerBase]]:
    """(description, ranker) for every --model and --untrained."""
    found = []
    for path in args.model:
        ranker = load_ranker(path)
        found.append((described(path, ranker.kind), ranker))
    if args.reference_bi_encoder:
        label = f"bi-encoder cosine (UNTRAINED {args.base_model.name}, as sentence-transformers scores it)"
        found.append(({"model": label, "kind": "siamese", "path": str(args.base_model), "trained": False,
                       "training": None}, CosineBiEncoder.from_base(args.base_model)))  # fmt: skip
    for kind in args.untrained:
        ranker = new_ranker(kind, args.base_model)
        label = f"{kind} (UNTRAINED: base-initialised from {args.base_model.name})"
        found.append(({"model": label, "kind": kind, "path": str(args.base_model), "trained": False,
                       "training": None}, ranker))  # fmt: skip
    return found


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Every ranker (and BM25) on every task."""
    args.work.mkdir(parents=True, exist_ok=True)
    tasks = load_tasks(args)
    results = []
    for task in tasks:
        bm25 = evaluate_run(task.qrels, task.bm25).summary()
        results.append({"task": task.name, "model": "BM25", "kind": "bm25", "trained": None, **bm25, "seconds": 0.0})
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for description, ranker in rankers(args):
        ranker.to(device)
        for task in tasks:
            started = time.perf_counter()
            run = rerank(ranker, task, max_query_length=args.max_query_length, max_doc_length=args.max_doc_length,
                         batch_size=args.batch_size, progress=not args.no_progress)  # fmt: skip
            seconds = time.perf_counter() - started
            slug = f"{task.name}.{description['kind']}.{len(results)}".lower().replace(" ", "-")
            write_run(args.work / f"run.{slug}.trec", run, tag=description["kind"])
            summary = evaluate_run(task.qrels, run).summary()
            results.append({"task": task.name, **description, **summary, "seconds": round(seconds, 1)})
    results += given_dl19_runs(args.dl19_run, tasks)
    return {
        # The depth each task holds (a --task-file keeps the one it was built with, whatever --depth says now).
        "tasks": {task.name: {"queries": len(task.queries), "depth": max(map(len, task.bm25.values()), default=0)}
                  for task in tasks},  # fmt: skip
        "device": str(device),
        "results": results,
    }


def given_dl19_runs(runs: list[list[str]], tasks: list[RankingTask]) -> list[dict[str, Any]]:
    """A DL19 row for each (checkpoint, run file) of --dl19-run, evaluated with the DL19 task's qrels."""
    dl19 = [task for task in tasks if task.name == "DL19"]
    if runs and not dl19:
        raise DilstoreError("--dl19-run needs the dl19 task (--tasks dl19)")
    rows = []
    for checkpoint, run_file in runs:
        path = Path(checkpoint)
        description = described(path, checkpoint_kind(path), via=f", run {Path(run_file).name}")
        summary = evaluate_run(dl19[0].qrels, read_run(run_file)).summary()
        rows.append({"task": "DL19", **description, **summary, "seconds": None})
    return rows


def render(report: dict[str, Any]) -> str:
    """A plain-text table: one row per model, RR@10 / nDCG@10 / R@100 per task."""
    tasks = list(report["tasks"])
    models = list(dict.fromkeys(row["model"] for row in report["results"]))
    by_key = {(row["model"], row["task"]): row for row in report["results"]}
    width = max(len(model) for model in models)
    header = f"{'model':<{width}}" + "".join(f" | {task + ' ' + '/'.join(METRICS):^30}" for task in tasks)
    lines = [header, "-" * len(header)]
    for model in models:
        cells = []
        for task in tasks:
            row = by_key.get((model, task))
            cells.append(" | " + ("  ".join(f"{row[name]:.4f}" for name in METRICS) if row else "-").center(30))
        lines.append(f"{model:<{width}}" + "".join(cells))
    counts = ", ".join(
        f"{task}: {info['queries']} queries, BM25 top-{info['depth']}"
        + (f" (so R@100 is R@{info['depth']})" if info["depth"] < 100 else "")
        for task, info in report["tasks"].items()
    )
    return "\n".join([*lines, f"({counts}; device {report['device']})"])


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the SQuAD dev index, qrels and runs")
    parser.add_argument("--model", type=Path, action="append", default=[], help="a trained ranker checkpoint (repeat)")
    parser.add_argument("--dl19-run", nargs=2, action="append", default=[], metavar=("CHECKPOINT", "RUN"),
                        help="a DL19 TREC run CHECKPOINT made elsewhere (e.g. `dilstore rerank`), scored (repeat)")
    parser.add_argument("--untrained", choices=RANKER_KINDS, action="append", default=[],
                        help="also evaluate this kind initialised from --base-model, untrained (repeat)")  # fmt: skip
    parser.add_argument("--reference-bi-encoder", action="store_true",
                        help="also score --base-model as a cosine bi-encoder (all-MiniLM-L6-v2: DL19 nDCG@10 0.642)")
    parser.add_argument("--base-model", type=Path, help="plain encoder for --untrained (default: all-MiniLM-L6-v2)")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="default: both")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder")
    parser.add_argument("--task-file", type=Path, action="append", default=[],
                        help="evaluate a WORK/task.*.json.gz an earlier run saved, not --tasks (repeat)")  # fmt: skip
    parser.add_argument(
        "--depth", type=positive_int, default=100, help="BM25 candidates reranked per query (default 100)"
    )
    parser.add_argument(
        "--squad-limit", type=positive_int, default=500, help="SQuAD dev questions, seeded subset (500)"
    )
    parser.add_argument("--seed", type=sample_seed, default=0, help="seed of the --squad-limit subset (default 0)")
    parser.add_argument("--max-query-length", type=positive_int, default=32)
    parser.add_argument("--max-doc-length", type=positive_int, default=256)
    parser.add_argument(
        "--batch-size", type=positive_int, default=64,
        help="documents per forward pass (default 64); a Listformer scores each whole list in one",
    )  # fmt: skip
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch and search threads (default 2)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--output", type=Path, default=Path("/tmp/bench-rank-quality.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.base_model = args.base_model or (base_model_dir() if args.untrained or args.reference_bi_encoder else None)
    check_output_file(args.output, "--output", args.task_file, args.work)  # a task file was replaced by the report
    report = evaluate(args)
    text = json.dumps(report, indent=1)
    args.output.write_text(text)
    print(render(report))
    print(f"JSON (also in {args.output}):")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
