"""`dilstore train`: fine-tune readers and rankers.

`train qa` fine-tunes a DilBert reader on SQuAD; `train earl`, `train
cross-encoder`, `train siamese` and `train listformer` train rankers on the
triples that `train ranking-data` builds (runners/cmd_train_ranking.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.arg_types import positive_int, sample_seed
from dilstore.runners.cmd_train_ranking import register_rankers, register_ranking_data
from dilstore.runners.inputs import require_directory, require_file
from dilstore.runners.reading_options import (
    add_reading_arguments,
    apply_threads,
    check_window_options,
    reading_settings,
)
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
    shows_progress,
)
from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:
    from dilstore.reader.data.squad import SquadExample
    from dilstore.reader.training.configs import TrainingConfig
    from dilstore.reader.training.qa import TrainingResult


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `train` and its sub-subcommands: qa, the ranker kinds, and ranking-data."""
    parser = subparsers.add_parser("train", help="fine-tune readers and rankers", description=__doc__)
    kinds = parser.add_subparsers(dest="train_command", metavar="KIND", required=True)
    register_qa(kinds)
    register_rankers(kinds)
    register_ranking_data(kinds)


def register_qa(kinds: argparse._SubParsersAction) -> None:
    """Add `train qa`."""
    parser = kinds.add_parser(
        "qa",
        help="fine-tune a DilBert reader on SQuAD v1.1-format data",
        description=(
            "Fine-tune a DilBert extractive reader with k non-interaction layers (run_squad style: "
            "sliding windows, AdamW with linear warm-up and decay). Writes a Hugging Face-style "
            "checkpoint plus dilstore_training.json to --output, periodic resumable checkpoints under "
            "OUTPUT/checkpoints, and, with --dev, eval-dev.json with EM/F1."
        ),
    )
    parser.add_argument("--model", type=Path, help="start from this checkpoint (default: all-MiniLM-L6-v2)")
    parser.add_argument("--layers", type=int, required=True, help="k: layers that see question and passage apart")
    parser.add_argument("--train", type=Path, required=True, help="SQuAD v1.1-format training JSON")
    parser.add_argument("--dev", type=Path, help="SQuAD v1.1-format dev JSON to evaluate on after training")
    add_output_argument(parser, "qa-k{layers}", shown_as="qa-kK")
    add_optimizer_arguments(parser, passes_over="training windows", epochs=2, batch_of="windows", batch_size=12)
    add_run_arguments(parser, seeded="weights init, data order, dropout", limit_of="training questions")
    parser.add_argument(
        "--no-group-by-length",
        action="store_true",
        help="batch windows in plain random order (default: length-grouped)",
    )
    parser.add_argument(
        "--group-length", choices=("longest", "sum"), default="longest",
        help="with --shared-norm, the length a question group is grouped by: its longest window's tokens (default: "
        "what a micro-batch pads to) or their sum over its windows (how runs that recorded no setting grouped: resume "
        "such runs with it)",
    )  # fmt: skip
    parser.add_argument(
        "--teacher",
        type=Path,
        help="distil from this reader (usually the fine-tuned k=0 one): its start/end distributions and upper layers",
    )
    parser.add_argument(
        "--distillation-temperature",
        type=float,
        default=2.0,
        help="softmax temperature T of the logit loss (default 2)",
    )
    parser.add_argument(
        "--distillation-weight", type=float, default=1.0, help="weight alpha of the logit loss (default 1)"
    )
    parser.add_argument(
        "--representation-weight", type=float, default=1.0, help="weight beta of the upper-layer loss (default 1)"
    )
    parser.add_argument(
        "--shared-norm", type=Path, metavar="TRIPLES",
        help="shared normalisation: train each question with the first windows of its BM25 negative paragraphs "
        "from these triples (`train ranking-data`; paragraphs.jsonl.gz beside them), one softmax over all",
    )  # fmt: skip
    parser.add_argument(
        "--shared-norm-negatives", type=int, default=3, metavar="N",
        help="negative paragraphs per question with --shared-norm (default 3)",
    )  # fmt: skip
    parser.add_argument(
        "--freeze-lower", action="store_true",
        help="train only layers k+1..l and the head: the embeddings and layers 1..k stay as in --model, and each "
        "window's layer-k states are computed once and cached in fp16, as a store keeps them (needs k >= 1)",
    )  # fmt: skip
    parser.add_argument(
        "--store-encoding", metavar="ENCODING",
        help="with --freeze-lower: cache the passage states as a store of this encoding (e.g. 2bit) returns them, "
        "so the upper layers learn to read decoded states; the codebook goes to OUTPUT/codebook",
    )  # fmt: skip
    parser.add_argument(
        "--codebook", type=Path,
        help="with --store-encoding: this codebook (a store's codebook/ folder) instead of one trained on a seeded "
        "sample of the training passages' states",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-windows", type=int, metavar="N",
        help="run each micro-batch's windows through the model in length-sorted passes of at most N, each padded "
        "to its own longest: the same loss, less padding (0: one pass per micro-batch; default: 4 on a CPU, "
        "where shared-normalisation steps ran 2.4x faster, and 0 on a GPU)",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action="store_true",
        help="compile the encoder layers (torch.compile) before training: fewer, fused kernels a step on a GPU, "
        "where small kernels bound the step; the first step waits for the compilation",
    )  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUTPUT")
    parser.add_argument(
        "--eval-limit", type=positive_int, help="evaluate on a seeded random subset of N dev questions"
    )
    parser.add_argument(
        "--eval-seed", type=sample_seed, default=0, help="seed of the --eval-limit subset, at least 0 (default 0)"
    )
    add_reading_arguments(parser)
    add_report_arguments(parser)
    parser.set_defaults(run=holding_the_output(run_qa))


