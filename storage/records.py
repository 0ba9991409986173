"""Passages going into a store (PassageRecord) and coming out of one (StoredPassage)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dilstore.storage.errors import DilstoreError


@dataclass(frozen=True, eq=False)
class PassageRecord:
    """One passage as the writer takes it.

    token_ids: int32 `(n,)`; char_spans: int32 `(n, 2)` start/end offsets in
    code points (Python str indices) into `text`, (-1, -1) for special tokens;
    states: float32 `(n, *state_shape)`, e.g. `(n, d)` or `(n, blocks, 2, d)`;
    vector: an optional float32 `(d,)` per passage (an EARL prior ranker's mean
    S1 row), given for every passage of a shard or for none.
    """

    id: str
    title: str
    text: str
    token_ids: np.ndarray
    char_spans: np.ndarray
    states: np.ndarray
    vector: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class EncodedPassage:
    """One passage whose states are already encoded: its rows of a shard's per-token state arrays, as stored.

    arrays: each per-token array of the encoding by name (`codes`, `scales`, ...), `(n, ...)` in its stored
    dtype; the other fields as in PassageRecord. `storage.compact` copies passages between stores this way,
    so that they decode to exactly the states they did.
    """

    id: str
    title: str
    text: str
    token_ids: np.ndarray  # (n,) int32
    char_spans: np.ndarray  # (n, 2) int32
    arrays: dict[str, np.ndarray]
    vector: np.ndarray | None = None  # (d,) float32


@dataclass(frozen=True, eq=False)
class StoredPassage:
    """One passage as the reader returns it.

    states are float32 `(n, *state_shape)` for fp32 and int8 stores (int8 is
    dequantized) and float16 for fp16 stores; on the memory-mapped path fp32
    and fp16 states are read-only views into the shard file, not copies.
    vector is the passage's float32 vector, None in a store without them.
    """

    id: str
    title: str
    text: str
    token_ids: np.ndarray  # (n,) int32
    char_spans: np.ndarray  # (n, 2) int32
    states: np.ndarray  # (n, *state_shape)
    vector: np.ndarray | None = None  # (d,) float32

    def answer_text(self, start_token: int, end_token: int) -> str:
        """The passage text covered by tokens `start_token..end_token` (inclusive), no re-tokenizing."""
        n = len(self.token_ids)
        if not 0 <= start_token <= end_token < n:
            raise DilstoreError(
                f"token span ({start_token}, {end_token}) is outside passage {self.id!r} of {n} tokens"
            )
        start = int(self.char_spans[start_token, 0])
        end = int(self.char_spans[end_token, 1])
        if start < 0 or end < 0:
            raise DilstoreError(
                f"token span ({start_token}, {end_token}) of passage {self.id!r} starts or ends on a special token"
            )
        return self.text[start:end]
