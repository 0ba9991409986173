"""Pad QA window features into the tensors the DilBert reader takes (the torch half of reader/data/qa_features.py).

Questions and passage windows are padded separately, each to the longest in
the batch, because the reader encodes them separately before it concatenates
their states. Start and end targets index the concatenation
`[question ; passage]` of the padded batch, the layout of the reader's
logits: a window's answer token t is at nq_padded + t. A window without the
answer targets 0, the question's [CLS], as run_squad does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from dilstore.reader.batching import pad_token_ids, to_device
from dilstore.reader.data.qa_features import QAFeature

NO_ANSWER_TARGET = 0


@dataclass(frozen=True)
class QABatch:
    """A padded batch of (question, passage window) pairs with their start/end targets."""

    question_ids: torch.Tensor  # (b, nq) long
    question_mask: torch.Tensor  # (b, nq) long, 1 for real tokens
    passage_ids: torch.Tensor  # (b, np) long
    passage_mask: torch.Tensor  # (b, np) long, 1 for real tokens
    start_targets: torch.Tensor  # (b,) long, indices into the (nq + np) concatenation
    end_targets: torch.Tensor  # (b,) long

    def to(self, device: torch.device | str) -> QABatch:
        """The same batch on `device` (to a GPU without the host waiting: batching.to_device)."""
        return QABatch(**{field.name: to_device(getattr(self, field.name), device) for field in fields(self)})


def collate_features(features: Sequence[QAFeature], pad_token_id: int) -> QABatch:
    """Pad features into a QABatch; targets point into [question ; passage] of the padded batch."""
    question_ids, question_mask = pad_token_ids([f.question.token_ids for f in features], pad_token_id)
    passage_ids, passage_mask = pad_token_ids([f.passage.token_ids for f in features], pad_token_id)
    question_width = question_ids.shape[1]
    starts = [NO_ANSWER_TARGET if f.start_position is None else question_width + f.start_position for f in features]
    ends = [NO_ANSWER_TARGET if f.end_position is None else question_width + f.end_position for f in features]
    return QABatch(
        question_ids=question_ids,
        question_mask=question_mask,
        passage_ids=passage_ids,
        passage_mask=passage_mask,
        start_targets=torch.tensor(starts, dtype=torch.long),  # (b,)
        end_targets=torch.tensor(ends, dtype=torch.long),  # (b,)
    )
