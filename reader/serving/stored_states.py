"""Padding stored per-token states into one batch, for the open-domain reader and rerank alike."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dilstore.storage.records import StoredPassage


def pad_stored_states(
    passages: Sequence[StoredPassage], device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored states padded into (b, n, *S) of `dtype` on `device`, with the (b, n) mask.

    S is the store's state shape: (d,) for dilbert and EARL S1, (M, 2, d) for
    S2. Rows are copied in the stored dtype (fp16 stays fp16) and torch casts
    the whole batch once, vectorised, instead of numpy upcasting per row.
    """
    width = max(len(passage.token_ids) for passage in passages)
    state_shape = passages[0].states.shape[1:]
    stored_dtype = np.result_type(*(passage.states.dtype for passage in passages))
    states = np.zeros((len(passages), width, *state_shape), dtype=stored_dtype)  # (b, n, *S)
    mask = torch.zeros((len(passages), width), dtype=torch.long)  # (b, n)
    for row, passage in enumerate(passages):
        n = len(passage.token_ids)
        states[row, :n] = passage.states
        mask[row, :n] = 1
    return torch.from_numpy(states).to(device, dtype), mask.to(device)


def stored_finite(passage: StoredPassage, vector: bool = False) -> bool:
    """Whether `passage`'s stored states, and with `vector` its passage vector (what a prior ranker reads too), are
    finite."""
    if not np.isfinite(passage.states).all():
        return False
    return not vector or passage.vector is None or bool(np.isfinite(passage.vector).all())


def non_finite_cause(passage: StoredPassage, vector: bool = False) -> str:
    """Why a score read from `passage` is not finite, in words that follow "its score is not finite": its stored
    states hold NaN or infinity (a damaged store), or with `vector` (a prior ranker reads it) its stored passage
    vector does, or they are finite and the reader's own weights are not (the message blamed the store for a model
    with NaN weights, mut51d; and the model's weights for a NaN passage vector, num58 F3)."""
    if not np.isfinite(passage.states).all():
        return "as its stored states hold NaN or infinite values; `dilstore verify` checks the store"
    if not stored_finite(passage, vector):
        return "as its stored passage vector holds NaN or infinite values; `dilstore verify` checks the store"
    return ("though its stored states are finite: the model's weights hold NaN or infinite values; load the "
            "model again from its files (`dilstore verify` checks the store)")
