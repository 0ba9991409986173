"""`dilstore evaluate-qa`: open-domain EM/F1/R of the store's reader over a question file."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.arg_types import positive_int
from dilstore.runners.collector import loading_for_good
from dilstore.runners.inputs import require_file
from dilstore.runners.journal import (
    Journal,
    compacted_settings,
    failed_keeping,
    stopped_keeping,
    store_build,
)
from dilstore.runners.odqa_options import add_odqa_arguments, open_odqa_reader
from dilstore.runners.outputs import check_output_file, refuse_output_inside_models, refuse_output_inside_store
from dilstore.runners.quiet import add_verbose_argument
from dilstore.runners.reading_options import add_subset_arguments, subset_seed
from dilstore.runners.stop_signals import interrupt_number, interrupt_words
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.format import StoreChangedError, StoreReadError
from dilstore.storage.write_lock import refuse_if_locked

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dilstore.reader.evaluation.open_domain import QAEvaluation
    from dilstore.reader.serving.odqa import OpenDomainReader

# Questions of a part kept as it is done (rounded up to whole question batches): a stop loses at most one part,
# about two minutes of a CPU's work.
PART_QUESTIONS = 256


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
    parser.add_argument("--predictions", type=Path, help="also write {question id: {mu: answer}} JSON here; the "
                        "questions done are kept beside it as they are, and the same command run again after a stop "
                        "goes on from them")  # fmt: skip
    parser.add_argument(
        "--json", action="store_true", help='print {"questions","em","f1","recall","top_p","mu","seconds",...}'
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (none with --json either)")
    add_verbose_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load questions, open the reader, evaluate, print EM/F1 for mu = 1 and --mu, and R."""
    from tqdm import tqdm

    from dilstore.reader.evaluation.questions import load_questions
    from dilstore.reader.evaluation.subsets import seeded_subset
    from dilstore.reader.progress_lines import bar_options, steady_bar

    seed = subset_seed(args)
    if args.predictions:
        refuse_output_inside_store(args.predictions, args.store, "--predictions")
        refuse_output_inside_models(args.predictions, args.model, "--predictions")
        check_output_file(args.predictions, "--predictions", [args.questions])
        refuse_if_locked(args.predictions)  # before the model and the JVM load
        require_file(args.questions, "--questions")  # the journal checksums it: a pipe would read empty (qa48 H1)
    questions = seeded_subset(load_questions(args.questions), args.limit, seed)
    with loading_for_good():
        odqa = open_odqa_reader(args)  # the store is checked before torch and the reader load (fast59 F1)
    from dilstore.reader.evaluation.open_domain import (
        QAEvaluation,
        evaluate_questions,
        merged_evaluation,
        write_predictions,
    )

    size = args.question_batch * math.ceil(PART_QUESTIONS / args.question_batch)
    parts = [questions[first : first + size] for first in range(0, len(questions), size)]
    settings = _settings(args, odqa, seed, size)
    # The store's spec (a compaction's record) is read only for a run that keeps a journal.
    journaled = (Journal(args.predictions, settings, check=QAEvaluation.from_record,
                         also=compacted_settings(settings, args.store, odqa.store.manifest))
                 if args.predictions else None)  # fmt: skip
    with journaled or contextlib.nullcontext() as journal:
        kept = journal.parts if journal is not None else {}
        resumed = sum(len(parts[part]) for part in kept)
        bar = steady_bar(tqdm)(total=len(questions), initial=resumed, unit="question", desc="evaluate-qa",
                   disable=args.no_progress or args.json, **bar_options())  # fmt: skip
        evaluations = []
        try:
            with bar:
                for number, part in enumerate(parts):
                    if number in kept:
                        evaluations.append(QAEvaluation.from_record(kept[number]))
                        continue
                    evaluations.append(evaluate_questions(
                        odqa, part, top_p=odqa.settings.top_p, mu=odqa.settings.mu,
                        question_batch=args.question_batch,
                        on_batch=lambda done, before=bar.n: bar.update(before + done - bar.n)))  # fmt: skip
                    if journal is not None:
                        journal.add(number, evaluations[-1].to_record())
        except KeyboardInterrupt as interrupt:
            raise _stopped(interrupt, journal, sum(evaluation.questions for evaluation in evaluations),
                           len(questions)) from None  # fmt: skip
        except (StoreReadError, StoreChangedError) as error:  # a compacted store serves what the parts read (conc54 F4)
            done = _done_words(evaluations, len(questions))
            raise failed_keeping(error, journal, done, args.store, odqa.store.manifest) from None
        evaluation = merged_evaluation(evaluations, questions)
        # The scores first: a predictions file that could not be written took them along (longrun45 F9); the
        # journal then stays, and the same command writes the file from it.
        _report(args, evaluation, resumed, odqa.settings.max_question_length)
        if journal is not None:
            try:
                write_predictions(args.predictions, evaluation)
            except DilstoreError as error:  # the answers stay in the journal, and the same command writes the file
                kept = f"the answers of all {evaluation.questions:,} questions"
                raise journal.output_not_written(error, kept) from None
            journal.remove()
    return 0


def _report(args: argparse.Namespace, evaluation: QAEvaluation, resumed: int, max_question_length: int) -> None:
    """The scores on stdout: one JSON object with --json, else a few lines."""
    if args.json:
        print(json.dumps({**evaluation.summary(), "resumed_questions": resumed}), flush=True)
        return
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
        print(f"  {evaluation.refused} question(s) the reader refused (over its {max_question_length}-token "
              "question limit, or no word pieces at all) scored as unanswered")
    sys.stdout.flush()


def _settings(args: argparse.Namespace, odqa: OpenDomainReader, seed: int, part_questions: int) -> dict[str, Any]:
    """What decides the results of a part, recorded in the journal: a journal of other settings (another question
    file or subset, store build, reader or option) is not taken for this run's."""
    manifest = odqa.store.manifest
    # The file by its contents and name (a JSONL question's id is NAME:LINE), not its path: a copy elsewhere is the
    # same questions (review45b M1).
    return {"command": "evaluate-qa", "questions": args.questions.name,
            "questions_sha256": sha256_file(args.questions), "limit": args.limit, "seed": seed,
            "part_questions": part_questions, **store_build(manifest),
            "index": str(Path(args.index).resolve()) if args.index else None,
            "model": str(Path(args.model).resolve()) if args.model else None,
            "settings": dataclasses.asdict(odqa.settings),
            "read_with": odqa.read_with}  # fmt: skip


def _stopped(interrupt: KeyboardInterrupt, journal: Journal | None, done: int, total: int) -> StoppedBySignal:
    """The stop, saying what was kept, or, without --predictions, that the questions done are not."""
    if done and journal is None:
        return StoppedBySignal(f"{interrupt_words(interrupt)}; the {done:,} of {total:,} questions done are not kept "
                               "(with --predictions FILE they are, and the same command goes on from them)",
                               interrupt_number(interrupt))  # fmt: skip
    return stopped_keeping(interrupt, journal, f"{done:,} of {total:,} questions done" if done else None)


def _done_words(evaluations: Sequence[QAEvaluation], total: int) -> str | None:
    """How many of `total` questions the finished parts `evaluations` hold, in words; None when they hold none."""
    done = sum(evaluation.questions for evaluation in evaluations)
    return f"{done:,} of {total:,} questions done" if done else None

