"""The official SQuAD v1.1 evaluation: exact match and token-level F1, in percent.

Written from the published definition of the v1.1 script:
- normalisation: lowercase, drop ASCII punctuation (`string.punctuation`),
  drop the articles a/an/the as whole words, collapse whitespace;
- exact match: the normalised strings are equal;
- F1: over the normalised whitespace tokens, with the multiset (Counter)
  overlap as the number of shared tokens; 0 when nothing is shared;
- per question, the best score over its reference answers; a question
  without a prediction scores 0 but still counts.

One v1.1 quirk is kept on purpose, because published numbers depend on it:
when a normalised answer is empty (the prediction "the", say), F1 is 0 even
against an empty normalised reference, while exact match is 1. (SQuAD v2.0's
script changed this; v1.1 numbers must not.)

One step is added before the official ones: both strings are put in Unicode's
composed form (NFC). A reader's answer is a slice of the passage as stored, and
a corpus that spells `Zürich` decomposed (`Zu\u0308rich`, text from macOS) gave
the right answer EM 0 and F1 0 against a question file's composed `Zürich`
(unicode56 F3); the official data is composed throughout, so its numbers stay
(dev: EM 86.206, F1 92.196 for the BERT ensemble's predictions, with or without).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dilstore.reader.data.squad import SquadExample, parse_squad
from dilstore.storage.errors import DilstoreError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Compose (NFC), then lowercase, remove punctuation, remove articles, and collapse whitespace (in the official
    order)."""
    lowered = unicodedata.normalize("NFC", text).lower()
    without_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    without_articles = _ARTICLES.sub(" ", without_punctuation)
    return " ".join(without_articles.split())


def exact_match(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction: str, ground_truth: str) -> float:
    """Token-level F1 between the normalised answers (v1.1: 0.0 when no token is shared)."""
    prediction_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
    shared = sum((Counter(prediction_tokens) & Counter(truth_tokens)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(prediction_tokens)
    recall = shared / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def metric_max_over_ground_truths(
    metric: Callable[[str, str], float], prediction: str, ground_truths: Sequence[str]
) -> float:
    """The best score of `prediction` against any reference answer."""
    if not ground_truths:
        raise DilstoreError("a question needs at least one reference answer to be scored")
    return max(metric(prediction, truth) for truth in ground_truths)


def evaluate(dataset_json: Mapping[str, Any], predictions: Mapping[str, str]) -> dict[str, float]:
    """Score predictions (question id → answer text) against a parsed SQuAD v1.1 document.

    Returns {"exact_match", "f1"} in percent over every question of the
    dataset, "questions" (how many there are) and "unanswered" (how many had
    no prediction; they score 0).
    """
    return evaluate_examples(parse_squad(dataset_json, "the dataset"), predictions)


def evaluate_examples(examples: Iterable[SquadExample], predictions: Mapping[str, str]) -> dict[str, float]:
    """`evaluate` over already-loaded SquadExamples."""
    return score_questions(((example.id, [a.text for a in example.answers]) for example in examples), predictions)


def score_questions(
    references: Iterable[tuple[str, Sequence[str]]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """EM and F1 in percent over (question id, reference answers) pairs; a missing prediction scores 0."""
    total = unanswered = 0
    em_sum = f1_sum = 0.0
    for question_id, truths in references:
        total += 1
        if question_id not in predictions:
            unanswered += 1
            continue
        prediction = predictions[question_id]
        try:
            em_sum += metric_max_over_ground_truths(exact_match, prediction, truths)
            f1_sum += metric_max_over_ground_truths(f1, prediction, truths)
        except DilstoreError as error:
            raise DilstoreError(f"question {question_id!r}: {error}") from None
    if total == 0:
        raise DilstoreError("the dataset holds no questions to score")
    return {
        "exact_match": 100.0 * em_sum / total,
        "f1": 100.0 * f1_sum / total,
        "questions": total,
        "unanswered": unanswered,
    }
