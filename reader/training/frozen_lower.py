"""The store as a training cache: `train qa --freeze-lower`.

DilBert's layers 1..k see the question and the passage apart, so with those
layers (and the embeddings) frozen, a window's layer-k states never change
during training. They are computed once per distinct window, in eval mode
and rounded to fp16 exactly as `precompute` stores them, and every later
step runs only layers k+1..l and the QA head on them. SQuAD has about 4.5
questions per paragraph, so each passage window's lower layers run once
instead of once per question, and no gradient flows below layer k.

The trained reader keeps the frozen layers bit for bit, so a store
precomputed with the starting model (usually the fine-tuned k=0 reader
loaded at k) already holds the trained reader's passage states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from dilstore.reader.data.qa_batches import QABatch
from dilstore.reader.data.qa_features import QAFeature
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.storage.errors import DilstoreError

CACHE_DTYPE = torch.float16  # what the store's default encoding keeps
Encoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # ids (m, n), mask (m, n) → states (m, n, d)
StateTransform = Callable[[np.ndarray], np.ndarray]  # float32 states (T, d) → (T, d), e.g. a store's round trip


def freeze_lower_layers(reader: DilBertReader) -> None:
    """Stop gradients into the embeddings and layers 1..k; refuse models whose upper layers share those weights."""
    if reader.layers < 1:
        raise DilstoreError("--freeze-lower needs k of at least 1: with k=0 no layer runs apart to freeze")
    lower = reader.offline_modules()
    upper = [reader.architecture.layer_module(reader.model, index) for index in range(reader.layers, reader.num_layers)]
    lower_ids = {id(parameter) for module in lower for parameter in module.parameters()}
    if any(id(parameter) in lower_ids for module in upper for parameter in module.parameters()):
        raise DilstoreError(
            f"--freeze-lower: this {reader.model.config.model_type} model shares weights between layers "
            f"1..{reader.layers} and the layers above, so the lower ones cannot be frozen alone"
        )
    for module in lower:
        module.requires_grad_(False)


class LowerStateCache:
    """Layer-k states of every question and passage window seen so far, keyed by their token ids.

    `states(features, batch)` returns the batch's question states (b, nq, d)
    and passage states (b, np, d), padded like `batch`; windows not seen
    before are encoded first, in one no-grad, eval-mode pass per side. With
    `passage_round_trip` (reader/training/store_codec.py), passage states are
    cached as it returns them: what a low-bit store would give back.
    """

    def __init__(self, reader: DilBertReader, passage_round_trip: StateTransform | None = None) -> None:
        self._reader = reader
        self._passage_round_trip = passage_round_trip
        self._questions: dict[bytes, torch.Tensor] = {}
        self._passages: dict[bytes, torch.Tensor] = {}

    @property
    def sizes(self) -> dict[str, int]:
        """How many distinct question and passage windows are cached."""
        return {"cached_questions": len(self._questions), "cached_passage_windows": len(self._passages)}

    def states(self, features: Sequence[QAFeature], batch: QABatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer-k question and passage states of `features`, padded to `batch`'s widths, on its device."""
        questions = self._side(
            self._questions, [feature.question.token_ids for feature in features], self._reader.encode_questions,
            batch.question_ids.shape[1], batch.question_ids.device, None,
        )  # fmt: skip
        passages = self._side(
            self._passages, [feature.passage.token_ids for feature in features], self._reader.encode_passages,
            batch.passage_ids.shape[1], batch.passage_ids.device, self._passage_round_trip,
        )  # fmt: skip
        return questions, passages  # (b, nq, d), (b, np, d)

    def _side(
        self,
        cache: dict[bytes, torch.Tensor],
        token_ids: Sequence[Sequence[int]],
        encode: Encoder,
        width: int,
        device: torch.device,
        transform: StateTransform | None,
    ) -> torch.Tensor:
        """One side's states from `cache`, encoding the token-id rows it lacks; (b, width, d), zeros past each row."""
        keys = [torch.as_tensor(ids, dtype=torch.long).numpy().tobytes() for ids in token_ids]
        missing = {key: ids for key, ids in zip(keys, token_ids, strict=True) if key not in cache}
        if missing:
            states = encode_windows(self._reader, encode, list(missing.values()), device)
            if transform is not None:
                states = _transformed(states, transform)
            for key, row_states in zip(missing, states, strict=True):
                cache[key] = row_states.to(CACHE_DTYPE)  # (n, d)
        padded = torch.zeros(len(keys), width, self._reader.hidden_size, dtype=CACHE_DTYPE)  # (b, width, d)
        for row, key in enumerate(keys):
            states = cache[key]  # (n, d)
            padded[row, : states.shape[0]] = states
        return padded.to(device)


def encode_windows(
    reader: DilBertReader, encode: Encoder, rows: Sequence[Sequence[int]], device: torch.device
) -> list[torch.Tensor]:
    """Each token-id row's layer-k states, float32 on the CPU: (n, d) each.

    One no-grad pass in eval mode (no dropout, as precompute runs it); the
    reader's train/eval mode is restored after.
    """
    tensors = [torch.as_tensor(ids, dtype=torch.long) for ids in rows]
    lengths = torch.tensor([len(row) for row in tensors])  # (m,)
    ids = nn.utils.rnn.pad_sequence(tensors, batch_first=True).to(device)  # (m, n)
    mask = (torch.arange(ids.shape[1]) < lengths[:, None]).long().to(device)  # (m, n)
    was_training = reader.training
    reader.eval()
    try:
        with torch.no_grad():
            states = encode(ids, mask)  # (m, n, d)
    finally:
        reader.train(was_training)
    return [row[:length].to("cpu", torch.float32).clone() for row, length in zip(states, lengths.tolist(), strict=True)]


def _transformed(states: Sequence[torch.Tensor], transform: StateTransform) -> list[torch.Tensor]:
    """`transform` applied to all rows' tokens at once, split back into rows: (n, d) each."""
    joined = torch.cat(list(states)).numpy()  # (Σn, d)
    changed = torch.from_numpy(np.ascontiguousarray(transform(joined), dtype=np.float32))  # (Σn, d)
    return list(changed.split([len(row) for row in states]))
