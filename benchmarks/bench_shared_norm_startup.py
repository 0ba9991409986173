"""Start-up of a shared-normalisation run: its question groups built with batched tokenization or one call per text.

`train qa --shared-norm` cuts every training question's answer window and the first window of each of its
BM25-negative paragraphs before its first step. On a lent H200 that start-up took ~60 s of every call (each call
that resumes a run pays it again), most of it in tokenizer calls: one per window for the question and one per
paragraph. `shared_norm_groups` now tokenizes every question and paragraph once, in batches; the reference here is
the same groups built with one call per text, as before (`question_features` per window, each paragraph's pieces
kept for its later windows). Both are timed on the first --questions training questions, side by side, and checked
to give the same windows.

    .venv/bin/python benchmarks/bench_shared_norm_startup.py --train ../shared/data/squad/train-v1.1.json \\
        --triples /work/runs/ranking-data-full/triples.jsonl.gz --questions 87599

Prints a table, then the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dilstore.reader.data.qa_features import QAFeature, question_features
from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE, read_paragraphs, read_triples
from dilstore.reader.data.shared_norm import shared_norm_groups
from dilstore.reader.data.squad import SquadExample, load_squad
from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.text.tokenization import TokenizedText, passage_pieces
from dilstore.reader.training.qa import TrainingConfig
from dilstore.runners.arg_types import positive_int


def groups_one_call_per_text(
    tokenizer: Any, examples: Sequence[SquadExample], triples_file: Path, negatives: int, windowing: TrainingConfig
) -> list[list[QAFeature]]:
    """The groups as built before batching: the question tokenized per window, each paragraph on first use."""
    paragraphs = read_paragraphs(triples_file.parent / PARAGRAPHS_FILE)
    triples = {triple.qid: triple for triple in read_triples(triples_file, paragraphs, triples_file, negatives)}
    pieces: dict[str, TokenizedText] = {}
    sizes = {key: getattr(windowing, key) for key in ("max_seq_length", "doc_stride", "max_question_length")}

    def windows(example: SquadExample, context: str, labelled: bool) -> list[QAFeature]:
        if context not in pieces:
            pieces[context] = passage_pieces(tokenizer, context)
        answer = example.answers[0] if labelled and example.answers else None
        return question_features(
            tokenizer, example.id, example.question, context, answer, pieces=pieces[context], **sizes
        )

    groups = []
    for example in examples:
        answer_windows = [window for window in windows(example, example.context, True) if window.has_answer]
        if answer_windows:
            negative = [windows(example, paragraphs[pid], False)[0] for pid in triples[example.id].negatives]
            groups.append([answer_windows[0], *negative])
    return groups


def same_windows(left: list[list[QAFeature]], right: list[list[QAFeature]]) -> bool:
    """Both give the same groups: the same windows' ids, labels and tokens, in order."""

    def key(window: QAFeature) -> tuple:
        return (window.example_id, window.window_index, window.start_position, window.end_position,
                window.question.token_ids.tobytes(), window.passage.token_ids.tobytes())  # fmt: skip

    return [list(map(key, group)) for group in left] == [list(map(key, group)) for group in right]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=Path, required=True, help="SQuAD v1.1 train JSON")
    parser.add_argument("--triples", type=Path, required=True, help="triples.jsonl.gz of `dilstore train ranking-data`")
    parser.add_argument("--questions", type=positive_int, default=8000, help="the first N training questions")
    parser.add_argument("--negatives", type=positive_int, default=3)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    examples = load_squad(args.train)[: args.questions]
    windowing = TrainingConfig(layers=0)
    timed: dict[str, tuple[float, list[list[QAFeature]]]] = {}
    for name, build in (
        ("one call per text (before)", lambda: groups_one_call_per_text(
            tokenizer, examples, args.triples, args.negatives, windowing)),
        ("batched (now)", lambda: shared_norm_groups(
            tokenizer, examples, args.triples, args.triples.parent / PARAGRAPHS_FILE, args.negatives, windowing)),
    ):  # fmt: skip
        started = time.perf_counter()
        groups = build()
        timed[name] = (time.perf_counter() - started, groups)
    (before, reference), (_, batched) = timed.values()
    if not same_windows(reference, batched):
        print("the batched groups differ from the reference's", file=sys.stderr)
        return 1
    rows = [
        {"path": name, "questions": len(examples), "groups": len(groups), "seconds": round(seconds, 2),
         "speed_up": round(before / seconds, 2)}
        for name, (seconds, groups) in timed.items()
    ]  # fmt: skip
    print(f"{'path':<28} {'questions':>9} {'groups':>7} {'seconds':>8} {'speed-up':>8}")
    for row in rows:
        print(f"{row['path']:<28} {row['questions']:>9} {row['groups']:>7} {row['seconds']:>8.2f} "
              f"{row['speed_up']:>7.2f}×")  # fmt: skip
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
