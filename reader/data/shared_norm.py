"""Question groups for shared normalisation (Clark & Gardner 2018; Multi-passage BERT, Wang et al. 2019).

A reader trained one window at a time learns span scores that are only
comparable within a window: open-domain QA then picks spans from the wrong
passage when it reads many (μ = 1). Shared normalisation trains
each question against several paragraphs at once, with one softmax over the
passage tokens of all of them, so that a span's score also says how much
better its paragraph is than the others.

A group is one question's windows, answer window first:

    window 0     the first window of the question's own paragraph that holds the whole answer (labelled)
    windows 1..N the first window of each of its first N BM25 negative paragraphs (unlabelled)

The negatives are those of `dilstore train ranking-data` (triples.jsonl.gz:
each question's non-gold BM25 paragraphs from the project's index over the
SQuAD-train paragraphs; paragraphs.jsonl.gz beside it), matched to the
training questions by id. A question whose answer no window holds whole is
left out, as run_squad leaves such windows unlabelled; a training question
with no triple is an error naming it (build the triples with the same limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dilstore.reader.data.qa_features import QAFeature, Windowing, question_features
from dilstore.reader.data.ranking_files import read_paragraphs, read_triples
from dilstore.reader.data.squad import SquadExample
from dilstore.reader.text.tokenization import TokenizedText, encode_questions, passage_pieces_many
from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def shared_norm_groups(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[SquadExample],
    triples_file: Path,
    paragraphs_file: Path,
    negatives: int,
    windowing: Windowing,
) -> list[list[QAFeature]]:
    """One group of 1 + `negatives` windows per training question whose answer a window holds (module docstring)."""
    if negatives < 1:
        raise DilstoreError(f"shared normalisation needs at least 1 negative paragraph per question, got {negatives}")
    paragraphs = read_paragraphs(paragraphs_file)
    triples = {triple.qid: triple for triple in read_triples(triples_file, paragraphs, paragraphs_file, negatives)}
    for example in examples:
        if example.id not in triples:
            raise DilstoreError(
                f"question {example.id!r} has no triple in {triples_file}: build the triples for the same "
                "training questions (`dilstore train ranking-data` with the same --limit)"
            )
    # Every paragraph and question tokenized once, in batches: per-text calls were most of a run's start-up.
    contexts = list(dict.fromkeys(
        context for example in examples
        for context in (example.context, *(paragraphs[pid] for pid in triples[example.id].negatives))
    ))  # fmt: skip
    pieces = dict(zip(contexts, passage_pieces_many(tokenizer, contexts)))
    questions = encode_questions(tokenizer, [example.question for example in examples], windowing.max_question_length)

    def windows(example: SquadExample, question: TokenizedText, context: str, labelled: bool) -> list[QAFeature]:
        answer = example.answers[0] if labelled and example.answers else None
        return question_features(
            tokenizer, example.id, example.question, context, answer, pieces=pieces[context],
            encoded_question=question, max_seq_length=windowing.max_seq_length, doc_stride=windowing.doc_stride,
            max_question_length=windowing.max_question_length,
        )  # fmt: skip

    groups = []
    for example, question in zip(examples, questions):
        own = windows(example, question, example.context, True)
        answer_windows = [feature for feature in own if feature.has_answer]
        if not answer_windows:
            continue
        negatives_of = triples[example.id].negatives
        negative_windows = [windows(example, question, paragraphs[pid], False)[0] for pid in negatives_of]
        groups.append([answer_windows[0], *negative_windows])
    if not groups:
        raise DilstoreError(f"no training question has its answer inside a window ({len(examples)} questions)")
    return groups