def run_qa(args: argparse.Namespace) -> int:
    """Train, then evaluate on --dev when given; print k, EM, F1 and the train and eval times."""
    # Before torch and the trainer load (5-10 s), which a missing --train (fast59 F5) and a setting out of range
    # (left61 F10) waited for.
    config = _qa_config(args)
    examples = _checked_qa_inputs(args)
    apply_threads(args.threads)
    from dilstore.reader.evaluation.reading_comprehension import evaluate_file, write_evaluation
    from dilstore.reader.modeling.checkpoints import base_model_dir
    from dilstore.reader.training.qa import train_qa

    result = train_qa(args.model or base_model_dir(), args.train, output_dir(args), config, **run_options(args),
                      examples=examples)  # fmt: skip
    summary = qa_summary(result)
    if args.dev is not None:
        from dilstore.reader.modeling.dilbert import DilBertReader

        evaluation = evaluate_file(
            DilBertReader.from_pretrained(result.output),
            args.dev,
            settings=reading_settings(args),
            limit=args.eval_limit,
            seed=args.eval_seed,
            device=args.device,
            progress=shows_progress(args),
        )
        summary.update(evaluation.summary())
        write_evaluation(result.output, evaluation, limit=args.eval_limit, seed=args.eval_seed, training=summary)
    print(json.dumps(summary) if args.json else _qa_line(summary, args.dev is not None))
    return 0


def qa_summary(result: TrainingResult) -> dict[str, Any]:
    """What `train qa --json` prints of the run (and eval-dev.json records): a last loss that is not finite is null,
    where json.dumps wrote NaN, which is no JSON (left61 F4)."""
    from dilstore.storage.checks import finite_float

    return {
        "k": result.layers,
        "train_steps": result.steps,
        "features_seen": result.features_seen,
        "train_seconds": round(result.train_seconds, 1),
        "final_loss": finite_float(result.final_loss),
        "output": str(result.output),
    }


