"""Stored states padded into one batch, and the cause named for a score that is not finite (mutation checks, mut57a).

The open-domain reader and both rerankers read these; their own tests use a whole store. Here each rule is held
on a few hand-made passages, so a wrong mask or a wrong blame shows by itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dilstore.reader.serving.stored_states import non_finite_cause, pad_stored_states
from dilstore.storage.records import StoredPassage


def passage(states: np.ndarray) -> StoredPassage:
    """A passage of len(states) tokens holding `states` (n, *S)."""
    n = states.shape[0]
    spans = np.stack([np.arange(n), np.arange(n) + 1], axis=1).astype(np.int32)  # (n, 2)
    return StoredPassage("p", "t", "x" * n, np.arange(n, dtype=np.int32), spans, states)


@pytest.mark.parametrize("state_shape", [(3,), (2, 2, 3)], ids=["d", "M-2-d"])
def test_padded_states_keep_each_passages_rows_and_mask_only_them(state_shape: tuple[int, ...]) -> None:
    """Rows past a passage's own tokens are zero and masked 0 (EARL's judger blocks take this mask; the
    open-domain reader's own check never looked at it), each passage's rows are its own in order, and fp16 rows
    come out in the asked dtype."""
    lengths = [2, 4, 1]
    stored = [passage(np.arange(n * np.prod(state_shape), dtype=np.float16).reshape(n, *state_shape) + 1)
              for n in lengths]  # fmt: skip
    states, mask = pad_stored_states(stored, torch.device("cpu"), torch.float32)  # (3, 4, *S), (3, 4)
    assert states.shape == (3, 4, *state_shape) and states.dtype == torch.float32
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    for row, (n, one) in enumerate(zip(lengths, stored, strict=True)):
        np.testing.assert_array_equal(states[row, :n].numpy(), one.states.astype(np.float32))
        assert not states[row, n:].any()


def test_one_non_finite_state_blames_the_store_and_finite_states_blame_the_weights() -> None:
    """A passage with a single NaN among finite states has a damaged store, not damaged weights: only states that
    are all finite point at the model."""
    states = np.ones((3, 2), np.float32)
    assert "weights hold NaN" in non_finite_cause(passage(states))
    states[1, 0] = np.nan
    assert non_finite_cause(passage(states)).startswith("as its stored states hold NaN or infinite values")
    states[1, 0] = np.inf
    assert non_finite_cause(passage(states)).startswith("as its stored states hold NaN or infinite values")
