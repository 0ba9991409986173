"""What the passages made from a Wikipedia dump look like: how many, how long, and what is wrong with their text.

The reader can only answer from the text the passages hold, so the text's defects are counted here, over every
passage of a dump, with the library's own reading (`pipelines.corpus_wikipedia`) and splitting
(`pipelines.passages`):

    .venv/bin/python benchmarks/wiki_passages.py ../shared/data/wiki/enwiki-excerpt-206-pages.xml.bz2

Counted per passage of `--split paragraphs` (and the number of `--split words` windows): leftover wikitext markup
(`{{`, `}}`, `[[`, `]]`, `''`, `<ref`, `{|`, `|-`, `thumb|`, `Category:`), stray apostrophes (one after a space and
before a space or punctuation, which no quotation mark is: what a dropped template between two italic runs
left), brackets opening on a separator ("(; ;"), and passages ending in ":" (what followed is a list, a
quotation or a table: kept as the next passage, or dropped). Pages are counted by what became of them: an
article, or skipped and why. Prints a table, then everything as JSON; run it on two checkouts to compare them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from script_errors import one_line_errors

from dilstore.pipelines.corpus_wikipedia import read_wikipedia
from dilstore.pipelines.documents import Document, Rejected, Skipped
from dilstore.pipelines.passages import split_document

MARKUP = ("{{", "}}", "[[", "]]", "''", "<ref", "{|", "|-", "thumb|", "Category:")
_STRAY_APOSTROPHE = re.compile(r"(?:^|(?<=\s))'(?=[\s,.;:)]|$)")  # alone between spaces: no quotation mark is
_OPENING_SEPARATOR = re.compile(r"\(\s*[;,:]")


def passage_stats(dump: Path) -> dict[str, Any]:
    """The dump's pages by outcome and its passages' counts and defects (module docstring)."""
    pages: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    words: list[int] = []
    for record in read_wikipedia(dump):
        if isinstance(record, Skipped):
            pages[f"skipped: {record.reason}"] += 1
            continue
        if isinstance(record, Rejected):
            pages["rejected"] += 1
            continue
        assert isinstance(record, Document)
        pages["articles"] += 1
        counts["word_windows"] += len(split_document(record, "words"))
        for passage in split_document(record, "paragraphs"):
            text = passage.text
            words.append(len(text.split()))
            counts["passages"] += 1
            counts["with_markup"] += any(marker in text for marker in MARKUP)
            counts["stray_apostrophes"] += len(_STRAY_APOSTROPHE.findall(text))
            counts["separator_after_bracket"] += len(_OPENING_SEPARATOR.findall(text))
            counts["ending_in_colon"] += text.rstrip().endswith(":")
    ordered = sorted(words)
    return {
        "dump": str(dump),
        "pages": dict(sorted(pages.items())),
        **dict(counts),
        "words_per_passage": {"mean": round(sum(words) / max(len(words), 1), 1),
                              "median": ordered[len(ordered) // 2] if ordered else 0},  # fmt: skip
    }


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dumps", nargs="+", type=Path, help="pages-articles XML dumps (.xml, .xml.bz2)")
    args = parser.parse_args(argv)
    # a missing or unreadable dump: one line (one_line_errors), not a traceback
    results = [passage_stats(dump) for dump in args.dumps]
    rows = ("passages", "word_windows", "with_markup", "stray_apostrophes", "separator_after_bracket",
            "ending_in_colon")  # fmt: skip
    print("| count | " + " | ".join(result["dump"].rsplit("/", 1)[-1] for result in results) + " |")
    print("|---|" + "---:|" * len(results))
    for row in rows:
        print(f"| {row} | " + " | ".join(f"{result.get(row, 0):,}" for result in results) + " |")
    for outcome in sorted({key for result in results for key in result["pages"]}):
        print(f"| pages {outcome} | " + " | ".join(f"{result['pages'].get(outcome, 0):,}" for result in results) + " |")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
