"""The seeded random subset that an evaluation's `limit` picks.

evaluate-rc's SQuAD examples, evaluate-qa's open-domain questions and the SQuAD-dev ranking task's queries each
drew theirs with a copy of the same four lines (dup55 D3); one definition keeps them drawing alike, so a `--limit N
--seed S` names the same subset wherever it is given.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from dilstore.storage.checks import require_at_least_one
from dilstore.storage.errors import DilstoreError

T = TypeVar("T")


def require_subset_seed(seed: int) -> None:
    """Raise DilstoreError unless the subset's `seed` is at least 0.

    `random.Random` seeds with the absolute value of an integer, so seed -1 drew the same subset as seed 1
    (left55b F1): two different seeds silently named one subset.
    """
    if seed < 0:
        raise DilstoreError(
            f"seed must be at least 0, got {seed}: Python's random seeds with its absolute value, "
            f"so {seed} would pick the same subset as {-seed}"
        )


def seeded_subset(items: Sequence[T], limit: int | None, seed: int) -> list[T]:
    """All `items`, or a seeded random sample of `limit` of them kept in file order; a DilstoreError for a `limit`
    below 1 or a negative `seed` (`require_subset_seed`).

    A random sample rather than the first N: SQuAD files are ordered by
    article, so the first N questions would cover only one or two topics.
    """
    require_at_least_one({"limit": limit}, dashed=False)
    require_subset_seed(seed)
    if limit is None or limit >= len(items):
        return list(items)
    chosen = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[index] for index in chosen]
