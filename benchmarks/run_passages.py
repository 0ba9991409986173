"""The passages a TREC run names, cut from a JSONL corpus, so a reranking store holds just what the run needs.

    .venv/bin/python benchmarks/run_passages.py --run ../shared/data/msmarco/run.dl19-passage.bm25-top100.trec \
        --corpus ../shared/data/msmarco/passages.dl19-dl20-pool.jsonl --output runs/dl19-top100.jsonl

Writes each distinct docid once, in first-seen run order, as {"id", "contents"}
(and "title" where it has one), read the way `dilstore precompute` reads the
corpus; a malformed line or a docid the corpus lacks is an error naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dilstore.pipelines.corpus_jsonl import read_jsonl
from dilstore.pipelines.documents import Document, Rejected
from dilstore.reader.data.trec import read_run
from dilstore.runners.outputs import check_output_file
from dilstore.storage.errors import DilstoreError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbours, when loaded by path
from script_errors import one_line_errors  # noqa: E402


def run_passages(run_file: Path, corpus: Path, output: Path) -> int:
    """Write the run's passages from `corpus` (read as precompute reads it) to `output`; returns how many."""
    wanted = list(dict.fromkeys(docid for ranking in read_run(run_file).values() for docid in ranking))
    needed = set(wanted)
    found: dict[str, Document] = {}
    for record in read_jsonl(corpus):
        if isinstance(record, Rejected):
            raise DilstoreError(f"{record.source}:{record.line_or_id}: {record.reason}")
        if record.id in needed:
            found.setdefault(record.id, record)  # the first of an id, as precompute keeps (it kept the last)
    missing = [docid for docid in wanted if docid not in found]
    if missing:
        raise DilstoreError(f"{corpus} lacks {len(missing)} passage(s) of {run_file}, e.g. {missing[:5]}")
    with output.open("w", encoding="utf-8") as stream:
        for docid in wanted:
            document = found[docid]
            title = {"title": document.title} if document.title else {}
            stream.write(json.dumps({"id": docid, **title, "contents": document.text}, ensure_ascii=False) + "\n")
    return len(wanted)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="TREC run: qid Q0 docid rank score tag")
    parser.add_argument("--corpus", type=Path, required=True, help='JSONL corpus of {"id", "contents"}')
    parser.add_argument("--output", type=Path, required=True, help="JSONL file to write")
    args = parser.parse_args(argv)
    check_output_file(args.output, "--output", [args.run, args.corpus])  # --output CORPUS cut the corpus
    count = run_passages(args.run, args.corpus, args.output)
    print(json.dumps({"passages": count, "output": str(args.output)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
