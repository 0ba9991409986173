"""`dilstore train earl|cross-encoder|siamese|listformer` and `dilstore train ranking-data`: paragraph ranking.

`ranking-data` turns a SQuAD v1.1 file into (query, gold paragraph, BM25
negatives) triples; every ranker kind trains on those triples with one loop
(reader/training/ranking.py). The Listformer reads each query's positive and
negatives as one list and trains with a listwise loss (ApproxNDCG or ListNet).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.arg_types import numpy_seed, positive_int, thread_count
from dilstore.runners.inputs import require_file
from dilstore.runners.outputs import check_output_folder
from dilstore.runners.reading_options import apply_threads
from dilstore.runners.training_options import (
    add_optimizer_arguments,
    add_output_argument,
    add_report_arguments,
    add_run_arguments,
    config_fields,
    duration,
    holding_the_output,
    output_dir,
    require_start_model,
    run_options,
)
from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:
    from dilstore.reader.training.ranking import RankingTrainingResult

RANKER_HELP = {
    "earl": "EARL: query module + judger blocks over an offline document module (seed 004)",
    "cross-encoder": "the BERT ranker baseline over [CLS] q [SEP] d [SEP]",
    "siamese": "the BERT-Siamese baseline: mean-pooled embeddings, dot product",
    "listformer": "the Listformer: a query and its whole document list in one pass, global-local attention (seed 003)",
}
LOSS_HELP = {
    "pairwise": "a softmax or pairwise hinge loss over 1 positive and N negatives per query",
    "listwise": "a listwise ApproxNDCG or ListNet loss over each query's list of 1 positive and N negatives",
}


def register_rankers(kinds: argparse._SubParsersAction) -> None:
    """Add `train earl`, `train cross-encoder`, `train siamese` and `train listformer`."""
    for kind, help_text in RANKER_HELP.items():
        losses = LOSS_HELP["listwise" if kind == "listformer" else "pairwise"]
        parser = kinds.add_parser(
            kind,
            help=f"train {help_text}",
            description=(
                f"Train {help_text} on triples from `dilstore train ranking-data`, end to end with {losses} "
                "(AdamW, linear warm-up and decay). "
                "Writes the ranker plus dilstore_training.json to --output and periodic resumable checkpoints "
                "under OUTPUT/checkpoints."
            ),
        )
        _add_ranker_arguments(parser, kind)
        parser.set_defaults(run=holding_the_output(run_ranker))


def register_ranking_data(kinds: argparse._SubParsersAction) -> None:
    """Add `train ranking-data`."""
    parser = kinds.add_parser(
        "ranking-data",
        help="SQuAD → (query, gold paragraph, BM25 negatives) triples for ranker training",
        description=(
            "Index every paragraph of a SQuAD v1.1 file with pyserini BM25 (cached in --work), retrieve the "
            "top --depth paragraphs per question, and sample --negatives non-gold ones per question with a "
            "seeded generator (questions with too few get random non-gold paragraphs, counted). Writes "
            "OUTPUT/triples.jsonl.gz, OUTPUT/paragraphs.jsonl.gz and OUTPUT/ranking_data.json."
        ),
    )
    parser.add_argument("--squad", type=Path, required=True, help="SQuAD v1.1 training JSON")
    parser.add_argument("--output", type=Path, required=True, help="folder for the triples and paragraphs files")
    parser.add_argument("--negatives", type=positive_int, default=8, help="negatives per question (default 8)")
    parser.add_argument("--depth", type=positive_int, default=30, help="BM25 candidates per question (default 30)")
    parser.add_argument("--seed", type=numpy_seed, default=13, help="seed of the negative sampling (default 13)")
    parser.add_argument("--limit", type=int, help="only the first N questions (the index still covers all)")
    parser.add_argument("--work", type=Path, help="where the BM25 index is cached (default OUTPUT/work)")
    parser.add_argument("--threads", type=thread_count, default=1, help="indexing and search threads (default 1)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    again = ("run the same command again (it reuses a BM25 index it finished in --work, and removes a half-built one, "
             "WORK/.bm25.building)")  # fmt: skip
    parser.set_defaults(run=holding_the_output(run_ranking_data, lambda args, output: again))


def _add_ranker_arguments(parser: argparse.ArgumentParser, kind: str) -> None:
    """The options of one ranker kind's training command."""
    parser.add_argument("--triples", type=Path, required=True, help="triples.jsonl.gz from `train ranking-data`")
    parser.add_argument(
        "--paragraphs", type=Path, help="paragraphs file (default: paragraphs.jsonl.gz beside --triples)"
    )
    add_output_argument(parser, "{train_command}", shown_as=kind)
    parser.add_argument("--base-model", type=Path, help="plain BERT encoder to start from (default: all-MiniLM-L6-v2)")
    parser.add_argument(
        "--negatives", type=positive_int, default=7, help="negatives per query: the first N of each triple (default 7)"
    )
    if kind == "listformer":
        parser.add_argument("--loss", choices=("approx-ndcg", "listnet"), default="approx-ndcg",
                            help="default approx-ndcg (its loss is -ApproxNDCG: 0 down to -1)")  # fmt: skip
        parser.add_argument(
            "--temperature", type=float,
            help="T of ApproxNDCG's ranks 1 + sum_j sigmoid((s_j - s_i) / T); smaller is closer to NDCG (default 1.0)",
        )  # fmt: skip
        parser.add_argument(
            "--delayed-layers", type=int, default=0, metavar="K",
            help="k: layers 1..k see each document and the query alone, so precompute can store them (default 0)",
        )  # fmt: skip
        parser.add_argument(
            "--prior", action="store_true",
            help="add the bi-encoder prior: 20 x cosine of the frozen base's mean-pooled query and document, "
            "a zero-initialised head",
        )  # fmt: skip
    else:
        parser.add_argument("--loss", choices=("softmax", "hinge"), default="softmax", help="default softmax")
        parser.add_argument("--margin", type=float, help="margin of the hinge loss (default 1.0)")
    add_optimizer_arguments(parser, passes_over="triples", epochs=1, batch_of="queries", batch_size=16)
    parser.add_argument("--max-query-length", type=int, default=32, help="query tokens with [CLS], [SEP] (default 32)")
    parser.add_argument("--max-doc-length", type=int, default=256, help="document tokens with [CLS], [SEP] (256)")
    if kind == "earl":
        parser.add_argument("--query-layers", type=int, help="N, the query module's layers (default l - 2)")
        parser.add_argument("--pooling", choices=("cls", "mean"), default="cls", help="ClsPool or AvePool (cls)")
        parser.add_argument("--tied", action="store_true", help="share the query module with the document module")
        parser.add_argument(
            "--prior", action="store_true",
            help="add the bi-encoder prior: 20 x cosine of mean-pooled query and S1 states, a zero-initialised head",
        )  # fmt: skip
        encoder = parser.add_mutually_exclusive_group()
        encoder.add_argument(
            "--freeze-encoder", action="store_true",
            help="train only the judger blocks, head and prior scale; checkpoints name the base instead of "
            "storing the encoder",
        )  # fmt: skip
        encoder.add_argument(
            "--encoder-learning-rate", type=float, metavar="LR",
            help="peak learning rate of the encoder copies (default: --learning-rate)",
        )  # fmt: skip
    add_run_arguments(parser, seeded="data order and dropout", limit_of="triples")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUTPUT")
    add_report_arguments(parser)


