"""One micro-batch's windows through the reader in length-sorted chunks, each padded only to its own longest.

A shared-normalisation example is a group of windows of unrelated lengths (the answer window and the
first windows of BM25-negative paragraphs), so a micro-batch padded to its longest window computes
much padding, and on a CPU padding costs as much as real tokens. Sorting the micro-batch's windows by
length and running them a few at a time cuts it (benchmarks/bench_length_chunks.py measures both the
padding and the step time; BENCHMARKS.md has the figures).

The chunks' outputs are padded back to the whole micro-batch's widths and put back in its order, so the
losses (shared normalisation couples the windows of a group; distillation compares states token by
token) see what one forward pass over the padded micro-batch gives them: the same logits everywhere
(the dtype's minimum on padding) and the same states on every real token; states on padding differ,
and every loss masks them out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dilstore.reader.batching import to_device
from dilstore.reader.data.qa_batches import QABatch, collate_features
from dilstore.reader.data.qa_features import QAFeature
from dilstore.reader.training.loop import training_device

# A forward pass over some windows and their padded batch: start and end logits (c, nq + np) and the states.
ChunkForward = Callable[[Sequence[QAFeature], QABatch], tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]]
# Windows a pass on a CPU when `train qa` is not told (bench_length_chunks.py: the fastest of 16, 8 and 4).
CPU_CHUNK_WINDOWS = 4


def default_chunk_windows(device: str | torch.device | None) -> int:
    """CPU_CHUNK_WINDOWS on a CPU; 0 (one pass per micro-batch, as before) on a GPU, where it was not measured.

    `device` as training takes it (loop.training_device): None means CUDA when available, else the CPU.
    """
    return CPU_CHUNK_WINDOWS if training_device(device).type == "cpu" else 0


def length_chunks(features: Sequence[QAFeature], chunk: int) -> list[list[int]]:
    """Indices of `features` sorted by window length (question plus passage), cut into runs of at most `chunk`."""
    order = sorted(range(len(features)), key=lambda i: len(features[i].question) + len(features[i].passage))
    return [order[i : i + chunk] for i in range(0, len(order), chunk)]


def pad_back(values: torch.Tensor, question_width: int, batch: QABatch, fill: float) -> torch.Tensor:
    """A chunk's (c, nq_c + np_c, ...) output over [question ; passage] at `batch`'s widths (c, nq + np, ...)."""
    rows, tail = values.shape[0], values.shape[2:]
    question, passage = values[:, :question_width], values[:, question_width:]  # (c, nq_c, ...), (c, np_c, ...)
    missing_question = batch.question_ids.shape[1] - question.shape[1]
    missing_passage = batch.passage_ids.shape[1] - passage.shape[1]
    pieces = [
        question,
        values.new_full((rows, missing_question, *tail), fill),
        passage,
        values.new_full((rows, missing_passage, *tail), fill),
    ]
    return torch.cat(pieces, dim=1)  # (c, nq + np, ...)


def forward_in_chunks(
    forward: ChunkForward,
    features: Sequence[QAFeature],
    batch: QABatch,
    pad_token_id: int,
    chunk: int,
    with_states: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """`forward` over `features` in length-sorted chunks of at most `chunk`, outputs as one pass over `batch` gives.

    `batch` is `features` collated together (the widths to pad back to, and its device). Without
    `with_states` the states are not padded back and an empty list comes back (only distillation reads them).
    """
    starts, ends, states, rows = [], [], [], []
    for indices in length_chunks(features, chunk):
        part = [features[index] for index in indices]
        sub = collate_features(part, pad_token_id).to(batch.question_ids.device)
        width = sub.question_ids.shape[1]
        start, end, chunk_states = forward(part, sub)  # (c, nq_c + np_c) ×2, each state (c, nq_c + np_c, d)
        lowest = torch.finfo(start.dtype).min
        starts.append(pad_back(start, width, batch, lowest))
        ends.append(pad_back(end, width, batch, lowest))
        if with_states:
            states.append([pad_back(state, width, batch, 0.0) for state in chunk_states])
        rows.extend(indices)
    inverse = torch.empty(len(rows), dtype=torch.long)
    inverse[torch.tensor(rows)] = torch.arange(len(rows))
    inverse = to_device(inverse, batch.question_ids.device)  # row i of the micro-batch is row inverse[i] of the chunks
    # Each joined layer is (b, nq + np, d): the chunks' states padded back, in the micro-batch's row order.
    joined = [torch.cat(layer, dim=0).index_select(0, inverse) for layer in zip(*states, strict=True)]
    start, end = torch.cat(starts).index_select(0, inverse), torch.cat(ends).index_select(0, inverse)  # (b, nq + np)
    return start, end, joined
