"""Is a logit ensemble of readers a teacher worth distilling into one reader? Side by side on seeded dev questions.

A weight average of the rounds of one lineage (benchmarks/average_readers.py) is the shipped default. If the
ensemble that averages the rounds' span logits scored clearly above that weight average, distilling the
ensemble into the average would be a CPU lever for #12; if it scores about the same, that lever is closed.
Every reader reads the same windows in the same batches once; each member alone, each `--also` reader and the
ensemble (the mean of the members' start and end logits) are then decoded and scored with the official metric:

    .venv/bin/python benchmarks/ensemble_readers.py R1 R2 R3 --also SOUP \\
        --data ../shared/data/squad/dev-v1.1.json --limit 2000 --seed 0 --threads 2

Prints a table, then one JSON line. fp16 readers are scored in float32, as `dilstore evaluate-rc` scores them
on a CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from script_errors import one_line_errors

from dilstore.reader.batching import pad_id
from dilstore.reader.data.qa_batches import QABatch
from dilstore.reader.data.qa_features import window_features
from dilstore.reader.data.squad import load_squad
from dilstore.reader.evaluation.reading_comprehension import (
    ReadingSettings,
    predict_answers,
    reader_scorer,
)
from dilstore.reader.evaluation.squad_metric import evaluate_examples
from dilstore.reader.evaluation.subsets import seeded_subset
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.runners.arg_types import positive_int, sample_seed
from dilstore.storage.errors import DilstoreError

Logits = tuple[torch.Tensor, torch.Tensor]  # start and end, each (batch, question + passage tokens)


def recorded_scorer(
    readers: list[DilBertReader], members: int, record: list[list[Logits]]
) -> Callable[[QABatch], Logits]:
    """A scorer that runs every reader on a batch, appends their logits to `record` and returns the mean of the
    first `members` readers' logits (the others are only recorded)."""
    scorers = [reader_scorer(reader, torch.device("cpu")) for reader in readers]

    def score(batch: QABatch) -> Logits:
        outputs = [scorer(batch) for scorer in scorers]
        record.append([(start.float(), end.float()) for start, end in outputs])
        starts = torch.stack([start for start, _ in record[-1][:members]])  # (members, batch, tokens)
        ends = torch.stack([end for _, end in record[-1][:members]])  # (members, batch, tokens)
        return starts.mean(0), ends.mean(0)

    return score


def replayed_scorer(record: list[list[Logits]], member: int) -> Callable[[QABatch], Logits]:
    """A scorer that returns one reader's recorded logits, batch by batch in the order they were recorded.

    `predict_answers` batches the same features in the same order on every call, so the n-th batch asked for
    is the n-th recorded.
    """
    calls = iter(record)
    return lambda batch: next(calls)[member]


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("members", nargs="+", type=Path, help="reader folders whose logits are averaged")
    parser.add_argument("--also", nargs="*", type=Path, default=[], help="reader folders scored alone beside them")
    parser.add_argument("--data", type=Path, required=True, help="SQuAD v1.1 JSON")
    parser.add_argument("--limit", type=positive_int, default=2000)
    parser.add_argument("--seed", type=sample_seed, default=0)
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    paths = [*args.members, *args.also]
    readers = [DilBertReader.from_pretrained(path).float().eval() for path in paths]
    if any(reader.tokenizer.get_vocab() != readers[0].tokenizer.get_vocab() for reader in readers[1:]):
        raise DilstoreError("the readers have different vocabularies, so they cannot read the same windows")
    examples = seeded_subset(load_squad(args.data), args.limit, args.seed)
    settings = ReadingSettings()
    features = window_features(readers[0].tokenizer, examples, settings, labelled=False)
    pad = pad_id(readers[0].tokenizer)
    record: list[list[Logits]] = []
    started = time.perf_counter()
    ensemble = recorded_scorer(readers, len(args.members), record)
    rows = {f"ensemble of {len(args.members)}": predict_answers(features, ensemble, settings, pad, progress=True)}
    seconds = time.perf_counter() - started
    for member, path in enumerate(paths):
        rows[str(path)] = predict_answers(features, replayed_scorer(record, member), settings, pad)
    scores = {name: evaluate_examples(examples, predictions) for name, predictions in rows.items()}
    print(f"{'reader':<60} {'EM':>6} {'F1':>6}")
    for name, score in scores.items():
        print(f"{name:<60} {score['exact_match']:6.2f} {score['f1']:6.2f}")
    print(json.dumps({"data": str(args.data), "limit": args.limit, "seed": args.seed, "threads": args.threads,
                      "windows": len(features), "seconds": round(seconds, 1),
                      "members": [str(path) for path in args.members],
                      "scores": {name: {"em": score["exact_match"], "f1": score["f1"]}
                                 for name, score in scores.items()}}))  # fmt: skip
    return 0


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    """run(), with a DilstoreError (a missing reader or --data, readers of other vocabularies, windows longer than a
    reader's positions) as one line and exit status 2, not a traceback (bench53 F15)."""
    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
