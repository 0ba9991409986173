"""Ranking losses: pure functions of scores.

The pairwise and softmax losses (EARL and its baselines, seed 004, section
3.4) take the scores of groups of 1 positive and n negatives per query, the
positive first, laid out as (b, 1 + n):

    pairwise hinge         mean over queries and negatives of max(0, margin − s⁺ + s⁻)
    softmax cross-entropy  mean over queries of −log softmax(s)[0]

The listwise losses (the Listformer, seed 003, section 3.2) take scores
(b, g) and graded labels (b, g) side by side: label [q, i] belongs to
document i of list q, so the lists may come in any order.

    ApproxNDCG   −mean over lists of Σᵢ (2^yᵢ − 1) / log₂(1 + π̃ᵢ) / IDCG, with the approximate rank
                 π̃ᵢ = 1 + Σ_{j≠i} σ((s_j − s_i) / T) (Qin et al.; Bruch et al. 2019). The thesis
                 writes Σ σ(r_i − r_j) without the 1, which ranks the best document last and starts
                 ranks at 0; this is the rank as NDCG counts it, and it tends to the true rank as T → 0.
    ListNet      −mean over lists of Σᵢ (yᵢ / Σy) · log softmax(s)ᵢ (the top-one ListNet of Cao et al.
                 with the label distribution of Bruch et al.'s softmax cross-entropy), which equals the
                 softmax cross-entropy above for one positive.
"""

from __future__ import annotations

import math

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


def approx_ranks(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """Scores (b, g) → approximate ranks π̃ (b, g): 1 + Σ_{j≠i} σ((s_j − s_i) / T), 1 for the best document."""
    _require_temperature(temperature)
    differences = scores.unsqueeze(-2) - scores.unsqueeze(-1)  # (b, g, g): [i, j] = s_j − s_i
    above = torch.sigmoid(differences / temperature)  # (b, g, g): how surely j ranks above i
    itself = torch.eye(scores.shape[-1], dtype=torch.bool, device=scores.device)  # (g, g)
    return 1 + above.masked_fill(itself, 0.0).sum(dim=-1)  # (b, g)


def ideal_dcg(labels: torch.Tensor) -> torch.Tensor:
    """Labels (b, g) → the DCG of each list ranked by its labels (b,): Σ (2^y − 1) / log₂(1 + rank)."""
    ranked = labels.sort(dim=-1, descending=True).values  # (b, g)
    ranks = torch.arange(1, labels.shape[-1] + 1, dtype=labels.dtype, device=labels.device)  # (g,)
    return ((2**ranked - 1) / torch.log2(1 + ranks)).sum(dim=-1)  # (b,)


def approx_ndcg_loss(scores: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Scores and labels (b, g), document by document → −mean ApproxNDCG over the b lists (module docstring).

    Every list needs a document with a positive label (NDCG is undefined
    without one).
    """
    labels = _require_lists(scores, labels)
    ideal = ideal_dcg(labels)  # (b,)
    if bool((ideal <= 0).any()):
        raise DilstoreError("ApproxNDCG needs at least one document with a positive label in every list")
    gains = 2**labels - 1  # (b, g)
    dcg = (gains / torch.log2(1 + approx_ranks(scores, temperature))).sum(dim=-1)  # (b,)
    return -(dcg / ideal).mean()


def listnet_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Scores and labels (b, g), document by document → ListNet's mean cross-entropy of softmax(s) to y / Σy."""
    labels = _require_lists(scores, labels)
    totals = labels.sum(dim=-1, keepdim=True)  # (b, 1)
    if bool((totals <= 0).any()):
        raise DilstoreError("ListNet needs at least one document with a positive label in every list")
    return -((labels / totals) * F.log_softmax(scores, dim=-1)).sum(dim=-1).mean()


def _require_lists(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Scores (b, g) with g ≥ 1 and non-negative labels of the same shape; the labels in the scores' dtype."""
    if scores.dim() != 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
        raise DilstoreError(f"listwise losses take scores of shape (lists, documents), got {tuple(scores.shape)}")
    if labels.shape != scores.shape:
        raise DilstoreError(
            f"labels {tuple(labels.shape)} must have the scores' shape {tuple(scores.shape)}: one per document"
        )
    if bool((labels < 0).any()):
        raise DilstoreError("relevance labels must be non-negative")
    return labels.to(scores.dtype)


def _require_temperature(temperature: float) -> None:
    """The ApproxNDCG temperature must be a positive finite number (at infinity the loss is constant)."""
    if not 0 < temperature < math.inf:
        raise DilstoreError(f"the ApproxNDCG temperature must be a positive finite number, got {temperature}")


def _require_groups(scores: torch.Tensor) -> None:
    """Scores must be (b, 1 + n) with n ≥ 1: a positive and at least one negative per query."""
    if scores.dim() != 2 or scores.shape[1] < 2 or scores.shape[0] < 1:
        raise DilstoreError(
            "ranking losses take scores of shape (queries, 1 + negatives) with the positive first and at least "
            f"one negative, got {tuple(scores.shape)}"
        )
