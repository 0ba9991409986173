"""The small real corpus that `dilstore precompute` runs on when given no corpus.

Ten whole Wikipedia articles as paragraphs from the SQuAD v1.1 dev set
(CC BY-SA 4.0); README.md beside this file gives source, licence and how
`build.py` made it.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_CORPUS_FILE = "squad-dev-v1.1-10-articles.jsonl.gz"
DEFAULT_CORPUS_FORMAT = "jsonl"


def default_corpus_path() -> Path:
    """The embedded default corpus: a gzipped JSONL of `{"id", "title", "text"}` paragraphs."""
    return Path(__file__).resolve().parent / DEFAULT_CORPUS_FILE
