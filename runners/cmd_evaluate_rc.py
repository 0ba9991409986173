"""`dilstore evaluate-rc`: SQuAD reading comprehension EM/F1, each question read against its own paragraph."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dilstore.runners.inputs import require_file
from dilstore.runners.journal import Journal, stopped_keeping
from dilstore.runners.outputs import check_output_file, refuse_output_inside_models
from dilstore.runners.quiet import add_verbose_argument
from dilstore.runners.reading_options import (
    add_reading_arguments,
    add_runtime_arguments,
    add_subset_arguments,
    apply_threads,
    check_window_options,
    reading_settings,
    subset_seed,
)
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.write_lock import refuse_if_locked

if TYPE_CHECKING:
    from dilstore.reader.evaluation.reading_comprehension import ReadingSettings
    from dilstore.reader.modeling.dilbert import DilBertReader

# Questions a part of the journal holds (runners/journal.py): a stop loses at most one part, about a minute of this
# CPU's work at the shipped reader's speed.
PART_QUESTIONS = 1000


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `evaluate-rc` subcommand."""
    parser = subparsers.add_parser(
        "evaluate-rc",
        help="EM/F1 of a reader on SQuAD-format data (each question against its gold paragraph)",
        description=(
            "Reading comprehension: every question is read against its own paragraph (all sliding "
            "windows), the best span across windows is the answer, scored with the official SQuAD v1.1 "
            "EM/F1. With no --model, the project's default checkpoint is used. With --score, no model runs: a "
            "prediction file (question id → answer, as --predictions writes and the SQuAD leaderboard takes) is "
            "scored with the same metric."
        ),
    )
    parser.add_argument("--model", type=Path, help="reader checkpoint directory (default: the shipped reader)")
    parser.add_argument("--data", type=Path, required=True, help="SQuAD v1.1-format JSON")
    add_subset_arguments(parser, "score questions:")
    add_reading_arguments(parser)
    add_runtime_arguments(parser)
    parser.add_argument("--predictions", type=Path, help="also write {question id: answer} JSON here; the answers "
                        "are kept beside it as they are read, and the same command run again after a stop goes on "
                        "from them")  # fmt: skip
    parser.add_argument("--score", type=Path, metavar="PREDICTIONS",
                        help="score this {question id: answer} JSON file instead of running a reader")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        help='print {"questions","em","f1","k","seconds","reading","data"} (no progress bar); with '
                             '--score {"questions","em","f1","unanswered"}')
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (none with --json)")
    add_verbose_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load the reader and data, evaluate, print the scores (or, with --score, score a prediction file)."""
    if args.score is not None:
        return score(args)
    from dilstore.reader.evaluation.squad_scoring import chosen_questions
    from dilstore.reader.modeling.checkpoints import read_metadata, require_checkpoint_dir
    from dilstore.reader.packaged.shipped import default_checkpoint_dir

    seed = subset_seed(args)
    check_window_options(args)
    require_file(args.data, "--data")  # read, then checksummed (data.sha256): a pipe reads empty (qa48 H1)
    if args.predictions:
        refuse_output_inside_models(args.predictions, args.model, "--predictions")
        check_output_file(args.predictions, "--predictions", [args.data])
        refuse_if_locked(args.predictions)  # before the model loads
    model_dir = args.model or default_checkpoint_dir()
    if read_metadata(require_checkpoint_dir(model_dir)) is None:
        raise DilstoreError(f"{model_dir} is a base model without dilstore metadata, and its QA head would be "
                            "untrained: give a reader that `dilstore train qa` wrote")  # fmt: skip
    chosen = chosen_questions(args.data, args.limit, seed)  # a malformed --data too (left61 F2)
    # Torch and the reader (5-10 s) only now: a mistyped --data, --predictions folder or --model was named after
    # them (fast59 F4).
    apply_threads(args.threads)
    from dilstore.reader.evaluation.reading_comprehension import ReadingParts, evaluate_chosen
    from dilstore.reader.modeling.dilbert import DilBertReader
    from dilstore.reader.offline.kinds import require_within_positions

    reader = DilBertReader.from_pretrained(model_dir)
    require_within_positions(args.max_seq_length, reader, "window", "--max-seq-length")  # not at the first long one
    settings = reading_settings(args)
    journaled = (Journal(args.predictions, _settings(args, reader, settings), check=_checked_part)
                 if args.predictions else None)  # fmt: skip
    with journaled or contextlib.nullcontext() as journal:
        parts = None if journal is None else ReadingParts(PART_QUESTIONS, journal.parts, journal.add)
        resumed = _kept_answers(journal)  # before this run adds its parts
        try:
            result = evaluate_chosen(reader, args.data, chosen, settings=settings, device=args.device,
                                     progress=not (args.json or args.no_progress), parts=parts)
        except KeyboardInterrupt as interrupt:
            raise _stopped(interrupt, journal) from None
        # The scores first: a predictions file that could not be written (its folder gone, a full disk) took them
        # along, after minutes of reading (longrun45 F9).
        if args.json:  # resumed_questions as evaluate-qa's: it was missing (tail61b F5)
            print(json.dumps({**result.summary(), "resumed_questions": resumed}), flush=True)
        else:
            print(
                f"model {model_dir}  k={result.k}  questions {result.questions}  "
                f"EM {result.em:.2f}  F1 {result.f1:.2f}  ({result.seconds:.1f} s)", flush=True
            )
        if journal is not None:
            text = json.dumps(result.predictions, ensure_ascii=False, indent=1)
            try:
                atomic_write_text(args.predictions, text, named_by_user=True)
            except OSError as error:  # the answers stay in the journal, and the same command writes the file
                raise journal.output_not_written(error, f"the answers of all {result.questions:,} questions") from None
            journal.remove()
    return 0


def _checked_part(record: dict[str, Any]) -> None:
    """A KeyError, TypeError or ValueError unless `record` is a part `evaluate_reader` kept: {"predictions": {id:
    answer}, "seconds"}."""
    if not all(isinstance(key, str) and isinstance(answer, str) for key, answer in record["predictions"].items()):
        raise TypeError("a prediction that is not a string")
    float(record["seconds"])


def _settings(args: argparse.Namespace, reader: DilBertReader, settings: ReadingSettings) -> dict[str, Any]:
    """What decides the answers of a part, recorded in the journal: a journal of other settings (another file,
    subset, reader or reading option) is not taken for this run's."""
    from dilstore.reader.modeling.fingerprint import weights_sha256

    return {"command": "evaluate-rc", "data_sha256": sha256_file(args.data),
            "limit": args.limit, "seed": subset_seed(args), "part_questions": PART_QUESTIONS, "k": reader.layers,
            "weights_sha256": weights_sha256(reader), "reading": dataclasses.asdict(settings)}  # fmt: skip


