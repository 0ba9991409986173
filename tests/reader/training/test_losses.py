"""EARL's ranking losses against values worked out by hand, and their input checks."""

from __future__ import annotations

import math

import pytest
import torch

from dilstore.reader.training.losses import pairwise_hinge_loss, softmax_cross_entropy_loss
from dilstore.storage.errors import DilstoreError

# Two queries, each with its positive first and two negatives.
SCORES = torch.tensor([[2.0, 0.5, 1.5], [0.0, 1.0, -2.0]])


def test_pairwise_hinge_by_hand() -> None:
    # margin 1: max(0, 1 - 2 + 0.5) = 0, max(0, 1 - 2 + 1.5) = 0.5, max(0, 1 - 0 + 1) = 2, max(0, 1 - 0 - 2) = 0
    assert float(pairwise_hinge_loss(SCORES)) == pytest.approx((0 + 0.5 + 2 + 0) / 4)
    # margin 0.25: 0, max(0, 0.25 - 0.5) = 0, 1.25, 0
    assert float(pairwise_hinge_loss(SCORES, margin=0.25)) == pytest.approx(1.25 / 4)


def test_softmax_cross_entropy_by_hand() -> None:
    first = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.5) + math.exp(1.5)))
    second = -math.log(1.0 / (1.0 + math.exp(1.0) + math.exp(-2.0)))
    assert float(softmax_cross_entropy_loss(SCORES)) == pytest.approx((first + second) / 2)
    assert float(softmax_cross_entropy_loss(torch.tensor([[0.0, 0.0]]))) == pytest.approx(math.log(2))


def test_losses_push_the_positive_up_and_the_negatives_down() -> None:
    for loss in (pairwise_hinge_loss, softmax_cross_entropy_loss):
        scores = SCORES.clone().requires_grad_()
        loss(scores).backward()
        assert bool((scores.grad[:, 0] <= 0).all()) and bool((scores.grad[:, 1:] >= 0).all()), loss.__name__
        assert float(scores.grad[1, 0]) < 0


@pytest.mark.parametrize("shape", [(3,), (2, 1), (0, 3), (2, 3, 1)])
def test_scores_need_a_positive_and_a_negative_per_query(shape: tuple[int, ...]) -> None:
    for loss in (pairwise_hinge_loss, softmax_cross_entropy_loss):
        with pytest.raises(DilstoreError, match=r"scores of shape \(queries, 1 \+ negatives\)"):
            loss(torch.zeros(shape))