def run_ranker(args: argparse.Namespace) -> int:
    """Train one ranker kind; print the steps, time, the last step's loss and the output."""
    from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE

    paragraphs = args.paragraphs or args.triples.parent / PARAGRAPHS_FILE
    for flag, path in (("--triples", args.triples), ("--paragraphs", paragraphs)):
        require_file(path, flag)
    require_start_model(args.base_model, args.resume)
    given = {name: value for name in ("margin", "temperature") if (value := getattr(args, name, None)) is not None}
    for name, loss in (("margin", "hinge"), ("temperature", "approx-ndcg")):
        if name in given and args.loss != loss:
            raise DilstoreError(f"--{name} is the {loss} loss's; with --loss {args.loss} it would be ignored")
    # Torch and the trainer (5-10 s) only now: a mistyped --triples was named after them (fast59 F5).
    apply_threads(args.threads)
    from dilstore.reader.modeling.checkpoints import base_model_dir
    from dilstore.reader.training.ranking import RankingTrainingConfig, train_ranker

    config = RankingTrainingConfig(
        kind=args.train_command,
        negatives=args.negatives,
        loss=args.loss,
        delayed_layers=getattr(args, "delayed_layers", 0),
        max_query_length=args.max_query_length,
        max_doc_length=args.max_doc_length,
        query_layers=getattr(args, "query_layers", None),
        pooling=getattr(args, "pooling", "cls"),
        tied=getattr(args, "tied", False),
        prior=getattr(args, "prior", False),
        freeze_encoder=getattr(args, "freeze_encoder", False),
        encoder_learning_rate=getattr(args, "encoder_learning_rate", None),
        **given,
        **config_fields(args),
    )
    result = train_ranker(
        args.base_model or base_model_dir(), args.triples, paragraphs, output_dir(args), config, **run_options(args)
    )
    if args.json:
        print(json.dumps(ranker_summary(result)))
    else:
        print(
            f"{result.kind}: steps {result.steps}  triples {result.triples_seen}  "
            f"train {duration(result.train_seconds)}  last-step loss {result.final_loss:.4f}  → {result.output}"
        )
    return 0


def ranker_summary(result: RankingTrainingResult) -> dict[str, Any]:
    """What `train earl|cross-encoder|siamese|listformer --json` prints of the run: a last loss that is not finite
    is null, where json.dumps wrote NaN, which is no JSON (left61 F4)."""
    from dilstore.storage.checks import finite_float

    return {
        "kind": result.kind,
        "train_steps": result.steps,
        "triples_seen": result.triples_seen,
        "train_seconds": round(result.train_seconds, 1),
        "final_loss": finite_float(result.final_loss),
        "output": str(result.output),
    }


def run_ranking_data(args: argparse.Namespace) -> int:
    """Build the triples; Anserini's log goes to stderr so stdout carries only the summary."""
    from dilstore.reader.data.ranking_data import build_ranking_data
    from dilstore.runners.cmd_index import stdout_to_stderr

    require_file(args.squad, "--squad")
    if args.work is not None:
        check_output_folder(args.work, "--work")  # it said "Not a directory: FILE/collection.sha256" (train46 F5)
    with stdout_to_stderr():
        summary = build_ranking_data(
            args.squad,
            args.output,
            negatives=args.negatives,
            depth=args.depth,
            seed=args.seed,
            limit=args.limit,
            work=args.work,
            threads=args.threads,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    if args.json:
        print(json.dumps(asdict(summary)))
    else:
        print(
            f"{summary.questions} triples with {summary.negatives} negatives each (BM25 top-{summary.depth}, "
            f"{summary.filled_questions} question(s) filled with {summary.filled_negatives} random negative(s), "
            f"{summary.twin_questions} whose gold text recurs under another id, never a negative) "
            f"→ {summary.triples}, {summary.paragraphs_written} paragraphs → {summary.paragraphs}"
        )
    return 0
