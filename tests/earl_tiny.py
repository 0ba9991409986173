"""Tiny random BERT encoders, EARL rankers initialised from them, and padded query/document batches.

Used by tests/test_earl_*.py. Documents follow EARL's `[CLS] d [SEP]`
convention, queries `[CLS] q [SEP]`; both segments use segment 0 and
positions from 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

from reader.checkpoints import base_model_dir
from reader.earl import EarlRanker

VOCAB = 100
PAD, CLS, SEP = 0, 2, 3
FIRST_WORD = 5
# Weights 5x wider than the usual 0.02, so scores move by 0.1 and more when a mask or a weight is wrong,
# far above the 1e-4 tolerance (fp32 noise here is about 1e-7).
INIT = 0.1


def tiny_config(layers: int = 3) -> BertConfig:
    """A 32-wide, 4-head BERT config with `layers` layers (N defaults to l − 2 = 1, M = 2 for l = 3)."""
    return BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=PAD, initializer_range=INIT,
    )  # fmt: skip


def tiny_encoder(seed: int = 0, layers: int = 3) -> BertModel:
    """A random BertModel (no pooler) in eval mode: the 'pretrained' encoder the rankers start from."""
    torch.manual_seed(seed)
    return BertModel(tiny_config(layers), add_pooling_layer=False).eval()


@cache
def tokenizer() -> PreTrainedTokenizerBase:
    """The packaged MiniLM tokenizer (checkpoints need one; tiny ids below never go through it)."""
    return AutoTokenizer.from_pretrained(base_model_dir())


def tiny_ranker(
    pooling: str = "cls", tied: bool = False, query_layers: int | None = None, seed: int = 0, prior: bool = False
) -> EarlRanker:
    """An EARL ranker initialised (the paper's way) from `tiny_encoder(seed)`, in eval mode.

    With `prior`, the score head (which starts at zero) gets random weights
    and the prior's scale 7, as if trained, so that both the judger and the
    prior move the scores.
    """
    ranker = EarlRanker.from_encoder(tiny_encoder(seed), tokenizer(), query_layers, pooling, tied, prior)
    if prior:
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            ranker.score.weight.copy_(torch.randn(ranker.score.weight.shape, generator=generator) * INIT)
            ranker.prior_scale.fill_(7.0)
    return ranker


def save_base_encoder(directory: Path, encoder: BertModel) -> Path:
    """`encoder` and the tokenizer saved as a plain encoder directory (no dilstore.json): what from_base reads."""
    encoder.save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return directory


@dataclass(frozen=True)
class Pairs:
    """A padded batch of (query, document) pairs: `[CLS] q [SEP]` and `[CLS] d [SEP]` ids with 1/0 masks."""

    query_ids: torch.Tensor  # (b, nq)
    query_mask: torch.Tensor  # (b, nq)
    doc_ids: torch.Tensor  # (b, n)
    doc_mask: torch.Tensor  # (b, n)

    def example(self, index: int) -> Pairs:
        """Pair `index` alone, with its padding cut off."""
        nq, n = int(self.query_mask[index].sum()), int(self.doc_mask[index].sum())
        return Pairs(
            self.query_ids[index : index + 1, :nq],
            self.query_mask[index : index + 1, :nq],
            self.doc_ids[index : index + 1, :n],
            self.doc_mask[index : index + 1, :n],
        )

    def padded(self, query_extra: int, doc_extra: int, pad_id: int) -> Pairs:
        """The same pairs with `query_extra` and `doc_extra` more padded columns holding `pad_id`."""
        return Pairs(
            _pad_columns(self.query_ids, query_extra, pad_id),
            _pad_columns(self.query_mask, query_extra, 0),
            _pad_columns(self.doc_ids, doc_extra, pad_id),
            _pad_columns(self.doc_mask, doc_extra, 0),
        )


def random_pairs(lengths: list[tuple[int, int]], seed: int = 0, pad_id: int = PAD) -> Pairs:
    """Random words for each (query words, document words), wrapped in [CLS] … [SEP] and padded to the maxima.

    Padded slots hold `pad_id`; pass a word id to prove that what sits in
    padding never matters.
    """
    generator = torch.Generator().manual_seed(seed)
    nq = max(words for words, _ in lengths) + 2
    n = max(words for _, words in lengths) + 2
    query_ids = torch.full((len(lengths), nq), pad_id)
    doc_ids = torch.full((len(lengths), n), pad_id)
    query_mask = torch.zeros((len(lengths), nq), dtype=torch.long)
    doc_mask = torch.zeros((len(lengths), n), dtype=torch.long)
    for row, (query_words, doc_words) in enumerate(lengths):
        for ids, mask, words in ((query_ids, query_mask, query_words), (doc_ids, doc_mask, doc_words)):
            text = torch.randint(FIRST_WORD, VOCAB, (words,), generator=generator)
            ids[row, : words + 2] = torch.cat([torch.tensor([CLS]), text, torch.tensor([SEP])])
            mask[row, : words + 2] = 1
    return Pairs(query_ids, query_mask, doc_ids, doc_mask)


def _pad_columns(tensor: torch.Tensor, extra: int, value: int) -> torch.Tensor:
    return torch.cat([tensor, torch.full((tensor.shape[0], extra), value, dtype=tensor.dtype)], dim=1)
