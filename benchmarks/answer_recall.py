"""R (answer recall of the top-p BM25 passages) of a dilbert store, by the current and the earlier definition.

`evaluate-qa` reports R as DPR, BERTserini and pyserini count it (reader/evaluation/open_domain.py): the
answer's DPR tokens as a run of a retrieved passage's. Until 2026-11-29 it matched SQuAD-normalised
text, which deletes punctuation ("11-year" became "11year") and so missed answers the passage holds.
R depends only on the retrieval, not on the reader, so this needs no model: it searches the store's BM25
index for every question (as `evaluate-qa` does, top max(p)), reads the passages' texts from the store,
and counts R at each p both ways, side by side, with the questions only one definition counts:

    .venv/bin/python benchmarks/answer_recall.py --store /work/runs/s26/mos-fp16/store \
        --questions ../shared/data/opensquad/questions.dev-v1.1.jsonl --top-p 29 100 --output /tmp/recall.json

Prints a table, then the result as JSON (also written to --output when given).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dilstore.reader.evaluation.open_domain import AnswerRecall, answer_in_text
from dilstore.reader.evaluation.questions import load_questions
from dilstore.reader.evaluation.squad_metric import normalize_answer
from dilstore.reader.evaluation.subsets import seeded_subset
from dilstore.reader.retrieval import Bm25Searcher, bm25_index_dir
from dilstore.runners.arg_types import positive_int, sample_seed
from dilstore.runners.outputs import check_output_file
from dilstore.storage.errors import DilstoreError
from dilstore.storage.reader import open_store

FETCH_BATCH = 2000


class SquadNormalisedRecall:
    """The earlier test: an answer's SQuAD-normalised text as a whole-word run of a passage's."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def recalled(self, passages: dict[str, str], answers: Sequence[str]) -> bool:
        """Whether some answer occurs in some passage (`passages`: passage id → text), the earlier way."""
        normalised = [normalize_answer(answer) for answer in answers]
        for passage_id, text in passages.items():
            if passage_id not in self._texts:
                self._texts[passage_id] = normalize_answer(text)
            if any(answer_in_text(answer, self._texts[passage_id]) for answer in normalised):
                return True
        return False


def passage_texts(store_path: Path, ids: set[str]) -> dict[str, str]:
    """The stored text of every id, read in batches."""
    store = open_store(store_path)
    ordered = sorted(ids)
    texts = {}
    for first in range(0, len(ordered), FETCH_BATCH):
        for passage in store.fetch(ordered[first : first + FETCH_BATCH]):
            texts[passage.id] = passage.text
    return texts


def main(argv: list[str] | None = None) -> int:
    """Parse the options, measure, print the table and the JSON (and write it to --output); 0, or 2 on bad input."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a dilbert store with its BM25 index")
    parser.add_argument("--index", type=Path, help="its Lucene index (default STORE/bm25)")
    parser.add_argument("--questions", type=Path, required=True, help="DPR-style JSONL or SQuAD v1.1 JSON")
    parser.add_argument("--top-p", type=positive_int, nargs="+", default=[29, 100], help="p values (default 29 100)")
    parser.add_argument("--limit", type=positive_int, help="a seeded subset of this many questions (default: all)")
    parser.add_argument("--seed", type=sample_seed, help="seed of --limit's subset (default 0)")
    parser.add_argument("--threads", type=positive_int, default=2, help="Lucene search threads (default 2)")
    parser.add_argument("--output", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    if args.seed is not None and args.limit is None:
        parser.error("--seed picks the --limit subset; give --limit too, or leave --seed out to count all")
    args.seed = 0 if args.seed is None else args.seed
    try:
        if args.output is not None:
            check_output_file(args.output, "--output", [args.questions])
        result = measure(args)
    except DilstoreError as error:
        parser.exit(2, f"answer_recall: error: {error}\n")
    print(f"{len(result['rows'])} p values over {result['questions']} questions, {result['seconds']} s")
    print(f"{'p':>5}{'R (DPR tokens)':>16}{'R (SQuAD-normalised)':>22}{'only DPR':>10}{'only SQuAD':>12}")
    for row in result["rows"]:
        print(f"{row['top_p']:>5}{row['recall_dpr']:>16.2f}{row['recall_squad_normalised']:>22.2f}"
              f"{row['only_dpr']:>10}{row['only_squad_normalised']:>12}")  # fmt: skip
    text = json.dumps(result)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Search, read the passages, and count R at every p both ways."""
    started = time.perf_counter()
    questions = seeded_subset(load_questions(args.questions), args.limit, args.seed)
    index = args.index if args.index is not None else bm25_index_dir(args.store)
    hits = Bm25Searcher(index).batch_search(
        [question.question for question in questions], [question.id for question in questions], max(args.top_p),
        args.threads,
    )  # fmt: skip
    texts = passage_texts(args.store, {hit.passage_id for found in hits.values() for hit in found})
    current, earlier = AnswerRecall(), SquadNormalisedRecall()
    rows = []
    for top_p in sorted(set(args.top_p)):
        counts = {"dpr": 0, "squad": 0, "only_dpr": 0, "only_squad": 0}
        for question in questions:
            passages = {hit.passage_id: texts[hit.passage_id] for hit in hits[question.id][:top_p]}
            dpr = current.recalled(passages, question.answers)
            squad = earlier.recalled(passages, question.answers)
            counts["dpr"] += dpr
            counts["squad"] += squad
            counts["only_dpr"] += dpr and not squad
            counts["only_squad"] += squad and not dpr
        rows.append({
            "top_p": top_p,
            "recall_dpr": 100 * counts["dpr"] / len(questions),
            "recall_squad_normalised": 100 * counts["squad"] / len(questions),
            "only_dpr": counts["only_dpr"],
            "only_squad_normalised": counts["only_squad"],
        })  # fmt: skip
    return {
        "store": str(args.store),
        "questions_file": str(args.questions),
        "questions": len(questions),
        "limit": args.limit,
        "seed": args.seed,
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }


if __name__ == "__main__":
    sys.exit(main())
