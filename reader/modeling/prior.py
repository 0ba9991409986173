"""The bi-encoder prior that EARL and the Listformer add to their own scores.

    score = prior_scale · cos(mean(query states), mean(document states)) + the ranker's own score

The means run over valid tokens, [CLS] and [SEP] included, as
sentence-transformers pools, so with the base encoder's last states the
cosine is all-MiniLM-L6-v2's own sentence-embedding similarity. The scale
is learned and starts at PRIOR_SCALE; each ranker starts its score head at
zero, so an untrained prior ranker ranks exactly as the bi-encoder.

Where a ranker keeps an encoder at its base weights for the prior, it is
frozen as `freeze_at_fp16` says, and its checkpoint names the base instead
of storing it (reader/modeling/earl_checkpoints.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

# The prior's starting scale: cosines in [-1, 1] become scores in [-20, 20], the scale
# sentence-transformers' MultipleNegativesRankingLoss trains all-MiniLM-L6-v2's cosines with.
PRIOR_SCALE = 20.0


def new_prior_scale() -> nn.Parameter:
    """The learned scale of the prior, at PRIOR_SCALE."""
    return nn.Parameter(torch.tensor(PRIOR_SCALE))


def prior_scores(scale: torch.Tensor, query_vectors: torch.Tensor, doc_vectors: torch.Tensor) -> torch.Tensor:
    """scale · cos(query vectors, document vectors) in fp32 over the last dimension (broadcast: (..., d) → (...))."""
    return scale.float() * F.cosine_similarity(query_vectors.float(), doc_vectors.float(), dim=-1)


@torch.no_grad()
def freeze_at_fp16(parameters: Iterable[nn.Parameter]) -> None:
    """Round the parameters to fp16 and stop their gradients.

    Rounding makes the fp32 package and an fp16 copy of the same base give
    the same ranker anywhere, so the base can be named instead of stored.
    """
    for parameter in parameters:
        parameter.copy_(parameter.to(torch.float16))
        parameter.requires_grad_(False)
