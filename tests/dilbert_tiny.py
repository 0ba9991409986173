"""Tiny random encoders of every supported architecture, random question/passage batches, and the reference network.

Used by the tests/test_dilbert_*.py files. The reference is written here from
the token contract alone (not from reader/architectures.py), so the tests
compare two independent statements of the same network.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import (
    AlbertConfig,
    AutoModelForQuestionAnswering,
    BertConfig,
    DistilBertConfig,
    PreTrainedModel,
    RobertaConfig,
)

VOCAB = 100
PAD, CLS, SEP = 1, 2, 3  # RoBERTa needs pad 1; the others accept any pad id
FIRST_WORD = 5
# Weights 5x wider than the usual 0.02, so logits are O(1) and a wrong mask, segment or position id shows as
# differences of 0.1 and more, far above the 1e-4 tolerance (fp32 noise here is about 1e-7).
INIT = 0.1

# Four tiny encoders, plus an ALBERT whose 4 layers reuse 2 groups of 2 inner layers.
TINY_CONFIGS = {
    "bert": lambda: BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=PAD, initializer_range=INIT,
    ),
    "albert": lambda: AlbertConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=PAD, initializer_range=INIT,
    ),
    "albert-grouped": lambda: AlbertConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=4, num_hidden_groups=2,
        inner_group_num=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, pad_token_id=PAD, initializer_range=INIT,
    ),
    "distilbert": lambda: DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=3, n_heads=4, hidden_dim=64, max_position_embeddings=64, pad_token_id=PAD, initializer_range=INIT,
    ),
    "roberta": lambda: RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=66, pad_token_id=PAD, type_vocab_size=1, initializer_range=INIT,
    ),
}  # fmt: skip

# The token contract restated: (question segment, passage segment, first position) per model_type.
CONTRACT = {
    "bert": (0, 1, 0),
    "albert": (0, 1, 0),
    "distilbert": (None, None, 0),
    "roberta": (0, 0, PAD + 1),
}


def tiny_model(name: str, attn_implementation: str = "sdpa", seed: int = 0) -> PreTrainedModel:
    """A random *ForQuestionAnswering model from TINY_CONFIGS, in eval mode."""
    torch.manual_seed(seed)
    model = AutoModelForQuestionAnswering.from_config(TINY_CONFIGS[name](), attn_implementation=attn_implementation)
    return model.eval()


@dataclass(frozen=True)
class Batch:
    """A padded batch: question `[CLS] q [SEP]` and passage `p [SEP]` ids with their 1/0 masks."""

    question_ids: torch.Tensor  # (b, nq)
    question_mask: torch.Tensor  # (b, nq)
    passage_ids: torch.Tensor  # (b, np)
    passage_mask: torch.Tensor  # (b, np)

    def example(self, index: int) -> Batch:
        """Example `index` alone, with its padding cut off."""
        nq = int(self.question_mask[index].sum())
        np_ = int(self.passage_mask[index].sum())
        return Batch(
            self.question_ids[index : index + 1, :nq],
            self.question_mask[index : index + 1, :nq],
            self.passage_ids[index : index + 1, :np_],
            self.passage_mask[index : index + 1, :np_],
        )


def random_batch(lengths: list[tuple[int, int]], seed: int = 0, pad_id: int = PAD) -> Batch:
    """Random words for each (question words, passage words) pair, padded to the batch maxima.

    Padded slots hold `pad_id`; pass a word id to prove that what sits in
    padding never matters.
    """
    generator = torch.Generator().manual_seed(seed)
    nq = max(words for words, _ in lengths) + 2
    np_ = max(words for _, words in lengths) + 1
    question_ids = torch.full((len(lengths), nq), pad_id)
    passage_ids = torch.full((len(lengths), np_), pad_id)
    question_mask = torch.zeros((len(lengths), nq), dtype=torch.long)
    passage_mask = torch.zeros((len(lengths), np_), dtype=torch.long)
    for row, (question_words, passage_words) in enumerate(lengths):
        question = torch.randint(FIRST_WORD, VOCAB, (question_words,), generator=generator)
        passage = torch.randint(FIRST_WORD, VOCAB, (passage_words,), generator=generator)
        question_ids[row, : question_words + 2] = torch.cat([torch.tensor([CLS]), question, torch.tensor([SEP])])
        passage_ids[row, : passage_words + 1] = torch.cat([passage, torch.tensor([SEP])])
        question_mask[row, : question_words + 2] = 1
        passage_mask[row, : passage_words + 1] = 1
    return Batch(question_ids, question_mask, passage_ids, passage_mask)


def contract_inputs(model: PreTrainedModel, batch: Batch) -> dict[str, torch.Tensor]:
    """Keyword inputs of the plain HF model for the concatenation `[CLS] q [SEP] p [SEP]` with the contract's ids."""
    question_segment, passage_segment, first = CONTRACT[model.config.model_type]
    b, nq = batch.question_ids.shape
    np_ = batch.passage_ids.shape[1]
    inputs = {
        "input_ids": torch.cat([batch.question_ids, batch.passage_ids], dim=1),  # (b, nq + np)
        "attention_mask": torch.cat([batch.question_mask, batch.passage_mask], dim=1),  # (b, nq + np)
        "position_ids": torch.cat([torch.arange(nq), torch.arange(np_)]).add(first).expand(b, -1),  # (b, nq + np)
    }
    if question_segment is not None:
        segments = [torch.full((b, nq), question_segment), torch.full((b, np_), passage_segment)]
        inputs["token_type_ids"] = torch.cat(segments, dim=1)  # (b, nq + np)
    return inputs


def encoder_layer_modules(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The distinct modules the HF encoder calls once per layer, in order (ALBERT: its shared layer groups)."""
    base = model.base_model
    if model.config.model_type == "albert":
        return list(base.encoder.albert_layer_groups)
    if model.config.model_type == "distilbert":
        return list(base.transformer.layer)
    return list(base.encoder.layer)


def block_diagonal_mask(batch: Batch) -> torch.Tensor:
    """Additive (b, 1, n, n) mask: question tokens see valid question tokens, passage tokens valid passage tokens."""
    nq, np_ = batch.question_ids.shape[1], batch.passage_ids.shape[1]
    side = torch.cat([torch.zeros(nq, dtype=torch.bool), torch.ones(np_, dtype=torch.bool)])  # (n,)
    same_side = side[:, None] == side[None, :]  # (n, n)
    valid = torch.cat([batch.question_mask, batch.passage_mask], dim=1).bool()  # (b, n)
    allowed = same_side[None, None] & valid[:, None, None, :]  # (b, 1, n, n)
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


@contextmanager
def block_diagonal_in_first_layers(model: PreTrainedModel, mask: torch.Tensor, k: int) -> Iterator[None]:
    """While active, the first k encoder layer calls of `model` get `mask` instead of the model's own mask."""
    calls = [0]

    def swap_mask(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        calls[0] += 1
        if calls[0] > k:
            return None
        return (args[0], mask, *args[2:]), kwargs

    handles = [
        module.register_forward_pre_hook(swap_mask, with_kwargs=True) for module in encoder_layer_modules(model)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    assert calls[0] == model.config.num_hidden_layers, "every encoder layer must have run exactly once"


def reference_logits(model: PreTrainedModel, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The unmodified HF QA model on the concatenation, block-diagonal in layers 1..k; logits (b, nq + np)."""
    with torch.no_grad(), block_diagonal_in_first_layers(model, block_diagonal_mask(batch), k):
        output = model(**contract_inputs(model, batch))
    return output.start_logits, output.end_logits
