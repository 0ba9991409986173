"""What the trainable rankers' scoring shares: the ranker kinds, the default lengths and the checks of a group.

The scoring interface itself is `reader/modeling/ranker_base.py`'s RankerBase.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dilstore.storage.errors import DilstoreError

DEFAULT_MAX_QUERY_LENGTH = 32
DEFAULT_MAX_DOC_LENGTH = 256
RANKER_KINDS = ("earl", "cross-encoder", "siamese", "listformer")


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


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter, where its input tensors must go."""
    return next(module.parameters()).device
