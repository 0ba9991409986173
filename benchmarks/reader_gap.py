"""Where one reader loses F1 against another: per-question SQuAD F1 of two prediction files, in buckets.

A k = 4 reader trails its k = 0 teacher by a few F1 points. Whether that gap sits in a few kinds of question
(long contexts read in several windows, answers far into the passage, one question word) or is spread over all
of them decides the lever: a decoding or windowing fix for the first, more training for the second. Write both
readers' predictions for the same questions, then compare them:

    .venv/bin/dilstore evaluate-rc --model K0 --data ../shared/data/squad/dev-v1.1.json --limit 2000 --seed 0 \\
        --predictions /tmp/k0.json
    .venv/bin/dilstore evaluate-rc --model K4 --data ../shared/data/squad/dev-v1.1.json --limit 2000 --seed 0 \\
        --predictions /tmp/k4.json
    .venv/bin/python benchmarks/reader_gap.py ../shared/data/squad/dev-v1.1.json /tmp/k0.json /tmp/k4.json \\
        --tokenizer K4

Each question is scored with the official v1.1 F1 (best over its references). Its buckets: the question word,
the gold answer's length and first token offset in the context, and the context's length, all in tokens of
--tokenizer. A bucket's share is its part of the summed per-question gap (so the shares add up to 1). Prints
one table per kind of bucket, then everything as JSON.

Whether a gap is more than the choice of questions: the summary also gives a paired bootstrap 95% interval of
the gap (the questions resampled with replacement, --resamples times, both readers' scores kept together) and how
many questions each reader scores higher on. An interval that holds 0 means these questions cannot tell the two
readers apart.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dilstore.reader.data.squad import SquadExample, load_predictions, load_squad
from dilstore.reader.evaluation.squad_metric import f1, metric_max_over_ground_truths
from dilstore.runners.arg_types import numpy_seed
from dilstore.storage.errors import DilstoreError

QUESTION_WORDS = ("how many", "how much", "what", "who", "when", "where", "which", "why", "how")


@dataclass(frozen=True)
class ScoredQuestion:
    """One question's F1 under both readers (0–100) and what it is bucketed by."""

    f1_a: float
    f1_b: float
    same_answer: bool
    question_word: str
    answer_tokens: int
    answer_offset: int
    context_tokens: int


def question_word(question: str) -> str:
    """The one of QUESTION_WORDS that comes first in the question ("how many" before "how"), else "other".

    Words are runs of letters, so "Who," and "What's" count.
    """
    words = re.findall(r"[a-z]+", question.lower())
    for position, word in enumerate(words):
        pair = " ".join(words[position : position + 2])
        if pair in QUESTION_WORDS:
            return pair
        if word in QUESTION_WORDS:
            return word
    return "other"


def per_question_f1(
    examples: Sequence[SquadExample],
    predictions_a: dict[str, str],
    predictions_b: dict[str, str],
    count_tokens: Callable[[str], int],
) -> list[ScoredQuestion]:
    """Both readers' F1 for every question the prediction files answer; they must answer the same questions."""
    if predictions_a.keys() != predictions_b.keys():
        only = sorted(predictions_a.keys() ^ predictions_b.keys())
        raise DilstoreError(f"the prediction files answer different questions, e.g. {only[0]!r} ({len(only)} differ)")
    known = {example.id for example in examples}
    unknown = sorted(predictions_a.keys() - known)
    if unknown:
        raise DilstoreError(f"question {unknown[0]!r} is not in the dataset ({len(unknown)} such ids)")
    scored = []
    for example in examples:
        if example.id not in predictions_a or not example.answers:
            continue
        truths = [answer.text for answer in example.answers]
        first = min(example.answers, key=lambda answer: answer.answer_start)
        a, b = predictions_a[example.id], predictions_b[example.id]
        scored.append(
            ScoredQuestion(
                f1_a=100 * metric_max_over_ground_truths(f1, a, truths),
                f1_b=100 * metric_max_over_ground_truths(f1, b, truths),
                same_answer=a == b,
                question_word=question_word(example.question),
                answer_tokens=count_tokens(first.text),
                answer_offset=count_tokens(example.context[: first.answer_start]),
                context_tokens=count_tokens(example.context),
            )
        )
    if not scored:
        raise DilstoreError("no question of the dataset has a prediction in both files")
    return scored


def range_labels(edges: Sequence[int]) -> list[str]:
    """The labels of the ranges that ascending upper bounds `edges` cut counts (0 and up) into, in order."""
    labels, low = [], 0
    for edge in edges:
        labels.append(str(edge) if low == edge else f"<={edge}" if low == 0 else f"{low}-{edge}")
        low = edge + 1
    return [*labels, f">{edges[-1]}"]


def length_bucket(value: int, edges: Sequence[int]) -> str:
    """The label (range_labels) of the range of `edges` that holds `value`."""
    return range_labels(edges)[sum(value > edge for edge in edges)]


def by_range(
    value: Callable[[ScoredQuestion], int], edges: Sequence[int]
) -> tuple[Callable[[ScoredQuestion], str], list[str]]:
    """A BUCKETS entry for a count cut at `edges`: the question's range label, and the ranges in order."""
    return (lambda question: length_bucket(value(question), edges)), range_labels(edges)


# Per kind of bucket: the question's bucket, and the order of the rows (None: the largest bucket first).
BUCKETS: dict[str, tuple[Callable[[ScoredQuestion], str], list[str] | None]] = {
    "question word": (lambda q: q.question_word, None),
    "answer tokens": by_range(lambda q: q.answer_tokens, (1, 2, 3, 4, 5)),
    "answer offset (tokens)": by_range(lambda q: q.answer_offset, (63, 127, 255)),
    "context tokens": by_range(lambda q: q.context_tokens, (127, 191, 255, 320)),
}


