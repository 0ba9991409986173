"""Open-domain QA evaluation (`dilstore evaluate-qa`): EM, F1 and R over a question file.

- **Questions:** DPR-style JSONL (`{"question", "answer": [...]}` per line,
  the OpenSQuAD topics) or SQuAD v1.1 JSON (every question with its reference
  answers; the paragraphs are not given to the reader).
- **EM and F1:** the official SQuAD v1.1 metric (reader/evaluation/squad_metric.py),
  best over the reference answers, in percent over every question.
- **R:** the percentage of questions for which some reference answer occurs
  in one of the top-p retrieved passages, as DPR, BERTserini and pyserini
  count it (`pyserini.eval.evaluate_dpr_retrieval.has_answers`): both texts
  NFD-normalised and cut into lower-cased tokens by DPR's SimpleTokenizer,
  whose tokens split at punctuation, and the answer's tokens found as a run
  of the passage's ("1" does not match inside "1882", "11" does inside
  "11-year"). Until 2026-11-29 the match was made on SQuAD-normalised text,
  which deletes punctuation and so missed "11" in "11-year" or "Manning" in
  "Manning's": R ran 0.8 points lower than this definition on the full
  OpenSQuAD dev set (BENCHMARKS.md).
- **μ:** reading does not depend on μ, so one pass of the model is scored
  under every requested μ (the seed reports μ = 1, reader only, and μ = 0.5).

A question the reader refuses (longer than its question limit, or blank,
which a question file cannot hold: `OpenDomainReader.tokenize_question`)
counts as answered with "" and not recalled, and is counted in `refused`.
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyserini.eval.evaluate_dpr_retrieval import SimpleTokenizer

from dilstore.reader.evaluation.questions import QAQuestion
from dilstore.reader.evaluation.squad_metric import exact_match, f1, metric_max_over_ground_truths
from dilstore.reader.serving.answers import STAGES, Reading, Timings, aggregate, check_mu, checked_top_p
from dilstore.reader.serving.odqa import OpenDomainReader, PassageSource
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.errors import DilstoreError

DEFAULT_QUESTION_BATCH = 8
READER_ONLY_MU = 1.0


def answer_in_text(answer_tokens: str, text_tokens: str) -> bool:
    """Whether an answer's `recall_tokens` occur as a run of a text's (an answer without tokens never does)."""
    return bool(answer_tokens) and f" {answer_tokens} " in f" {text_tokens} "


def recall_tokens(text: str, tokenizer: SimpleTokenizer) -> str:
    """`text` as `has_answers` sees it: NFD-normalised, DPR's lower-cased tokens, joined by single spaces.

    No token holds a space, so a run of tokens is a run of this string between spaces.
    """
    return " ".join(tokenizer.tokenize(unicodedata.normalize("NFD", text)).words(uncased=True))


@dataclass
class _Totals:
    """Running sums of one μ's scores."""

    em: float = 0.0
    f1: float = 0.0


@dataclass
class QAEvaluation:
    """Scores of one evaluation run (percentages), with the per-stage time of the model pass."""

    questions: int
    top_p: int
    mu: float
    scores: dict[float, tuple[float, float]]  # μ → (EM, F1)
    recall: float
    refused: int
    seconds: float
    timings: Timings
    predictions: dict[str, dict[str, str]] = field(repr=False)  # question id → {str(μ): answer}
    online_variant: str | None = None  # the packaged online layers the reader used for the store's encoding
    encoding: str = ""  # the store's encoding (fp16, 2bit, ...): what the passage states were read from
    refused_ids: list[str] = field(default_factory=list, repr=False)  # the refused questions, which score 0

    @property
    def em(self) -> float:
        """Exact match under the run's μ, in percent of all questions (a refused one scores 0)."""
        return self.scores[self.mu][0]

    @property
    def f1(self) -> float:
        """Token F1 under the run's μ, in percent, averaged over all questions (a refused one scores 0)."""
        return self.scores[self.mu][1]

    def summary(self) -> dict[str, Any]:
        """The `evaluate-qa --json` document: the issue's keys, then every μ scored and the stage times."""
        return {
            "questions": self.questions,
            "em": self.em,
            "f1": self.f1,
            "recall": self.recall,
            "top_p": self.top_p,
            "mu": self.mu,
            "seconds": self.seconds,
            "by_mu": [{"mu": mu, "em": em, "f1": f1_} for mu, (em, f1_) in sorted(self.scores.items(), reverse=True)],
            "refused": self.refused,
            "timings": self.timings.to_dict(),
            "online_variant": self.online_variant,
            "encoding": self.encoding,
        }

    def to_record(self) -> dict[str, Any]:
        """Everything of this evaluation as JSON values (`from_record` reads it back): a part of a long run kept on
        disk as it is done (runners/journal.py)."""
        return {"questions": self.questions, "top_p": self.top_p, "mu": self.mu, "recall": self.recall,
                "scores": [[mu, em, f1_] for mu, (em, f1_) in self.scores.items()], "refused": self.refused,
                "seconds": self.seconds, "timings": {stage: getattr(self.timings, stage) for stage in STAGES},
                "predictions": self.predictions, "online_variant": self.online_variant,
                "encoding": self.encoding, "refused_ids": self.refused_ids}  # fmt: skip

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> QAEvaluation:
        """The evaluation `to_record` wrote."""
        scores = {float(mu): (float(em), float(f1_)) for mu, em, f1_ in record["scores"]}
        return cls(**{**record, "scores": scores, "timings": Timings(**record["timings"])})