def _kept_answers(journal: Journal | None) -> int:
    """How many questions' answers the journal holds: those a run goes on from, or a stopped one kept."""
    return 0 if journal is None else sum(len(part["predictions"]) for part in journal.parts.values())


def _stopped(interrupt: KeyboardInterrupt, journal: Journal | None) -> StoppedBySignal:
    """The stop, saying how many questions' answers are kept."""
    kept = _kept_answers(journal)
    return stopped_keeping(interrupt, journal, f"the answers of {kept:,} questions" if kept else None)


def score(args: argparse.Namespace) -> int:
    """`--score PREDICTIONS`: the official EM/F1 of a prediction file over --data (or its --limit subset)."""
    from dilstore.reader.evaluation.squad_scoring import score_predictions_file

    given = [flag for flag, value in (("--model", args.model), ("--predictions", args.predictions)) if value]
    if given:
        raise DilstoreError(f"--score scores a prediction file and runs no reader: leave out {' and '.join(given)}")
    result = score_predictions_file(args.data, args.score, args.limit, subset_seed(args))
    if result["unanswered"] == result["questions"]:  # a file for another dataset, or ids it was not written with
        raise DilstoreError(f"{args.score}: none of its predictions is for a question of {args.data}")
    summary = {"questions": result["questions"], "em": result["exact_match"], "f1": result["f1"],
               "unanswered": result["unanswered"]}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"predictions {args.score}  questions {summary['questions']}  EM {summary['em']:.3f}  "
              f"F1 {summary['f1']:.3f}  (unanswered {summary['unanswered']}, scored 0)")
    return 0
