"""The passages a TREC run names, cut from a JSONL corpus, so a reranking store holds just what the run needs.

    .venv/bin/python benchmarks/run_passages.py --run ../shared/data/msmarco/run.dl19-passage.bm25-top100.trec \
        --corpus ../shared/data/msmarco/passages.dl19-dl20-pool.jsonl --output runs/dl19-top100.jsonl

Writes each distinct docid once, in first-seen run order, as the corpus line
holds it ({"id", "contents"}); a docid the corpus lacks is an error naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reader.text_lines import numbered_lines
from reader.trec import read_run
from storage.errors import DilstoreError


def run_passages(run_file: Path, corpus: Path, output: Path) -> int:
    """Write the run's passages from `corpus` to `output`; returns how many."""
    wanted = list(dict.fromkeys(docid for ranking in read_run(run_file).values() for docid in ranking))
    lines: dict[str, str] = {}
    needed = set(wanted)
    for number, line in numbered_lines(corpus):
        try:
            docid = str(json.loads(line)["id"])
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise DilstoreError(f"{corpus}:{number}: not a JSON object with an 'id' ({error})") from error
        if docid in needed:
            lines[docid] = line.strip()
    missing = [docid for docid in wanted if docid not in lines]
    if missing:
        raise DilstoreError(f"{corpus} lacks {len(missing)} passage(s) of {run_file}, e.g. {missing[:5]}")
    output.write_text("".join(lines[docid] + "\n" for docid in wanted), encoding="utf-8")
    return len(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="TREC run: qid Q0 docid rank score tag")
    parser.add_argument("--corpus", type=Path, required=True, help='JSONL corpus of {"id", "contents"}')
    parser.add_argument("--output", type=Path, required=True, help="JSONL file to write")
    args = parser.parse_args(argv)
    try:
        count = run_passages(args.run, args.corpus, args.output)
    except DilstoreError as error:
        print(f"run_passages: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"passages": count, "output": str(args.output)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
