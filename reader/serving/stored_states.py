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


def non_finite_cause(passage: StoredPassage) -> str:
    """Why a score read from `passage` is not finite, in words that follow "its score is not finite": its stored
    states hold NaN or infinity (a damaged store), or they are finite and the reader's own weights are not (the
    message blamed the store for a model with NaN weights, mut51d)."""
    if np.isfinite(passage.states).all():
        return ("though its stored states are finite: the model's weights hold NaN or infinite values; load the "
                "model again from its files (`dilstore verify` checks the store)")
    return "as its stored states hold NaN or infinite values; `dilstore verify` checks the store"
