"""Train EARL (bi-encoder prior), the cross-encoder and the Siamese ranker on one budget, on a GPU machine.

Four rankers from all-MiniLM-L6-v2, on the same SQuAD-train triples with the same budget (optimizer
steps, batch, negatives, query and document length; one pass, no triple seen twice):

    earl-prior-frozen      EARL, tied, ClsPool, prior; encoder frozen (judger blocks, head, scale train)
    earl-prior-encoder-lr  the same, the encoder copies trained too, at a low peak rate
    cross-encoder          the BERT ranker baseline over [CLS] q [SEP] d [SEP]
    siamese                the BERT-Siamese baseline (mean-pooled embeddings, dot product)

Each run logs a learning curve: SQuAD-dev RR@10 and nDCG@10 of the untrained ranker, of every
periodic checkpoint and of the final one, computed here with numpy (the GPU machine has no
ir_measures; `dilstore evaluate-rank` recomputes the reported numbers from the runs). DL19 is
only reranked by the final rankers (and the untrained prior, which is the base model's cosine):
it is for reporting, never for choosing anything. Written to --out:

    report.json                         settings, per-run budget, seconds, losses, learning curve
    run.{dl19,squad-dev}.NAME.trec      TREC runs of the final rankers (and earl-prior-untrained)
    earl-prior-frozen/                  the small fp16 checkpoint: judger blocks, head, scale, and a
                                        reference to package:base-model with its fingerprint
    earl-prior-encoder-lr/              the whole fp16 checkpoint, its weights cut into parts under
                                        16 MiB; `join` puts model.safetensors back together

The machine it is made for has Python 3.12, torch and transformers, no network, and none of
zarr, apache_beam, pyserini or ir_measures: `train` imports only reader/ model and training code
(tests/reader/training/test_train_rankers_gpu.py checks that, with those modules blocked). It reads everything
from two carried folders, prepared here (CPU, pyserini and ../shared/data needed):

    .venv/bin/dilstore train ranking-data --squad ../shared/data/squad/train-v1.1.json \\
        --output /work/runs/ranking-data --threads 1
    .venv/bin/python benchmarks/train_rankers_gpu.py prepare --ranking-data /work/runs/ranking-data \\
        --carry .carry/rank --base-carry .carry/base-minilm-fp16

`prepare` copies the gzipped triples and paragraphs, saves the DL19 task (43 judged queries,
BM25 top-100 with texts) and a SQuAD-dev task (a seeded 500 questions, BM25 top-20 over the dev
paragraphs) as task files, and writes an fp16 copy of the packaged all-MiniLM-L6-v2. On the GPU
machine, from the repository root (the checkout is installed there without its dependencies):

    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . && \\
    python3 benchmarks/train_rankers_gpu.py train --carry .carry/rank \\
        --base .carry/base-minilm-fp16 --out "$OUT" --steps 1500

Back here, put the split checkpoint together and score the runs:

    .venv/bin/python benchmarks/train_rankers_gpu.py join OUT/earl-prior-encoder-lr
    .venv/bin/dilstore evaluate-rank --qrels QRELS --run OUT/run.dl19.earl-prior-frozen.trec --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE, TRIPLES_FILE
from dilstore.reader.data.trec import Qrels, Run, rank_documents, write_run
from dilstore.reader.evaluation.ranking import RankingTask, load_task, rerank
from dilstore.reader.modeling.checkpoints import BASE_MODEL_ENV
from dilstore.reader.modeling.ranker_base import RankerBase
from dilstore.reader.modeling.rankers import load_ranker, new_ranker
from dilstore.reader.training.ranking import RankingTrainingConfig, train_ranker
from dilstore.reader.training.release import package_checkpoint
from dilstore.runners.arg_types import numpy_seed, positive_int
from dilstore.storage.errors import DilstoreError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbours, when loaded by path
from script_errors import one_line_errors  # noqa: E402

DL19_TASK, SQUAD_TASK = "task.dl19.json.gz", "task.squad-dev.json.gz"
RUN_NAMES = ("earl-prior-frozen", "earl-prior-encoder-lr", "cross-encoder", "siamese")
SQUAD_DEV_QUESTIONS, SQUAD_DEV_DEPTH, SQUAD_DEV_SEED = 500, 20, 0
# What the GPU machine hands back: each file under 16 MiB; split weights stay a little below.
OUT_FILE_LIMIT = 16 * 2**20
PART_BYTES = 15 * 2**20
PART_PATTERN = "weights-part-{:02d}.safetensors"


# ---------------------------------------------------------------------- metrics for the learning-curve log


def rank_metrics(qrels: Qrels, run: Run) -> dict[str, float]:
    """Mean RR@10 and nDCG@10 over the judged queries, as reader/evaluation/rank_metrics.py defines them, in numpy.

    Relevant means grade ≥ 2 on a 0–3 scale, else ≥ 1, for RR; nDCG uses the
    grades as gains with a log2 discount; ties are ranked as trec_eval does.
    Only for the log: the reported numbers come from `dilstore evaluate-rank`.
    """
    level = 2 if max(grade for judged in qrels.values() for grade in judged.values()) == 3 else 1
    reciprocal, ndcg = [], []
    discounts = 1.0 / np.log2(np.arange(2, 12))  # ranks 1..10
    for qid, judged in qrels.items():
        ranked = [docid for docid, _ in rank_documents(run.get(qid, {}))][:10]
        grades = np.array([judged.get(docid, 0) for docid in ranked], dtype=np.float64)
        hits = np.flatnonzero(grades >= level)
        reciprocal.append(1.0 / (hits[0] + 1) if hits.size else 0.0)
        ideal = np.sort(np.array([grade for grade in judged.values() if grade > 0], dtype=np.float64))[::-1][:10]
        best = float((ideal * discounts[: len(ideal)]).sum())
        ndcg.append(float((grades * discounts[: len(grades)]).sum()) / best if best else 0.0)
    return {"RR@10": round(float(np.mean(reciprocal)), 4), "nDCG@10": round(float(np.mean(ndcg)), 4)}


# ---------------------------------------------------------------------- training and evaluating the four rankers


def run_configs(args: argparse.Namespace) -> dict[str, RankingTrainingConfig]:
    """The four runs: one budget, each ranker's own learning rates."""
    budget = dict(
        max_steps=args.steps, batch_size=args.batch_size, negatives=args.negatives, max_query_length=32,
        max_doc_length=args.max_doc_length, train_limit=args.steps * args.batch_size, epochs=1,
        save_every=max(args.steps // args.curve_points, 1), keep_checkpoints=args.curve_points + 1,
        log_every=args.log_every, seed=args.seed,
    )  # fmt: skip
    earl = dict(kind="earl", tied=True, prior=True, learning_rate=args.earl_learning_rate)
    return {
        "earl-prior-frozen": RankingTrainingConfig(**earl, freeze_encoder=True, **budget),
        "earl-prior-encoder-lr": RankingTrainingConfig(
            **earl, encoder_learning_rate=args.encoder_learning_rate, **budget
        ),
        "cross-encoder": RankingTrainingConfig(kind="cross-encoder", learning_rate=args.learning_rate, **budget),
        "siamese": RankingTrainingConfig(kind="siamese", learning_rate=args.learning_rate, **budget),
    }


def evaluate(ranker: RankerBase, task: RankingTask, config: RankingTrainingConfig, batch_size: int) -> Run:
    """The task's candidates reranked by `ranker` (fp32, eval mode) at the run's query and document lengths."""
    return rerank(ranker, task, max_query_length=config.max_query_length, max_doc_length=config.max_doc_length,
                  batch_size=batch_size)  # fmt: skip


def learning_curve(
    name: str, work: Path, untrained: RankerBase, config: RankingTrainingConfig, squad: RankingTask,
    args: argparse.Namespace, log: Callable[[str], None],
) -> list[dict[str, Any]]:  # fmt: skip
    """SQuAD-dev RR@10 and nDCG@10 at step 0 (untrained), at every periodic checkpoint and at the end."""
    device = torch.device(args.device)
    points: list[tuple[int, Callable[[], RankerBase]]] = [(0, lambda: untrained)]
    for checkpoint in sorted((work / "checkpoints").glob("step-*")):
        points.append((int(checkpoint.name.split("-")[1]), lambda path=checkpoint: load_ranker(path)))
    points.append((config.max_steps or 0, lambda: load_ranker(work)))
    curve = []
    for step, load in points:
        ranker = load()
        ranker.to(device)
        metrics = rank_metrics(squad.qrels, evaluate(ranker, squad, config, args.eval_batch_size))
        curve.append({"step": step, **metrics})
        log(f"{name} step {step}: SQuAD dev RR@10 {metrics['RR@10']:.4f} nDCG@10 {metrics['nDCG@10']:.4f}")
    return curve


def train_one(
    name: str, config: RankingTrainingConfig, tasks: dict[str, RankingTask], args: argparse.Namespace,
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """Train one ranker, log its learning curve, write its runs to --out; what it did, for report.json."""
    work = args.work / name
    shutil.rmtree(work, ignore_errors=True)
    untrained = new_ranker(config.kind, args.base, config.earl_config())
    if config.freeze_encoder:
        untrained.freeze_encoder(args.base)  # as training starts: the fp16-rounded base
    if name == "earl-prior-frozen":
        untrained.to(args.device)
        for task_name, task in tasks.items():  # the untrained prior ranker is the base model's cosine
            write_run(args.out / f"run.{task_name}.earl-prior-untrained.trec",
                      evaluate(untrained, task, config, args.eval_batch_size), tag="earl-prior-untrained")  # fmt: skip
    started = time.perf_counter()
    result = train_ranker(args.base, args.carry / TRIPLES_FILE, args.carry / PARAGRAPHS_FILE, work, config,
                          command=f"benchmarks/train_rankers_gpu.py {name}", device=args.device,
                          progress=False)  # fmt: skip
    seconds = time.perf_counter() - started
    log(f"{name}: {result.steps} steps, {result.triples_seen} triples in {result.train_seconds:.0f} s "
        f"({seconds:.0f} s with loading), final loss {result.final_loss:.4f}")  # fmt: skip
    curve = learning_curve(name, work, untrained, config, tasks["squad-dev"], args, log)
    ranker = load_ranker(work).to(args.device)
    for task_name, task in tasks.items():
        write_run(args.out / f"run.{task_name}.{name}.trec", evaluate(ranker, task, config, args.eval_batch_size),
                  tag=name)  # fmt: skip
    if config.kind == "earl":
        ship_checkpoint(work, args.out / name, name)
    losses = result.losses
    return {
        "name": name, "config": asdict(config), "steps": result.steps, "triples_seen": result.triples_seen,
        "train_seconds": round(result.train_seconds, 1), "seconds_with_loading": round(seconds, 1),
        "final_loss": result.final_loss,
        "loss_by_tenth": [round(float(np.mean(part)), 4) for part in np.array_split(losses, 10) if len(part)],
        "prior_scale": _prior_scale(ranker), "curve": curve,
        "never_below_start": all(point["nDCG@10"] >= curve[0]["nDCG@10"] for point in curve),
    }  # fmt: skip


def _prior_scale(ranker: RankerBase) -> float | None:
    """The trained prior's scale of an EARL prior ranker, else None."""
    scale = getattr(ranker, "prior_scale", None)
    return None if scale is None else round(float(scale.detach()), 4)


def ship_checkpoint(work: Path, destination: Path, name: str) -> None:
    """The run's final ranker as fp16 in `destination`; weights over the size limit are cut into parts."""
    card = f"# {name}\n\nTrained by benchmarks/train_rankers_gpu.py; see dilstore_training.json and report.json.\n"
    package_checkpoint(work, destination, card)
    weights = destination / "model.safetensors"
    if weights.stat().st_size >= OUT_FILE_LIMIT:
        split_weights(weights)


def split_weights(weights: Path) -> list[Path]:
    """Cut a safetensors file into PART_PATTERN files of under PART_BYTES each (whole tensors); remove it."""
    tensors = load_file(weights)
    parts: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for tensor_name in sorted(tensors):
        tensor = tensors[tensor_name]
        nbytes = tensor.numel() * tensor.element_size()
        if parts[-1] and size + nbytes > PART_BYTES:
            parts.append({})
            size = 0
        parts[-1][tensor_name] = tensor
        size += nbytes
    paths = []
    for index, part in enumerate(parts):
        path = weights.with_name(PART_PATTERN.format(index))
        save_file(part, path, metadata={"format": "pt"})
        paths.append(path)
    weights.unlink()
    return paths


def join_weights(directory: Path) -> Path:
    """Put split_weights' parts back together as model.safetensors in `directory`, and remove the parts."""
    parts = sorted(directory.glob(PART_PATTERN.replace("{:02d}", "*")))
    if not parts:
        raise DilstoreError(f"{directory} holds no {PART_PATTERN.replace('{:02d}', 'NN')} files")
    tensors: dict[str, torch.Tensor] = {}
    for path in parts:
        tensors.update(load_file(path))
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    for path in parts:
        path.unlink()
    return directory / "model.safetensors"


def train(args: argparse.Namespace) -> int:
    """The `train` command: every run in --runs, one after the other; report.json is rewritten after each."""
    args.out.mkdir(parents=True, exist_ok=True)
    # Frozen-encoder checkpoints name package:base-model, which this machine lacks: its carried copy stands in
    # (loading checks the fingerprint).
    os.environ.setdefault(BASE_MODEL_ENV, str(args.base.resolve()))
    log_file = (args.out / "train.log").open("a", encoding="utf-8")

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    torch.set_float32_matmul_precision("highest")
    tasks = {"dl19": load_task(args.carry / DL19_TASK), "squad-dev": load_task(args.carry / SQUAD_TASK)}
    configs = run_configs(args)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    report: dict[str, Any] = {
        "device": device, "torch": torch.__version__,
        "settings": {key: str(value) for key, value in vars(args).items() if key != "run"},
        "tasks": {name: len(task.queries) for name, task in tasks.items()}, "runs": [],
    }  # fmt: skip
    for name in args.runs:
        report["runs"].append(train_one(name, configs[name], tasks, args, log))
        (args.out / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    too_big = [str(path) for path in args.out.rglob("*") if path.is_file() and path.stat().st_size >= OUT_FILE_LIMIT]
    if too_big:
        log(f"over the {OUT_FILE_LIMIT >> 20} MiB a file may have to come back: {', '.join(too_big)}")
    log_file.close()
    return 1 if too_big else 0


# ---------------------------------------------------------------------- preparing the carried folders (here)


def prepare(args: argparse.Namespace) -> int:
    """The `prepare` command: the carried ranking folder and the fp16 base model (needs pyserini, shared data)."""
    from random_models import TOKENIZER_FILES

    from dilstore.reader.data.trec import read_qrels
    from dilstore.reader.evaluation.ranking import load_dl19_task, save_task, squad_dev_task
    from dilstore.reader.modeling.checkpoints import base_model_dir
    from dilstore.reader.modeling.earl_checkpoints import load_base_encoder

    args.carry.mkdir(parents=True, exist_ok=True)
    for name in (TRIPLES_FILE, PARAGRAPHS_FILE):
        shutil.copy2(args.ranking_data / name, args.carry / name)
    msmarco = args.data / "msmarco"
    dl19 = load_dl19_task(
        msmarco / "bm25-top100-with-text.dl19-passage.json", read_qrels(msmarco / "qrels.dl19-passage.txt")
    )
    save_task(dl19, args.carry / DL19_TASK)
    squad = squad_dev_task(args.data / "squad" / "dev-v1.1.json", args.work, SQUAD_DEV_DEPTH,
                           limit=SQUAD_DEV_QUESTIONS, seed=SQUAD_DEV_SEED, threads=1)  # fmt: skip
    save_task(squad, args.carry / SQUAD_TASK)
    encoder, tokenizer = load_base_encoder(base_model_dir())
    encoder.half().save_pretrained(args.base_carry)
    tokenizer.save_pretrained(args.base_carry)
    for name in TOKENIZER_FILES:  # the package's own files, byte for byte, where it has them
        if (base_model_dir() / name).is_file():
            shutil.copy2(base_model_dir() / name, args.base_carry / name)
    for folder in (args.carry, args.base_carry):
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        print(json.dumps({"folder": str(folder), "mib": round(size / 2**20, 2)}))
    return 0


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="train and evaluate the four rankers (the GPU machine)")
    run.add_argument("--carry", type=Path, default=Path(".carry/rank"), help="triples, paragraphs and task files")
    run.add_argument("--base", type=Path, default=Path(".carry/base-minilm-fp16"), help="the base encoder copy")
    run.add_argument("--out", type=Path, required=True,
                     help='report.json, train.log, the TREC runs and the fp16 checkpoints (on the GPU machine: "$OUT")')
    run.add_argument("--work", type=Path, default=Path("/tmp/train-rankers-work"), help="checkpoints (not returned)")
    run.add_argument("--runs", nargs="+", choices=RUN_NAMES, default=list(RUN_NAMES))
    run.add_argument("--steps", type=int, default=1500, help="optimizer steps of every run (default 1500)")
    run.add_argument("--batch-size", type=positive_int, default=16, help="queries per step (default 16)")
    run.add_argument("--negatives", type=positive_int, default=7, help="negatives per query (default 7)")
    run.add_argument("--max-doc-length", type=positive_int, default=256, help="document tokens (default 256)")
    run.add_argument("--learning-rate", type=float, default=3e-5, help="cross-encoder and Siamese (default 3e-5)")
    run.add_argument("--earl-learning-rate", type=float, default=1e-4,
                     help="EARL's judger blocks, head and scale (default 1e-4)")  # fmt: skip
    run.add_argument("--encoder-learning-rate", type=float, default=5e-6,
                     help="earl-prior-encoder-lr's encoder copies (default 5e-6)")  # fmt: skip
    run.add_argument("--curve-points", type=int, default=4, help="periodic checkpoints evaluated (default 4)")
    run.add_argument("--log-every", type=positive_int, default=100)
    run.add_argument("--eval-batch-size", type=positive_int, default=128)
    run.add_argument("--seed", type=numpy_seed, default=42)
    run.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    run.set_defaults(run=train)

    ready = commands.add_parser("prepare", help="write the carried folders (here: CPU, pyserini, shared data)")
    ready.add_argument("--ranking-data", type=Path, required=True, help="the output of `dilstore train ranking-data`")
    ready.add_argument("--carry", type=Path, default=Path(".carry/rank"))
    ready.add_argument("--base-carry", type=Path, default=Path(".carry/base-minilm-fp16"))
    ready.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ready.add_argument("--work", type=Path, default=Path("/tmp/train-rankers-squad-dev-index"),
                       help="where the SQuAD-dev BM25 index is cached")  # fmt: skip
    ready.set_defaults(run=prepare)

    join = commands.add_parser("join", help="put a checkpoint's split weights back into model.safetensors")
    join.add_argument("directory", type=Path)
    join.set_defaults(run=lambda args: print(join_weights(args.directory)) or 0)

    args = parser.parse_args(argv)
    if args.command == "train" and (args.steps < 1 or args.curve_points < 1):
        parser.error("--steps and --curve-points must be at least 1")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
