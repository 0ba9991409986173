"""Ranking losses for training EARL end to end (seed 004, section 3.4): pure functions of scores.

Both take the scores of groups of 1 positive and n negatives per query, the
positive first, laid out as (b, 1 + n):

    pairwise hinge         mean over queries and negatives of max(0, margin − s⁺ + s⁻)
    softmax cross-entropy  mean over queries of −log softmax(s)[0]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dilstore.storage.errors import DilstoreError

DEFAULT_MARGIN = 1.0


def pairwise_hinge_loss(scores: torch.Tensor, margin: float = DEFAULT_MARGIN) -> torch.Tensor:
    """Scores (b, 1 + n), positive at index 0 → the mean hinge max(0, margin − s⁺ + s⁻) over all b·n pairs."""
    _require_groups(scores)
    positive = scores[:, :1]  # (b, 1)
    negatives = scores[:, 1:]  # (b, n)
    return F.relu(margin - positive + negatives).mean()


def softmax_cross_entropy_loss(scores: torch.Tensor) -> torch.Tensor:
    """Scores (b, 1 + n), positive at index 0 → the mean over queries of −log softmax(scores)[0]."""
    _require_groups(scores)
    targets = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)  # (b,)
    return F.cross_entropy(scores, targets)


def _require_groups(scores: torch.Tensor) -> None:
    """Scores must be (b, 1 + n) with n ≥ 1: a positive and at least one negative per query."""
    if scores.dim() != 2 or scores.shape[1] < 2 or scores.shape[0] < 1:
        raise DilstoreError(
            "ranking losses take scores of shape (queries, 1 + negatives) with the positive first and at least "
            f"one negative, got {tuple(scores.shape)}"
        )