def merged_evaluation(parts: Sequence[QAEvaluation], questions: Sequence[QAQuestion]) -> QAEvaluation:
    """One evaluation of `questions` from `parts`, which evaluated them in turn (disjoint, in order, with one top-p
    and μ): EM and F1 scored again from the predictions in question order, as one run sums them (an average of the
    parts' percentages differed in the last digit, review45 L2; a refused question scores 0, as in one run),
    R from the parts' counts, and counts, seconds and stage times summed."""
    if not parts:
        raise DilstoreError("there are no evaluated questions to merge")
    predictions = {key: value for part in parts for key, value in part.predictions.items()}
    refused = {question_id for part in parts for question_id in part.refused_ids}
    totals = {mu: _Totals() for mu in parts[0].scores}
    for question in questions:
        if question.id in refused:  # 0, as in one run, even for an answer that normalises to "" ("."): review48b B5
            continue
        for mu, total in totals.items():
            answer = predictions[question.id][str(mu)]
            total.em += metric_max_over_ground_truths(exact_match, answer, question.answers)
            total.f1 += metric_max_over_ground_truths(f1, answer, question.answers)
    timings = Timings()
    for part in parts:
        _add_timings(timings, part.timings)
    recalled = sum(round(part.recall * part.questions / 100) for part in parts)
    return replace(
        parts[0],
        questions=len(questions),
        scores={mu: (100.0 * total.em / len(questions), 100.0 * total.f1 / len(questions))
                for mu, total in totals.items()},  # fmt: skip
        recall=100.0 * recalled / len(questions),
        refused=sum(part.refused for part in parts),
        refused_ids=[question.id for question in questions if question.id in refused],
        seconds=sum(part.seconds for part in parts),
        timings=timings,
        predictions=predictions,
    )


class AnswerRecall:
    """R's test of one question (`recalled`), each passage's `recall_tokens` computed once for the whole run."""

    def __init__(self) -> None:
        self._tokenizer = SimpleTokenizer()
        self._texts: dict[str, str] = {}

    def recalled(self, passages: Mapping[str, str], answers: Sequence[str]) -> bool:
        """Whether some answer occurs in some passage (`passages`: passage id → text, ids naming one text each)."""
        answer_tokens = [recall_tokens(answer, self._tokenizer) for answer in answers]
        for passage_id, text in passages.items():
            if passage_id not in self._texts:
                self._texts[passage_id] = recall_tokens(text, self._tokenizer)
            if any(answer_in_text(answer, self._texts[passage_id]) for answer in answer_tokens):
                return True
        return False


def evaluate_questions(
    odqa: OpenDomainReader[PassageSource],
    questions: Sequence[QAQuestion],
    *,
    top_p: int,
    mu: float,
    question_batch: int = DEFAULT_QUESTION_BATCH,
    on_batch: Callable[[int], None] | None = None,
) -> QAEvaluation:
    """Answer every question from the store and score it under μ = 1 and `mu` (see `evaluate_top_ps`)."""
    return evaluate_top_ps(
        odqa, questions, top_ps=[top_p], mu=mu, question_batch=question_batch, on_batch=on_batch
    )[top_p]


