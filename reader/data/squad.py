"""Loaders for SQuAD v1.1 JSON files, DPR-style open-domain question files and prediction files.

Every problem with a file is a DilstoreError that names the file and the
offending item (a JSON path such as `data[3].paragraphs[0].qas[2]` with the
question id, or a line number), never a KeyError or a traceback.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dilstore.reader.text.files import json_line, numbered_lines, read_json
from dilstore.reader.text.surrogates import require_unicode
from dilstore.storage.checks import require_at_least_one
from dilstore.storage.errors import DilstoreError


@dataclass(frozen=True)
class SquadAnswer:
    """One reference answer: its text and where it starts in the paragraph (a Python string offset)."""

    text: str
    answer_start: int

    @property
    def answer_end(self) -> int:
        """The character offset just after the answer."""
        return self.answer_start + len(self.text)


@dataclass(frozen=True)
class SquadExample:
    """One SQuAD question with its paragraph; the questions of a paragraph share one context string."""

    title: str
    context: str
    id: str
    question: str
    answers: tuple[SquadAnswer, ...]


@dataclass(frozen=True)
class OpenQuestion:
    """One open-domain question (DPR's `{"question", "answer": [...]}` line) and the line it came from."""

    line: int
    question: str
    answers: tuple[str, ...]


UNREAD_START = -1  # an answer's answer_start where the offsets were not read (`offsets=False`)


def load_squad(path: str | Path, *, offsets: bool = True) -> list[SquadExample]:
    """Read a SQuAD v1.1 JSON file into one SquadExample per question, in file order (`offsets`: as `parse_squad`)."""
    return parse_squad(read_json(path), str(path), offsets=offsets)


def training_questions(path: str | Path, limit: int | None = None) -> list[SquadExample]:
    """The questions `train qa` trains on: those of the SQuAD file at `path` (the first `limit` when set), each with
    an answer. Apart from the training module, which imports torch: a malformed --train file was named after torch,
    transformers and the model had loaded (left61 F2)."""
    require_at_least_one({"train_limit": limit})
    examples = load_squad(path)[:limit]
    if not examples:
        raise DilstoreError(f"{path}: no training questions")
    unanswered = [example.id for example in examples if not example.answers]
    if unanswered:  # its windows would all be labelled [CLS], teaching the reader that the answer is absent
        raise DilstoreError(f"{path}: question {unanswered[0]!r} has no answer to train on "
                            f"({len(unanswered)} such); train qa takes SQuAD v1.1 questions with answers")  # fmt: skip
    return examples


def parse_squad(document: Any, source: str, *, offsets: bool = True) -> list[SquadExample]:
    """Check a parsed SQuAD v1.1 document and turn it into SquadExamples.

    Required: `data` (a list of articles), each with `paragraphs`; each
    paragraph with `context` and `qas`; each question with `id`, `question`
    and `answers` (a list, possibly empty for a file without references);
    each answer with `text` and an integer `answer_start` such that the
    context holds exactly `text` there. An article's `title` may be missing
    (it becomes ""). Contexts may not be blank. Question ids must be
    non-empty and unique, because predictions are keyed by id. Without
    `offsets`, an answer's `answer_start` is neither required nor checked
    (UNREAD_START): the official script scores by ids and answer texts alone,
    and converted SQuAD-style sets often carry offsets that miss (qa48 L4).
    """
    data = _field(document, "data", list, source, "the document")
    examples: list[SquadExample] = []
    seen: dict[str, str] = {}
    for a, article in enumerate(data):
        where = f"data[{a}]"
        title = _field(article, "title", str, source, where, default="")
        for p, paragraph in enumerate(_field(article, "paragraphs", list, source, where)):
            where_p = f"{where}.paragraphs[{p}]"
            context = _field(paragraph, "context", str, source, where_p)
            if not context.strip():
                raise DilstoreError(f"{source}: {where_p}: the context is empty")
            for q, qa in enumerate(_field(paragraph, "qas", list, source, where_p)):
                example = _parse_question(qa, title, context, source, f"{where_p}.qas[{q}]", offsets)
                if example.id in seen:
                    raise DilstoreError(
                        f"{source}: {where_p}.qas[{q}]: question id {example.id!r} already used at {seen[example.id]}"
                    )
                seen[example.id] = f"{where_p}.qas[{q}]"
                examples.append(example)
    return examples


def load_open_questions(path: str | Path) -> list[OpenQuestion]:
    """Read a DPR-style JSONL question file: one `{"question": str, "answer": [str, ...]}` object per line.

    Blank lines are skipped; every other line must hold a non-empty question
    and at least one answer string. Errors name the file and the line.
    """
    path = Path(path)
    questions = []
    for number, line in numbered_lines(path, "a JSONL file"):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        record = json_line(line, where)
        question = _field(record, "question", str, where, "the line")
        if not question.strip():
            raise DilstoreError(f"{where}: the question is empty")
        answers = _field(record, "answer", list, where, "the line")
        if not answers or not all(isinstance(answer, str) for answer in answers):
            raise DilstoreError(f'{where}: "answer" must be a non-empty list of strings, got {_short(answers)}')
        for n, answer in enumerate(answers):
            require_unicode(answer, f'{where}: "answer"[{n}]')
            if not answer.strip():  # it equals the empty answer a refused question gets: EM 100 (qa48 M1)
                raise DilstoreError(f'{where}: "answer"[{n}] is empty')
        questions.append(OpenQuestion(line=number, question=question, answers=tuple(answers)))
    return questions


def load_predictions(path: str | Path) -> dict[str, str]:
    """Read a SQuAD prediction file: one JSON object mapping question id → predicted answer text."""
    predictions = read_json(path)
    if not isinstance(predictions, dict):
        raise DilstoreError(
            f"{path}: a prediction file must hold a JSON object (id → answer), got {_kind(predictions)}"
        )
    for question_id, answer in predictions.items():
        if not isinstance(answer, str):
            raise DilstoreError(f"{path}: the prediction for {question_id!r} must be a string, got {_short(answer)}")
    return predictions


def _parse_question(qa: Any, title: str, context: str, source: str, where: str, offsets: bool) -> SquadExample:
    """One `qas` item → SquadExample, checking every answer against the context (`offsets`) or reading its text
    alone."""
    question_id = _field(qa, "id", str, source, where)
    if not question_id:
        raise DilstoreError(f"{source}: {where}: the question id is empty")
    where = f"{where} (id {question_id!r})"
    question = _field(qa, "question", str, source, where)
    if not question.strip():
        raise DilstoreError(f"{source}: {where}: the question is empty")
    answers = []
    for n, answer in enumerate(_field(qa, "answers", list, source, where)):
        where_a = f"{where}.answers[{n}]"
        text = _field(answer, "text", str, source, where_a)
        if not text.strip():
            raise DilstoreError(f"{source}: {where_a}: the answer text is empty")
        if not offsets:
            answers.append(SquadAnswer(text=text, answer_start=UNREAD_START))
            continue
        start = _field(answer, "answer_start", int, source, where_a)
        if not 0 <= start <= len(context) - len(text):
            raise DilstoreError(
                f"{source}: {where_a}: answer_start {start} is out of range for an answer of {len(text)} "
                f"characters in a context of {len(context)}{_forms_hint(context, text, start)}"
            )
        if context[start : start + len(text)] != text:
            raise DilstoreError(
                f"{source}: {where_a}: the context at answer_start {start} reads "
                f"{context[start : start + len(text)]!r}, not the answer text {text!r}"
                f"{_forms_hint(context, text, start)}"
            )
        answers.append(SquadAnswer(text=text, answer_start=start))
    return SquadExample(title=title, context=context, id=question_id, question=question, answers=tuple(answers))


def _forms_hint(context: str, text: str, start: int) -> str:
    """"; the context is in Unicode form NFD and the answer text in NFC ..." when the answer is in the context only
    once both are composed (NFC): the two are written in no common form, or the context is not composed and composed
    it holds the answer at `start`; else "".

    A context written decomposed (`Zu\u0308rich`, as macOS tools write text) and its answers composed was refused as
    "the context at answer_start 0 reads 'Züric', not the answer text 'Zürich'", which named two texts that print
    alike and not the cause (left57 F4).

    An answer the context holds as it is written is a plain miss of answer_start: in a context written in neither
    form (`Café Zu\u0308rich`, one letter composed and one not), an ASCII answer at a wrong answer_start was told
    its context and answer "print alike" in other forms (read57 F1).
    """
    composed, answer = unicodedata.normalize("NFC", context), unicodedata.normalize("NFC", text)
    apart = not _forms(context) & _forms(text) and text not in context and answer in composed
    if not (apart or (composed != context and composed[start : start + len(answer)] == answer)):
        return ""
    return (f"; the context is in Unicode form {_named(context)} and the answer text in {_named(text)}, which print "
            "alike: write both in one form (NFC, say), with answer_start counted in it")


def _forms(text: str) -> set[str]:
    """The Unicode normalization forms `text` is written in, of NFC and NFD (both for ASCII, neither for a mix)."""
    return {form for form in ("NFC", "NFD") if unicodedata.is_normalized(form, text)}


def _named(text: str) -> str:
    """The form `text` is written in, in words: NFC first (ASCII is both)."""
    forms = _forms(text)
    return "NFC" if "NFC" in forms else "NFD" if forms else "neither NFC nor NFD"


_MISSING = object()


def _field(container: Any, key: str, kind: type, source: str, where: str, default: Any = _MISSING) -> Any:
    """container[key], checked to be of `kind` (bool is not an int) and, as a string, Unicode text (no lone
    surrogate); a DilstoreError naming source and item."""
    if not isinstance(container, dict):
        raise DilstoreError(f"{source}: {where} must be a JSON object, got {_kind(container)}")
    if key not in container:
        if default is not _MISSING:
            return default
        raise DilstoreError(f"{source}: {where} has no {key!r} key")
    value = container[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DilstoreError(f"{source}: {where}: {key!r} must be {_KIND_NAMES[kind]}, got {_short(value)}")
    if kind is str:
        require_unicode(value, f"{source}: {where}: {key!r}")
    return value


_KIND_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object"}


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    """A value's JSON text, shortened for a message."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"
