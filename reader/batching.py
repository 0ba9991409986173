"""Batching token sequences: one right-padding function and the length-bucketed batches every stage uses.

Offline encoding, QA training batches, the rankers and both serving paths pad
token ids the same way, and precompute and serving cut passages into batches
by the same rule, so both live here, below every role that uses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from dilstore.storage.errors import DilstoreError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Padded tokens per batch: 64 passages of 128 tokens. Bounds activation memory per forward.
DEFAULT_BATCH_TOKENS = 8192
DEFAULT_MAX_BATCH_SIZE = 128
# Online, per batch of question–passage (or query–document) pairs: padded tokens, and pairs.
DEFAULT_PAIR_BATCH_TOKENS = 8192
DEFAULT_MAX_PAIRS_PER_BATCH = 64
# A batch also ends where the next (sorted) length is over this many times its first plus LENGTH_SLACK tokens: with
# few items (a small shard, one question's 29 pairs) the token budget never cut, and 38,415 tokens went through the
# model for 22,887 real ones (perf49 F2); this bounds a batch's padding at about a quarter.
DEFAULT_MAX_LENGTH_SPREAD = 1.25
LENGTH_SLACK = 8


@dataclass(frozen=True)
class BatchPolicy:
    """How passages are batched: at most `batch_tokens` padded tokens and `max_batch_size` passages per batch, and
    no passage longer than `max_length_spread` times the batch's shortest plus LENGTH_SLACK tokens."""

    batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_length_spread: float = DEFAULT_MAX_LENGTH_SPREAD

    def __post_init__(self) -> None:
        if self.batch_tokens < 1 or self.max_batch_size < 1:
            raise DilstoreError(
                f"batch limits must be positive, got batch_tokens={self.batch_tokens}, "
                f"max_batch_size={self.max_batch_size}"
            )
        if not self.max_length_spread >= 1.0:
            raise DilstoreError(f"max_length_spread must be at least 1, got {self.max_length_spread}")

    def takes(self, size: int, shortest: int, length: int) -> bool:
        """Whether a batch of `size` passages, the shortest of `shortest` tokens, takes one more of `length` tokens
        (no shorter than any it holds), which its padded size becomes the width of."""
        return ((size + 1) * length <= self.batch_tokens and size < self.max_batch_size
                and length <= self.max_length_spread * shortest + LENGTH_SLACK)  # fmt: skip


def length_batches(lengths: Sequence[int], policy: BatchPolicy) -> list[list[int]]:
    """Indices into `lengths`, cut into batches of similar length within the policy's limits.

    Sorted by (length, index), so the batches are the same for the same input
    wherever they are computed; a batch's padded size is its size times its
    last (longest) length. A single passage longer than the budget is a batch
    of its own.
    """
    order = sorted(range(len(lengths)), key=lambda index: (lengths[index], index))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        if current and not policy.takes(len(current), lengths[current[0]], lengths[index]):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`; to a GPU through pinned memory, queued behind the device's work.

    A copy from pageable memory waits for the GPU to finish what it was
    given, so a training host could not prepare the next step while the
    device computes this one.
    """
    target = torch.device(device)
    if target.type != "cuda":
        return tensor.to(target)
    return tensor.pin_memory().to(target, non_blocking=True)


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id every stage pads with: the tokenizer's pad token, or 0 when it has none.

    Padded positions are masked out of every attention and never read, so
    any id serves; one rule keeps the offline and the online half padding
    alike (they resolved it four ways, and a tokenizer without a pad token
    was a TypeError in some, a refusal in others).
    """
    pad = tokenizer.pad_token_id
    return 0 if pad is None else int(pad)


def pad_token_ids(sequences: Sequence[np.ndarray], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad int token-id arrays to the longest: (ids (b, n) long, mask (b, n) long)."""
    if not sequences:
        raise ValueError("cannot pad an empty list of sequences")
    width = max(len(sequence) for sequence in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)  # (b, n)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)  # (b, n)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.from_numpy(np.asarray(sequence, dtype=np.int64))
        mask[row, : len(sequence)] = 1
    return ids, mask