def _checked_qa_inputs(args: argparse.Namespace) -> list[SquadExample]:
    """The training questions of --train, read once, here; a DilstoreError for a missing input file or folder,
    --eval-limit without --dev, or a malformed --train or --dev (or a --dev question without an answer, left61 F2):
    found before torch loads and before training, not after the hours it would take."""
    from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE
    from dilstore.reader.data.squad import training_questions
    from dilstore.reader.evaluation.squad_scoring import chosen_questions

    require_file(args.train, "--train")
    require_start_model(args.model, args.resume)
    if args.eval_limit is not None and args.dev is None:
        raise DilstoreError("--eval-limit picks the dev questions evaluated after training; give --dev too")
    for flag, path in (("--dev", args.dev), ("--shared-norm", args.shared_norm)):
        if path is not None:
            require_file(path, flag)
    if args.shared_norm is not None:  # read beside the triples; a missing one was named after the model (left61 F9)
        require_file(args.shared_norm.parent / PARAGRAPHS_FILE, "--shared-norm's paragraph file")
    for flag, path in (("--teacher", args.teacher), ("--codebook", args.codebook)):
        if path is not None:
            require_directory(path, flag)
    _check_teacher_and_codebook(args)
    if args.dev is not None:  # a malformed dev file is refused now, not after the training it would evaluate
        chosen_questions(args.dev, args.eval_limit, args.eval_seed)
    return training_questions(args.train, args.train_limit)


def _check_teacher_and_codebook(args: argparse.Namespace) -> None:
    """A DilstoreError for a --teacher that is no trained reader, or a --codebook that is no codebook of
    --store-encoding, before torch and the model load: both were named after them, 5.5-6 s (left61 F8). A resumed run
    reads the codebook its first part saved, not --codebook, so a resume does not read it here. Zarr is imported only
    for a codebook: a training machine may lack it (tests/reader/training/test_training_machine.py)."""
    from dilstore.reader.modeling.checkpoints import require_trained_reader
    from dilstore.storage.encodings import ENCODINGS, needs_codebook

    if args.teacher is not None:
        require_trained_reader(args.teacher, f"--teacher {args.teacher}")
    encoding = args.store_encoding
    if args.codebook is not None and not args.resume and encoding in ENCODINGS and needs_codebook(encoding):
        from dilstore.storage.codebook import read_codebook

        read_codebook(args.codebook, encoding)


def _qa_config(args: argparse.Namespace) -> TrainingConfig:
    """The run's settings from the command line, checked: window options that leave a window no room (left61 F7),
    then what TrainingConfig refuses."""
    from dilstore.reader.training.configs import TrainingConfig

    check_window_options(args)

    return TrainingConfig(
        layers=args.layers,
        max_seq_length=args.max_seq_length,
        doc_stride=args.doc_stride,
        max_question_length=args.max_question_length,
        group_by_length=not args.no_group_by_length,
        group_length=args.group_length,
        teacher=None if args.teacher is None else str(args.teacher),
        distillation_temperature=args.distillation_temperature,
        distillation_weight=args.distillation_weight,
        representation_weight=args.representation_weight,
        shared_norm=None if args.shared_norm is None else str(args.shared_norm),
        shared_norm_negatives=args.shared_norm_negatives,
        freeze_lower=args.freeze_lower,
        store_encoding=args.store_encoding,
        codebook=None if args.codebook is None else str(args.codebook),
        chunk_windows=args.chunk_windows,
        compile=args.compile,
        **config_fields(args),
    )


def _qa_line(summary: dict[str, Any], evaluated: bool) -> str:
    """The one line `train qa` prints without --json."""
    line = f"k={summary['k']}  steps {summary['train_steps']}  train {duration(summary['train_seconds'])}"
    if evaluated:
        line += f"  dev EM {summary['em']:.2f}  F1 {summary['f1']:.2f}  eval {duration(summary['seconds'])}"
    return line
