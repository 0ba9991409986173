"""The questions `dilstore evaluate-qa` scores: DPR-style JSONL or SQuAD v1.1 JSON, read into QAQuestions.

Apart from reader/evaluation/open_domain.py (which imports them from here) because that module imports the serving
stack (torch, transformers): `evaluate-qa` reads its question file first, and a mistyped or malformed one is named at
once, not after those libraries' import of several seconds (fast59 F1).
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

from dilstore.reader.data.squad import SquadExample, load_open_questions, load_squad
from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import path_text


@dataclass(frozen=True)
class QAQuestion:
    """One question to answer and its reference answers; `id` names it in errors and predictions."""

    id: str
    question: str
    answers: tuple[str, ...]


def load_questions(path: str | Path) -> list[QAQuestion]:
    """Questions from DPR-style JSONL (`.jsonl`, any case) or SQuAD v1.1 JSON (anything else that parses as one
    document); a DilstoreError naming the file when it holds none."""
    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        name = path_text(path.name)  # as it was, the journal and the predictions file failed on it (unicode56 F6)
        questions = [
            QAQuestion(id=f"{name}:{item.line}", question=item.question, answers=item.answers)
            for item in load_open_questions(path)
        ]
    else:
        questions = [
            QAQuestion(id=example.id, question=example.question, answers=tuple(a.text for a in example.answers))
            for example in _squad_examples(path)
        ]
    if not questions:
        raise DilstoreError(f"{path}: holds no questions")
    unanswerable = [question.id for question in questions if not question.answers]
    if unanswerable:
        raise DilstoreError(f"{path}: question {unanswerable[0]!r} has no reference answer to score against")
    return questions


def _squad_examples(path: Path) -> list[SquadExample]:
    """`load_squad(path)`; a file that fails as SQuAD JSON but opens with a question object says it looks like
    JSONL, which goes by the `.jsonl` suffix (it got a bare "not valid JSON (... Extra data)"). A pipe, read once
    already, says why it was read as SQuAD JSON (docs50 L3: `<(zcat q.jsonl.gz)` got "the document has no 'data'
    key")."""
    try:
        return load_squad(path)
    except DilstoreError as error:
        if _is_pipe(path):
            raise DilstoreError(f"{error}; read as SQuAD JSON, as its name does not end in .jsonl: to read DPR-style "
                                "JSONL from a pipe, save it to a file named .jsonl") from None  # fmt: skip
        if _opens_with_a_question_object(path):
            raise DilstoreError(f"{error}; its first line is one question object, as in DPR-style JSONL: name the "
                                "file .jsonl to read it as such") from None  # fmt: skip
        raise


def _is_pipe(path: Path) -> bool:
    """Whether `path` is a pipe (`<(zcat FILE)` is /dev/fd/N): not a missing path or a folder (review50 L1)."""
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False


def _opens_with_a_question_object(path: Path) -> bool:
    """Whether the first line of `path` is a JSON object with a "question" (a line nested past the stack is not one:
    its RecursionError ended `evaluate-qa` in a traceback, complex61)."""
    try:
        with path.open("rb") as handle:
            first = json.loads(handle.readline(1 << 20).decode("utf-8-sig"))
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return isinstance(first, dict) and "question" in first