def evaluate_top_ps(
    odqa: OpenDomainReader[PassageSource],
    questions: Sequence[QAQuestion],
    *,
    top_ps: Sequence[int],
    mu: float,
    question_batch: int = DEFAULT_QUESTION_BATCH,
    on_batch: Callable[[int], None] | None = None,
) -> dict[int, QAEvaluation]:
    """Score every question under μ = 1 and `mu` for each top-p, from one retrieval and reading at the largest.

    BM25's top-p is the first p of its top-max(top_ps), and each pair is read
    on its own, so a smaller p is scored from the prefix of the same reading.
    Questions are read `question_batch` at a time (their passages fetched
    once, their pairs batched together); `on_batch(n)` is told how many
    questions were done after each batch. Every run shares the model-pass
    timings and seconds.
    """
    top_ps = [checked_top_p(top_p) for top_p in top_ps]
    check_mu(mu)
    if not top_ps:
        raise DilstoreError("give at least one top-p to evaluate")
    if not questions:
        raise DilstoreError("there are no questions to evaluate")
    if question_batch < 1:
        raise DilstoreError(f"the question batch must be at least 1, got {question_batch}")
    mus = sorted({READER_ONLY_MU, float(mu)}, reverse=True)
    runs = {top_p: _Run(mus) for top_p in top_ps}
    timings = Timings()
    recall = AnswerRecall()
    started = time.perf_counter()
    accepted = []
    for question in questions:
        try:
            odqa.tokenize_question(question.question)
        except DilstoreError:
            for run in runs.values():
                run.refuse(question)
            continue
        accepted.append(question)
    done = len(questions) - len(accepted)
    for first in range(0, len(accepted), question_batch):
        batch = accepted[first : first + question_batch]
        readings = odqa.retrieve_and_read([question.question for question in batch], max(top_ps))
        _add_timings(timings, readings[0].timings)
        for question, reading in zip(batch, readings, strict=True):
            for top_p, run in runs.items():
                run.score(question, restrict(reading, top_p), recall)
        done += len(batch)
        if on_batch is not None:
            on_batch(done)
    seconds = time.perf_counter() - started
    for run in runs.values():  # refused questions were filled in first
        run.predictions = {question.id: run.predictions[question.id] for question in questions}
    return {top_p: run.result(top_p, float(mu), seconds, timings, **odqa.read_with) for top_p, run in runs.items()}


def restrict(reading: Reading, top_p: int) -> Reading:
    """The reading of only the first `top_p` hits (spans and passages of the others dropped)."""
    if top_p >= len(reading.hits):
        return reading
    hits = reading.hits[:top_p]
    kept = {hit.passage_id for hit in hits}
    return Reading(
        question=reading.question,
        hits=hits,
        passages={passage_id: passage for passage_id, passage in reading.passages.items() if passage_id in kept},
        spans=tuple(span for span in reading.spans if span.passage_id in kept),
        timings=reading.timings,
    )


class _Run:
    """Running sums of one top-p's evaluation under every μ."""

    def __init__(self, mus: Sequence[float]) -> None:
        self.mus = list(mus)
        self.totals = {mu: _Totals() for mu in self.mus}
        self.count = self.recalled = 0
        self.refused: list[str] = []
        self.predictions: dict[str, dict[str, str]] = {}

    def refuse(self, question: QAQuestion) -> None:
        self.count += 1
        self.refused.append(question.id)
        self.predictions[question.id] = {str(mu): "" for mu in self.mus}

    def score(self, question: QAQuestion, reading: Reading, recall: AnswerRecall) -> None:
        self.count += 1
        texts = {passage_id: passage.text for passage_id, passage in reading.passages.items()}
        self.recalled += recall.recalled(texts, question.answers)
        self.predictions[question.id] = {}
        for mu in self.mus:
            prediction = aggregate(reading, mu, n_best=1).text
            self.predictions[question.id][str(mu)] = prediction
            self.totals[mu].em += metric_max_over_ground_truths(exact_match, prediction, question.answers)
            self.totals[mu].f1 += metric_max_over_ground_truths(f1, prediction, question.answers)

    def result(
        self, top_p: int, mu: float, seconds: float, timings: Timings, online_variant: str | None, encoding: str
    ) -> QAEvaluation:
        return QAEvaluation(
            questions=self.count,
            top_p=top_p,
            mu=mu,
            scores={value: (100.0 * t.em / self.count, 100.0 * t.f1 / self.count) for value, t in self.totals.items()},
            recall=100.0 * self.recalled / self.count,
            refused=len(self.refused),
            seconds=seconds,
            timings=timings,
            predictions=self.predictions,
            online_variant=online_variant,
            encoding=encoding,
            refused_ids=list(self.refused),
        )


def _add_timings(total: Timings, part: Timings) -> None:
    for stage in STAGES:
        setattr(total, stage, getattr(total, stage) + getattr(part, stage))


def write_predictions(path: Path, evaluation: QAEvaluation) -> None:
    """Write {question id: {μ: answer}} as JSON, for inspecting what was scored (atomically: a kill mid-write left
    a cut file under the name, an older one emptied)."""
    try:
        text = json.dumps(evaluation.predictions, ensure_ascii=False, indent=1)
        atomic_write_text(Path(path), text, named_by_user=True)
    except OSError as error:
        raise DilstoreError(f"cannot write predictions to {path}: {error}") from error
