"""Scoring a SQuAD v1.1 prediction file (`dilstore evaluate-rc --score`), which runs no reader, and the checks of a
SQuAD file's questions that reading them (reader/evaluation/reading_comprehension.py) shares.

Apart from reading_comprehension.py because that module imports torch and the reader: a prediction file was scored,
and a mistyped one named, after some 10 s of those imports (fast59 F7).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dilstore.reader.data.squad import SquadExample, load_predictions, load_squad
from dilstore.reader.evaluation.squad_metric import evaluate_examples
from dilstore.reader.evaluation.subsets import seeded_subset
from dilstore.storage.errors import DilstoreError


def require_answers(examples: Sequence[SquadExample], where: str = "") -> None:
    """A DilstoreError naming the first question without a reference answer (and how many), after `where` (a file
    and a colon: evaluate-rc named no file, longrun45 F7)."""
    missing = [example.id for example in examples if not example.answers]
    if missing:
        raise DilstoreError(f"{where}question {missing[0]!r} has no reference answer to score against "
                            f"({len(missing)} such)")  # fmt: skip


def score_predictions_file(
    path: str | Path, predictions_path: str | Path, limit: int | None = None, seed: int = 0
) -> dict[str, float]:
    """The official SQuAD v1.1 EM/F1 of a prediction file (question id → answer) over the questions of `path`, or
    the seeded subset of `limit` that `evaluate_file` reads; a question without a prediction scores 0. The data
    file is checked as `evaluate_file` checks it, its errors naming it (qa48 L2), but for the answers' offsets,
    which scoring does not read."""
    return evaluate_examples(chosen_questions(path, limit, seed, offsets=False), load_predictions(predictions_path))


def chosen_questions(path: str | Path, limit: int | None = None, seed: int = 0, *, offsets: bool = True
                     ) -> list[SquadExample]:  # fmt: skip
    """The questions of the SQuAD file at `path` that are scored: all, or the seeded subset of `limit` of them
    (`offsets`: as `load_squad`); a DilstoreError naming the file when one of them has no reference answer.
    Here, apart from the reader: `evaluate-rc` read its --data, and `train qa` checked its --dev answers, only after
    torch and the model had loaded, and `train qa` after the whole training (left61 F2)."""
    chosen = seeded_subset(questions_of(path, offsets=offsets), limit, seed)
    require_answers(chosen, f"{path}: ")
    return chosen


def questions_of(path: str | Path, *, offsets: bool = True) -> list[SquadExample]:
    """The questions of the SQuAD file at `path` (`offsets`: as `load_squad`); a DilstoreError naming it when it
    holds none."""
    examples = load_squad(path, offsets=offsets)
    if not examples:
        raise DilstoreError(f"{path}: no questions to evaluate (every paragraph's qas is empty)")
    return examples
