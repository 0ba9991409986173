"""What the trainable rankers (EARL, cross-encoder, Siamese, Listformer) share: the scoring interface and its checks.

Each ranker tokenizes a query and a document on its own, once (so training
and evaluation tokenize every paragraph a single time), and scores groups of
documents per query:

    tokenize_query(text, max_length)       → int ids, `[CLS] q [SEP]`
    tokenize_document(text, max_length)    → int ids (the ranker's own document convention)
    score_groups(queries, groups)          → scores (b, g): b queries, g documents each
    score_texts(queries, documents, ...)   → scores (b,) of b (query, document) text pairs

Training scores groups of 1 positive and n negatives, (b, 1 + n); evaluation
scores one query's candidates as one group, so EARL encodes that query once
and the Listformer reads the whole candidate list in one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from dilstore.storage.errors import DilstoreError

DEFAULT_MAX_QUERY_LENGTH = 32
DEFAULT_MAX_DOC_LENGTH = 256
RANKER_KINDS = ("earl", "cross-encoder", "siamese", "listformer")


class TrainableRanker(Protocol):
    """The interface `reader/training/ranking.py` and `reader/evaluation/ranking.py` rely on."""

    kind: str

    def tokenize_query(self, text: str, max_length: int) -> np.ndarray: ...

    def tokenize_document(self, text: str, max_length: int) -> np.ndarray: ...

    def score_groups(self, queries: Sequence[np.ndarray], groups: Sequence[Sequence[np.ndarray]]) -> torch.Tensor: ...

    def save_pretrained(self, path: str | Path) -> Path: ...


def group_size(queries: Sequence[np.ndarray], groups: Sequence[Sequence[np.ndarray]]) -> int:
    """g, the documents per query: every group must hold the same number (at least 1), one group per query."""
    if not queries:
        raise DilstoreError("nothing to score: the list of queries is empty")
    if len(groups) != len(queries):
        raise DilstoreError(f"{len(queries)} queries but {len(groups)} document groups")
    sizes = {len(group) for group in groups}
    if len(sizes) != 1 or 0 in sizes:
        raise DilstoreError(f"every query needs the same number (at least 1) of documents, got {sorted(sizes)}")
    return sizes.pop()


def score_text_pairs(
    ranker: TrainableRanker,
    queries: Sequence[str],
    documents: Sequence[str],
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH,
    max_doc_length: int = DEFAULT_MAX_DOC_LENGTH,
) -> torch.Tensor:
    """Scores (b,) of the text pairs (queries[i], documents[i]), each tokenized and truncated on its own."""
    if len(queries) != len(documents):
        raise DilstoreError(f"{len(queries)} queries but {len(documents)} documents to pair them with")
    query_ids = [ranker.tokenize_query(query, max_query_length) for query in queries]
    groups = [[ranker.tokenize_document(document, max_doc_length)] for document in documents]
    return ranker.score_groups(query_ids, groups)[:, 0]  # (b,)


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter, where its input tensors must go."""
    return next(module.parameters()).device
