"""n-best answer spans from a passage window's start and end logits.

A span (i, j) of window tokens is a candidate when i ≤ j, j − i + 1 ≤
max_answer_length, and both ends are text tokens with a non-empty character
span (not [SEP] or padding, whose span is (-1, -1), and not a bare
whitespace token of a byte-level BPE, whose span is empty). Its score is the
seed's reader score s_r = (s_start[i] + s_end[j]) / 2, which is comparable
across windows and passages. Spans with a non-finite score are skipped.

All candidates of a window lie in an (n, max_answer_length) band: start i and
length 1..max_answer_length. The band is scored at once with numpy, the n-th
best score found with a partition, and only the spans at or above it sorted,
best first, ties broken by start then end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dilstore.storage.errors import DilstoreError

DEFAULT_N_BEST = 20
DEFAULT_MAX_ANSWER_LENGTH = 30


@dataclass(frozen=True)
class SpanCandidate:
    """One answer span: inclusive window token indices, its [char_start, char_end) text range, its score."""

    start: int
    end: int
    char_start: int
    char_end: int
    score: float


def best_spans(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    char_spans: np.ndarray,
    *,
    n_best: int = DEFAULT_N_BEST,
    max_answer_length: int = DEFAULT_MAX_ANSWER_LENGTH,
) -> list[SpanCandidate]:
    """The best `n_best` spans of one window, best first (fewer when fewer are valid).

    `start_logits` and `end_logits` are (n,) over the window's tokens and
    `char_spans` its (n, 2) character spans (TokenizedText.char_spans).
    """
    start_logits = np.asarray(start_logits, dtype=np.float64)  # (n,)
    end_logits = np.asarray(end_logits, dtype=np.float64)  # (n,)
    char_spans = np.asarray(char_spans)  # (n, 2)
    n = start_logits.shape[0]
    if start_logits.shape != (n,) or end_logits.shape != (n,) or char_spans.shape != (n, 2):
        raise DilstoreError(
            "start and end logits must be (n,) and char_spans (n, 2) for one window; got "
            f"{start_logits.shape}, {end_logits.shape} and {char_spans.shape}"
        )
    if n_best < 1 or max_answer_length < 1:
        raise DilstoreError(f"n_best and max_answer_length must be at least 1, got {n_best} and {max_answer_length}")
    if n == 0:
        return []
    text = (char_spans[:, 0] >= 0) & (char_spans[:, 0] < char_spans[:, 1])  # (n,)
    width = min(max_answer_length, n)
    ends = np.arange(n)[:, None] + np.arange(width)[None, :]  # (n, width)
    inside = ends < n  # (n, width)
    ends = np.minimum(ends, n - 1)  # (n, width)
    scores = (start_logits[:, None] + end_logits[ends]) / 2  # (n, width)
    valid = inside & text[:, None] & text[ends] & np.isfinite(scores)  # (n, width)
    starts, offsets = np.nonzero(valid)  # (c,), (c,)
    ends, scores = ends[starts, offsets], scores[starts, offsets]  # (c,), (c,)
    if scores.size > n_best:
        threshold = np.partition(scores, scores.size - n_best)[scores.size - n_best]
        keep = scores >= threshold  # (c,)
        starts, ends, scores = starts[keep], ends[keep], scores[keep]
    order = np.lexsort((ends, starts, -scores))[:n_best]
    return [
        SpanCandidate(
            start=int(starts[i]),
            end=int(ends[i]),
            char_start=int(char_spans[starts[i], 0]),
            char_end=int(char_spans[ends[i], 1]),
            score=float(scores[i]),
        )
        for i in order
    ]
