"""n-best span decoding: the banded numpy search against a brute force over every valid span."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.serving.decode import SpanCandidate, best_spans
from dilstore.storage.errors import DilstoreError


def brute_force(start_logits, end_logits, char_spans, n_best: int, max_answer_length: int) -> list[SpanCandidate]:
    """Every span i ≤ j within the length limit with both ends on non-empty text spans, sorted best first."""
    candidates = []
    for i in range(len(start_logits)):
        for j in range(i, min(i + max_answer_length, len(start_logits))):
            ends_on_text = all(char_spans[k][0] >= 0 and char_spans[k][0] < char_spans[k][1] for k in (i, j))
            score = (float(start_logits[i]) + float(end_logits[j])) / 2
            if ends_on_text and np.isfinite(score):
                candidates.append(SpanCandidate(i, j, int(char_spans[i][0]), int(char_spans[j][1]), score))
    candidates.sort(key=lambda c: (-c.score, c.start, c.end))
    return candidates[:n_best]


@st.composite
def windows(draw):
    """Logits with many ties (small half-integers, some -inf) and spans mixing text, empty and special tokens."""
    n = draw(st.integers(0, 40))
    logit = st.one_of(st.integers(-6, 6).map(lambda v: v / 2), st.just(-np.inf))
    start_logits = np.array(draw(st.lists(logit, min_size=n, max_size=n)), dtype=np.float32)
    end_logits = np.array(draw(st.lists(logit, min_size=n, max_size=n)), dtype=np.float32)
    kinds = draw(st.lists(st.sampled_from(["text", "text", "text", "empty", "special"]), min_size=n, max_size=n))
    spans, cursor = [], 0
    for kind in kinds:
        if kind == "special":
            spans.append((-1, -1))
        else:
            width = 0 if kind == "empty" else draw(st.integers(1, 5))
            spans.append((cursor, cursor + width))
            cursor += width + draw(st.integers(0, 1))
    return start_logits, end_logits, np.array(spans, dtype=np.int32).reshape(n, 2)


@given(window=windows(), n_best=st.integers(1, 30), max_answer_length=st.integers(1, 12))
@settings(max_examples=200, deadline=None)
def test_banded_search_equals_brute_force(window, n_best: int, max_answer_length: int) -> None:
    start_logits, end_logits, char_spans = window
    found = best_spans(start_logits, end_logits, char_spans, n_best=n_best, max_answer_length=max_answer_length)
    assert found == brute_force(start_logits, end_logits, char_spans, n_best, max_answer_length)


def test_best_span_and_its_characters() -> None:
    # tokens: [CLS]-like special, "Ingrid"(0,6) "Solberg"(7,14) "won"(15,18) [SEP]
    spans = np.array([[-1, -1], [0, 6], [7, 14], [15, 18], [-1, -1]], dtype=np.int32)
    start = np.array([9.0, 4.0, 1.0, 0.0, 9.0])
    end = np.array([9.0, 0.0, 5.0, 1.0, 9.0])
    best, second, *_ = best_spans(start, end, spans, n_best=3)
    assert (best.start, best.end, best.char_start, best.char_end, best.score) == (1, 2, 0, 14, 4.5)
    assert (second.start, second.end, second.score) == (2, 2, 3.0)


def test_max_answer_length_and_n_best_limit_the_candidates() -> None:
    spans = np.stack([np.arange(10) * 2, np.arange(10) * 2 + 1], axis=1)
    start, end = np.zeros(10), np.zeros(10)
    start[0], end[9] = 10.0, 10.0
    found = best_spans(start, end, spans, n_best=100, max_answer_length=3)
    assert all(c.end - c.start + 1 <= 3 for c in found)
    assert len(found) == 10 + 9 + 8
    assert (found[0].start, found[0].end) != (0, 9)
    assert len(best_spans(start, end, spans, n_best=5, max_answer_length=10)) == 5
    assert best_spans(start, end, spans, n_best=1, max_answer_length=10)[0].end == 9


def test_windows_without_text_give_no_spans() -> None:
    assert best_spans(np.zeros(3), np.zeros(3), np.full((3, 2), -1)) == []
    assert best_spans(np.zeros(0), np.zeros(0), np.zeros((0, 2))) == []


def test_mismatched_shapes_and_bad_limits_are_refused() -> None:
    with pytest.raises(DilstoreError, match="one window"):
        best_spans(np.zeros(3), np.zeros(4), np.zeros((3, 2)))
    with pytest.raises(DilstoreError, match="at least 1"):
        best_spans(np.zeros(3), np.zeros(3), np.zeros((3, 2)), n_best=0)
