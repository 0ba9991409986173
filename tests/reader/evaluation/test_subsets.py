"""reader/evaluation/subsets.py: the seeded subset a `--limit` picks, for evaluate-rc, evaluate-qa and the
SQuAD-dev ranking task alike."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dilstore.reader.evaluation.subsets import seeded_subset
from dilstore.storage.errors import DilstoreError


@given(size=st.integers(0, 60), limit=st.integers(1, 80), seed=st.integers(0, 2**32 - 1))
def test_a_limit_takes_a_seeded_subset_in_file_order(size: int, limit: int, seed: int) -> None:
    items = [f"q{index}" for index in range(size)]
    chosen = seeded_subset(items, limit, seed)
    assert len(chosen) == min(limit, size) and len(set(chosen)) == len(chosen)
    assert chosen == seeded_subset(items, limit, seed)  # the same seed, the same subset
    positions = [items.index(item) for item in chosen]
    assert positions == sorted(positions)  # kept in file order
    if limit >= size:
        assert chosen == items


def test_a_limit_samples_the_whole_file_not_its_first_items() -> None:
    """SQuAD files are ordered by article: the first N questions would cover one or two topics."""
    items = list(range(50))
    assert set().union(*(seeded_subset(items, 3, seed) for seed in range(40))) > set(range(10))
    assert seeded_subset(items, None, 0) == items


@pytest.mark.parametrize("refused", [0, -100])
def test_a_limit_below_one_is_named_as_the_argument(refused: int) -> None:
    """Named as the argument, not as a command's --limit (style38 M7)."""
    with pytest.raises(DilstoreError, match=f"^limit must be at least 1, got {refused}$"):
        seeded_subset(["a", "b"], refused, seed=0)


@given(seed=st.integers(1, 2**40))
def test_a_negative_seed_is_refused_not_taken_as_its_absolute_value(seed: int) -> None:
    """(left55b F1) random.Random(-S) draws as random.Random(S): seed -1 picked the subset of seed 1, so two seeds
    silently named one subset."""
    with pytest.raises(DilstoreError, match=f"^seed must be at least 0, got {-seed}: .* same subset as {seed}$"):
        seeded_subset(list(range(50)), 3, -seed)
