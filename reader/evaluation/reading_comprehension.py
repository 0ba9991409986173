"""Reading-comprehension evaluation: each SQuAD question read against its own gold paragraph.

This is the seed's extractive QA setting (Figure 3): the paragraph is split
into sliding windows exactly as for training (reader/data/qa_features.py), every
window is scored by the reader's full delayed-interaction forward pass, the
best span of each window comes from the n-best decoder (reader/serving/decode.py,
score (s_start + s_end) / 2, comparable across windows), and the best span
over all windows of a question is its answer. EM/F1 are the official SQuAD
v1.1 metric (reader/evaluation/squad_metric.py), the same code the open-domain reader
reports with.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from dilstore.reader.batching import pad_id
from dilstore.reader.data.qa_batches import QABatch, collate_features
from dilstore.reader.data.qa_features import (
    DEFAULT_MAX_QUESTION_LENGTH,
    DEFAULT_MAX_SEQ_LENGTH,
    QAFeature,
    window_features,
)
from dilstore.reader.data.squad import SquadExample
from dilstore.reader.evaluation.squad_metric import evaluate_examples
from dilstore.reader.evaluation.squad_scoring import chosen_questions, require_answers
from dilstore.reader.modeling.checkpoints import EVALUATION_FILE
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.progress_lines import bar_options, steady_bar
from dilstore.reader.serving.decode import DEFAULT_MAX_ANSWER_LENGTH, best_spans
from dilstore.reader.text.tokenization import DEFAULT_STRIDE
from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.checks import require_at_least_one
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError

# Scores a padded batch: start and end logits, each (b, nq + np) over [question ; passage].
Scorer = Callable[[QABatch], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class ReadingSettings:
    """How questions and paragraphs are windowed and answers decoded (run_squad's defaults)."""

    batch_size: int = 32
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    doc_stride: int = DEFAULT_STRIDE
    max_question_length: int = DEFAULT_MAX_QUESTION_LENGTH
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH

    def __post_init__(self) -> None:
        require_at_least_one({name: getattr(self, name) for name in ("batch_size", "max_answer_length")})


@dataclass(frozen=True)
class ReadingResult:
    """EM/F1 in percent over `questions` questions, the reader's k, wall seconds, and the answers; the reading
    settings, and the SQuAD file and its SHA-256 when one was read (`evaluate_file`), say what was measured."""

    questions: int
    em: float
    f1: float
    k: int
    seconds: float
    predictions: dict[str, str] = field(repr=False)
    settings: ReadingSettings = field(default_factory=ReadingSettings)
    data_file: str | None = None
    data_sha256: str | None = None

    def summary(self) -> dict[str, Any]:
        """What `evaluate-rc --json` prints."""
        reading = {name: value for name, value in asdict(self.settings).items() if name != "batch_size"}
        data = {} if self.data_file is None else {"data": {"file": self.data_file, "sha256": self.data_sha256}}
        return {
            "questions": self.questions,
            "em": self.em,
            "f1": self.f1,
            "k": self.k,
            "seconds": round(self.seconds, 2),
            "reading": reading,
            **data,
        }


def batch_plan(features: Sequence[QAFeature], settings: ReadingSettings) -> tuple[list[list[int]], list[int]]:
    """How `predict_answers` batches `features` (indices, by passage length to keep padding small) and the padded
    tokens of each batch, which a progress bar counts: batches go shortest first, so a count of batches put the time
    left at a third to a half of what it was (longrun45 F3)."""
    order = sorted(range(len(features)), key=lambda index: len(features[index].passage))
    batches = [order[i : i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]
    costs = [len(indices) * (max(len(features[index].question) for index in indices)
                             + max(len(features[index].passage) for index in indices)) for indices in batches]
    return batches, costs


def predict_answers(
    features: Sequence[QAFeature],
    scorer: Scorer,
    settings: ReadingSettings,
    pad_token_id: int,
    progress: bool = False,
    advance: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """The best-scoring span over all windows of each question: {question id: answer text}.

    Windows are batched by passage length to keep padding small (`batch_plan`); the answer does not depend on the
    batching. A question whose windows hold no valid span answers "". `advance`, when given, is told each batch's
    padded tokens as it is done (a bar of the caller's), and no bar of its own is shown.
    """
    best: dict[str, tuple[float, str]] = {feature.example_id: (float("-inf"), "") for feature in features}
    batches, costs = batch_plan(features, settings)
    with steady_bar(tqdm)(total=sum(costs), disable=not progress or advance is not None, unit="token", unit_scale=True,
              desc="reading", **bar_options()) as bar:  # fmt: skip
        for indices, cost in zip(batches, costs, strict=True):
            chunk = [features[index] for index in indices]
            batch = collate_features(chunk, pad_token_id)
            start_logits, end_logits = scorer(batch)  # each (b, nq + np)
            question_width = batch.question_ids.shape[1]
            start_passage = start_logits[:, question_width:].float().cpu().numpy()  # (b, np)
            end_passage = end_logits[:, question_width:].float().cpu().numpy()  # (b, np)
            for row, feature in enumerate(chunk):
                length = len(feature.passage)
                spans = best_spans(
                    start_passage[row, :length],
                    end_passage[row, :length],
                    feature.passage.char_spans,
                    n_best=1,
                    max_answer_length=settings.max_answer_length,
                )
                if spans and spans[0].score > best[feature.example_id][0]:
                    top = spans[0]
                    best[feature.example_id] = (top.score, feature.context[top.char_start : top.char_end])
            (advance or bar.update)(cost)
    return {question_id: text for question_id, (_, text) in best.items()}


def reader_scorer(reader: DilBertReader, device: torch.device) -> Scorer:
    """The reader's full forward pass (the training path) as a Scorer, without gradients."""

    def score(batch: QABatch) -> tuple[torch.Tensor, torch.Tensor]:
        batch = batch.to(device)
        with torch.inference_mode():
            return reader(batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask)

    return score


def evaluate_reader(
    reader: DilBertReader,
    examples: Sequence[SquadExample],
    settings: ReadingSettings = ReadingSettings(),
    device: str | torch.device | None = None,
    progress: bool = False,
    parts: ReadingParts | None = None,
) -> ReadingResult:
    """Answer every example against its own paragraph and score with the official SQuAD v1.1 EM/F1.

    With `parts`, the examples are read `parts.questions` at a time, each part's answers handed to `parts.on_part`
    as it is done, and the parts in `parts.kept` (an earlier run's) are not read again: a stopped run goes on.
    """
    if not examples:
        raise DilstoreError("no questions to evaluate")
    require_answers(examples)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    reader.to(device).eval()
    started = time.perf_counter()
    parts = parts or ReadingParts(questions=len(examples))
    kept = dict(parts.kept)  # as given: `on_part` may keep each part in the same mapping (a journal's), review45c F1
    chunks = [examples[first : first + parts.questions] for first in range(0, len(examples), parts.questions)]
    # Every window of every question to read, unlabelled: answers are never shown to the reader.
    features = {number: window_features(reader.tokenizer, chunk, settings, labelled=False)
                for number, chunk in enumerate(chunks) if number not in kept}  # fmt: skip
    total = sum(sum(batch_plan(part, settings)[1]) for part in features.values())
    predictions: dict[str, str] = {}
    with steady_bar(tqdm)(total=total, disable=not progress, unit="token", unit_scale=True, desc="reading",
              **bar_options()) as bar:  # fmt: skip
        for number in range(len(chunks)):
            if number in kept:
                predictions.update(kept[number]["predictions"])
                continue
            part_started = time.perf_counter()
            answers = predict_answers(features[number], reader_scorer(reader, device), settings,
                                      pad_id(reader.tokenizer), advance=bar.update)  # fmt: skip
            predictions.update(answers)
            if parts.on_part is not None:
                parts.on_part(number, {"predictions": answers, "seconds": time.perf_counter() - part_started})
    scores = evaluate_examples(examples, predictions)
    return ReadingResult(
        questions=int(scores["questions"]),
        em=scores["exact_match"],
        f1=scores["f1"],
        k=reader.layers,
        seconds=time.perf_counter() - started + sum(part["seconds"] for part in kept.values()),
        predictions=predictions,
        settings=settings,
    )


@dataclass(frozen=True)
class ReadingParts:
    """How `evaluate_reader` reads its examples in parts: `questions` a part; `kept`, part number -> the record an
    earlier run's `on_part` was given ({"predictions", "seconds"}); `on_part(number, record)` after each part."""

    questions: int
    kept: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    on_part: Callable[[int, dict[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        require_at_least_one({"questions": self.questions})


def evaluate_file(
    reader: DilBertReader,
    path: Path,
    settings: ReadingSettings = ReadingSettings(),
    limit: int | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    progress: bool = False,
    parts: ReadingParts | None = None,
) -> ReadingResult:
    """`evaluate_reader` over a SQuAD v1.1 file, or a seeded subset of `limit` of its questions.

    The file is read twice, to load it and for its checksum (the result's `data_sha256`), so a pipe, which the
    second read found empty, is refused (qa48 H1).
    """
    if Path(path).exists() and not Path(path).is_file():
        raise DilstoreError(f"{path}: not a regular file (a folder, or a pipe, which can be read only once while the "
                            "file is read again for its checksum); give a file")
    return evaluate_chosen(reader, path, chosen_questions(path, limit, seed), settings, device, progress, parts)


def evaluate_chosen(
    reader: DilBertReader,
    path: Path,
    chosen: Sequence[SquadExample],
    settings: ReadingSettings = ReadingSettings(),
    device: str | torch.device | None = None,
    progress: bool = False,
    parts: ReadingParts | None = None,
) -> ReadingResult:
    """`evaluate_reader` over `chosen`, the questions `chosen_questions` took from the SQuAD file at `path`, with
    that file and its checksum recorded: `evaluate-rc` reads them before torch loads (left61 F2)."""
    result = evaluate_reader(reader, chosen, settings, device, progress, parts)
    return replace(result, data_file=str(path), data_sha256=sha256_file(Path(path)))


def write_evaluation(
    output_dir: Path, result: ReadingResult, *, limit: int | None, seed: int, training: dict[str, Any]
) -> Path:
    """eval-dev.json in a run directory: the scores, the subset used, and the training budget (for the k sweep)."""
    document = {**training, **result.summary(), "limit": limit, "seed": seed if limit is not None else None}
    path = Path(output_dir) / EVALUATION_FILE
    atomic_write_text(path, json.dumps(document, indent=1))
    return path
