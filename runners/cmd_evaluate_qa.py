"""`dilstore evaluate-qa`: open-domain EM/F1/R of the store's reader over a question file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dilstore.runners.odqa_options import add_odqa_arguments, open_odqa_reader
from dilstore.runners.outputs import check_output_file, refuse_output_inside_models, refuse_output_inside_store
from dilstore.runners.arg_types import positive_int
from dilstore.runners.reading_options import add_subset_arguments, apply_threads, subset_seed
from dilstore.runners.quiet import add_verbose_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `evaluate-qa` subcommand."""
    parser = subparsers.add_parser(
        "evaluate-qa",
        help="open-domain EM/F1/R over a question file (BM25 top-p + stored states)",
        description=(
            "Answer every question from the store (BM25 top-p, then the reader) and score the answers "
            "with the official SQuAD v1.1 EM/F1, reader only (mu = 1) and fused with BM25 (--mu), plus R: "
            "the share of questions whose answer appears in a retrieved passage. Questions come as "
            'DPR-style JSONL ({"question", "answer": [...]} per line, .jsonl) or SQuAD v1.1 JSON.'
        ),
    )
    add_odqa_arguments(parser)
    parser.add_argument("--questions", type=Path, required=True, help="DPR-style .jsonl or SQuAD v1.1 .json")
    add_subset_arguments(parser, "evaluate questions:")
    parser.add_argument("--question-batch", type=positive_int, default=8, help="questions read together (default 8)")
    parser.add_argument("--predictions", type=Path, help="also write {question id: {mu: answer}} JSON here")
    parser.add_argument(
        "--json", action="store_true", help='print {"questions","em","f1","recall","top_p","mu","seconds",...}'
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (none with --json either)")
    add_verbose_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load questions, open the reader, evaluate, print EM/F1 for mu = 1 and --mu, and R."""
    apply_threads(args.threads)
    from tqdm import tqdm

    from dilstore.reader.evaluation.open_domain import evaluate_questions, load_questions, select_questions, write_predictions

    if args.predictions:
        refuse_output_inside_store(args.predictions, args.store, "--predictions")
        refuse_output_inside_models(args.predictions, args.model, "--predictions")
        check_output_file(args.predictions, "--predictions", [args.questions])
    seed = subset_seed(args)
    questions = select_questions(load_questions(args.questions), args.limit, seed)
    odqa = open_odqa_reader(args)
    bar = tqdm(total=len(questions), unit="question", desc="evaluate-qa", file=sys.stderr, dynamic_ncols=True,
               disable=args.no_progress or args.json)  # fmt: skip
    with bar:
        evaluation = evaluate_questions(
            odqa,
            questions,
            top_p=odqa.settings.top_p,
            mu=odqa.settings.mu,
            question_batch=args.question_batch,
            on_batch=lambda done: bar.update(done - bar.n),
        )
    if args.predictions:
        write_predictions(args.predictions, evaluation)
    if args.json:
        print(json.dumps(evaluation.summary()))
        return 0
    print(
        f"store {args.store}  questions {evaluation.questions}  top-p {evaluation.top_p}  "
        f"R {evaluation.recall:.2f}  encoding {evaluation.encoding}  ({evaluation.seconds:.1f} s)"
    )
    if evaluation.online_variant:
        print(f"  online layers tuned for the store's encoding: {evaluation.online_variant}")
    for mu, (em, f1) in sorted(evaluation.scores.items(), reverse=True):
        label = "reader only" if mu == 1.0 else "reader + BM25"
        print(f"  mu {mu:g} ({label}): EM {em:.2f}  F1 {f1:.2f}")
    if evaluation.refused:
        print(f"  {evaluation.refused} question(s) the reader refused (over its {odqa.settings.max_question_length}-"
              "token question limit, or no word pieces at all) scored as unanswered")
    return 0