def bucket_rows(
    scored: Sequence[ScoredQuestion], key: Callable[[ScoredQuestion], str], order: list[str] | None = None
) -> list[dict[str, object]]:
    """Per bucket: questions, both readers' mean F1, the gap (a − b) and the bucket's share of the summed gap.

    Rows follow `order` (labels without questions are left out), else the largest bucket comes first.
    """
    total_gap = sum(q.f1_a - q.f1_b for q in scored)
    groups: dict[str, list[ScoredQuestion]] = {}
    for question in scored:
        groups.setdefault(key(question), []).append(question)
    rows = []
    for name, members in groups.items():
        gap = sum(q.f1_a - q.f1_b for q in members)
        rows.append({
            "bucket": name,
            "questions": len(members),
            "f1_a": round(sum(q.f1_a for q in members) / len(members), 2),
            "f1_b": round(sum(q.f1_b for q in members) / len(members), 2),
            "gap": round(gap / len(members), 2),
            "share": round(gap / total_gap, 3) if total_gap else None,
        })  # fmt: skip
    if order is None:
        return sorted(rows, key=lambda row: -int(row["questions"]))
    return sorted(rows, key=lambda row: order.index(str(row["bucket"])))


def gap_interval(
    scored: Sequence[ScoredQuestion], resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """The paired bootstrap interval of the mean gap (a − b): percentiles of the gap over `resamples` resamplings
    of the questions, each question's two scores kept together (paired, so what both readers find hard cancels)."""
    if resamples < 1:
        raise DilstoreError(f"resamples must be at least 1, not {resamples}")
    gaps = np.array([q.f1_a - q.f1_b for q in scored])  # (questions,)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 100):  # 100 resamplings at a time: (100, questions) indices in memory
        stop = min(start + 100, resamples)
        means[start:stop] = gaps[rng.integers(0, len(gaps), (stop - start, len(gaps)))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def summary(scored: Sequence[ScoredQuestion], resamples: int = 2000, seed: int = 0) -> dict[str, object]:
    """Questions, both mean F1s, their gap with its paired bootstrap 95% interval, how many questions each reader
    scores higher on, and the share of questions answered identically."""
    n = len(scored)
    f1_a, f1_b = sum(q.f1_a for q in scored) / n, sum(q.f1_b for q in scored) / n
    low, high = gap_interval(scored, resamples, seed)
    return {
        "questions": n,
        "f1_a": round(f1_a, 2),
        "f1_b": round(f1_b, 2),
        "gap": round(f1_a - f1_b, 2),
        "gap_ci95": [round(low, 2), round(high, 2)],
        "a_higher": sum(q.f1_a > q.f1_b for q in scored),
        "b_higher": sum(q.f1_b > q.f1_a for q in scored),
        "same_answer_pct": round(100 * sum(q.same_answer for q in scored) / n, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the SQuAD v1.1-format JSON both readers answered")
    parser.add_argument("predictions_a", type=Path, help="reader a's {question id: answer} JSON (evaluate-rc)")
    parser.add_argument("predictions_b", type=Path, help="reader b's, for the same questions")
    parser.add_argument("--tokenizer", type=Path, required=True, help="a reader folder whose tokenizer counts tokens")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamplings of the gap (default 2000)")
    parser.add_argument("--seed", type=numpy_seed, default=0, help="seed of the bootstrap (default 0)")
    args = parser.parse_args(argv)
    if args.resamples < 1:
        parser.error(f"--resamples {args.resamples}: give 1 or more")
    if not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--tokenizer {args.tokenizer}: no tokenizer.json there; give a reader folder")
    from transformers import AutoTokenizer  # here, not at the top: `--help` and argument errors stay fast

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

    @functools.cache
    def count_tokens(text: str) -> int:
        """Tokens in `text`; remembered, because a paragraph's questions share its context."""
        return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    try:
        scored = per_question_f1(
            load_squad(args.data),
            load_predictions(args.predictions_a),
            load_predictions(args.predictions_b),
            count_tokens,
        )
    except DilstoreError as error:
        raise SystemExit(f"reader_gap: {error}") from None
    overall = summary(scored, args.resamples, args.seed)
    low, high = overall["gap_ci95"]
    print(f"{overall['questions']} questions: F1 a {overall['f1_a']:.2f}, b {overall['f1_b']:.2f}, gap "
          f"{overall['gap']:+.2f} (paired bootstrap 95%: {low:+.2f} to {high:+.2f}); a higher on "
          f"{overall['a_higher']}, b on {overall['b_higher']}; "
          f"the same answer for {overall['same_answer_pct']:.1f}%")  # fmt: skip
    tables = {name: bucket_rows(scored, key, order) for name, (key, order) in BUCKETS.items()}
    for name, rows in tables.items():
        print(f"\n{name:<24} {'questions':>9} {'F1 a':>7} {'F1 b':>7} {'gap':>7} {'share':>6}")
        for row in rows:
            share = "" if row["share"] is None else f"{row['share']:.2f}"
            print(f"{row['bucket']:<24} {row['questions']:>9} {row['f1_a']:>7.2f} {row['f1_b']:>7.2f} "
                  f"{row['gap']:>+7.2f} {share:>6}")  # fmt: skip
    print(json.dumps({"summary": overall, "buckets": tables}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
