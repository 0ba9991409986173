"""Rebuild the embedded default corpus from the SQuAD v1.1 dev file.

    python -m pipelines.default_corpus.build ../shared/data/squad/dev-v1.1.json

Writes every paragraph of the articles in `ARTICLES`, in file order, as
`{"id", "title", "text"}` lines (ids `{article}#p{n}` as `pipelines.corpus_squad`
makes them) into a gzip file whose bytes depend only on the input.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from dilstore.pipelines.corpus_squad import read_squad
from dilstore.pipelines.default_corpus import default_corpus_path
from dilstore.pipelines.documents import Document
from dilstore.storage.errors import DilstoreError

# Whole articles, chosen for a spread of topics; together about 300 KB of text.
ARTICLES = (
    "Super_Bowl_50",
    "Nikola_Tesla",
    "Computational_complexity_theory",
    "Steam_engine",
    "Oxygen",
    "Apollo_program",
    "Amazon_rainforest",
    "Black_Death",
    "Prime_number",
    "Rhine",
)


def corpus_lines(squad_dev: Path) -> list[str]:
    """The JSONL lines of the default corpus, built from the SQuAD dev file."""
    lines = []
    for record in read_squad(squad_dev):
        if not isinstance(record, Document):
            raise DilstoreError(f"{squad_dev}: {record.line_or_id}: {record.reason}")
        if record.id.rpartition("#p")[0] in ARTICLES:
            line = {"id": record.id, "title": record.title, "text": record.text}
            lines.append(json.dumps(line, ensure_ascii=False))
    return lines


def write_corpus(lines: list[str], target: Path) -> None:
    """Gzip the lines with a fixed header (no name, no time), so a rebuild is byte-identical."""
    with target.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        out.write("".join(line + "\n" for line in lines).encode("utf-8"))


def main() -> None:
    """Rebuild the embedded default corpus from the SQuAD v1.1 dev file (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("squad_dev", type=Path, help="path to SQuAD v1.1 dev-v1.1.json")
    parser.add_argument("--output", type=Path, default=default_corpus_path(), help="where to write the corpus")
    args = parser.parse_args()
    try:
        lines = corpus_lines(args.squad_dev)
    except DilstoreError as error:
        parser.error(str(error))
    write_corpus(lines, args.output)
    print(f"wrote {len(lines)} paragraphs of {len(ARTICLES)} articles to {args.output}")


if __name__ == "__main__":
    main()
