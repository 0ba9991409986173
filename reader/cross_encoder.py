"""The BERT ranker baseline (seed 004, section 4.2): a cross-encoder over the concatenated query and document.

    `[CLS] q [SEP] d [SEP]` → embeddings (segment 0 for `[CLS] q [SEP]`, 1 for `d [SEP]`, positions from 0)
                            → all l layers over the pair → the [CLS] state → linear → score

Every layer attends across query and document, so nothing can be computed
offline: the accurate, slow end of the comparison. The document part holds
the same word pieces as EARL's `[CLS] d [SEP]` at the same max length
(max_length − 2 pieces, then [SEP]), so the rankers see the same text.

A checkpoint is a directory: config.json, the tokenizer, model.safetensors
and dilstore.json of kind "cross-encoder" with layers = 0 (no layer sees the
texts apart) and num_layers = l (reader/ranker_checkpoints.py).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase

from reader.checkpoints import CheckpointMetadata
from reader.dilbert import HEAD_INIT_SEED
from reader.earl_checkpoints import load_base_encoder, require_supported, write_earl_checkpoint
from reader.qa_batching import pad_token_ids
from reader.ranker_checkpoints import read_ranker_checkpoint
from reader.ranking_inputs import (
    DEFAULT_MAX_DOC_LENGTH,
    DEFAULT_MAX_QUERY_LENGTH,
    group_size,
    module_device,
    score_text_pairs,
)
from reader.tokenization import encode_question, passage_pieces, passage_window
from storage.errors import DilstoreError

KIND = "cross-encoder"
DOCUMENT_SEGMENT = 1


class CrossEncoderRanker(nn.Module):
    """A BERT encoder over `[CLS] q [SEP] d [SEP]` and a linear score on the [CLS] state."""

    kind = KIND

    def __init__(self, config: BertConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__()
        require_supported(config.model_type)
        if config.type_vocab_size < 2:
            raise DilstoreError(
                f"the cross-encoder needs segment embeddings for query and document; this config has "
                f"type_vocab_size {config.type_vocab_size}"
            )
        self.config = config
        self.tokenizer = tokenizer
        self.num_layers: int = config.num_hidden_layers
        self.encoder = BertModel(config, add_pooling_layer=False)
        self.head = nn.Linear(config.hidden_size, 1)

    # ------------------------------------------------------------------ initialising, loading and saving

    @classmethod
    def from_encoder(cls, encoder: BertModel, tokenizer: PreTrainedTokenizerBase) -> CrossEncoderRanker:
        """A new ranker whose encoder is a copy of `encoder` and whose head starts from a fixed seed (eval mode)."""
        base = encoder.base_model
        with torch.random.fork_rng(devices=[]):
            ranker = cls(copy.deepcopy(base.config), tokenizer)
            state = {name: tensor for name, tensor in base.state_dict().items() if not name.startswith("pooler.")}
            ranker.encoder.load_state_dict(state)
            torch.manual_seed(HEAD_INIT_SEED)
            with torch.no_grad():
                nn.init.normal_(ranker.head.weight, std=base.config.initializer_range)
                nn.init.zeros_(ranker.head.bias)
        return ranker.eval()

    @classmethod
    def from_base(cls, path: str | Path) -> CrossEncoderRanker:
        """A new ranker from a plain Hugging Face BERT directory (e.g. base_model_dir())."""
        encoder, tokenizer = load_base_encoder(path)
        return cls.from_encoder(encoder, tokenizer)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> CrossEncoderRanker:
        """Load a ranker saved by `save_pretrained` (fp32, eval mode)."""
        checkpoint = read_ranker_checkpoint(path, KIND)
        with torch.random.fork_rng(devices=[]):
            ranker = cls(checkpoint.config, checkpoint.tokenizer)
        try:
            ranker.load_state_dict(checkpoint.state)
        except RuntimeError as error:
            raise DilstoreError(
                f"{checkpoint.directory}: the weights do not fit this cross-encoder: {error}"
            ) from error
        return ranker.eval()

    def save_pretrained(self, path: str | Path) -> Path:
        """Write config.json, the tokenizer, model.safetensors and dilstore.json into `path`."""
        return write_earl_checkpoint(path, self.config, self.tokenizer, self.state_dict(), self.metadata())

    def metadata(self) -> CheckpointMetadata:
        """dilstore.json: no layer sees query and document apart (layers 0 of l)."""
        return CheckpointMetadata(kind=KIND, architecture=self.config.model_type, layers=0, num_layers=self.num_layers)

    # ------------------------------------------------------------------ tokenization

    def tokenize_query(self, text: str, max_length: int) -> np.ndarray:
        """`[CLS] q [SEP]`, at most `max_length` tokens: the pair's first segment."""
        return encode_question(self.tokenizer, text, max_length).token_ids

    def tokenize_document(self, text: str, max_length: int) -> np.ndarray:
        """`d [SEP]` with at most max_length − 2 word pieces: the same pieces EARL reads at that max length."""
        if max_length < 3:
            raise DilstoreError(f"max_length {max_length} leaves no room for the document ([CLS] d [SEP] needs 3)")
        pieces = passage_pieces(self.tokenizer, text)
        return passage_window(self.tokenizer, pieces, 0, max_length - 2).token_ids

    # ------------------------------------------------------------------ scoring

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """Pairs `[CLS] q [SEP] d [SEP]` (B, L) with segment ids and 1/0 mask (B, L) → scores (B,)."""
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise DilstoreError(
                f"a query–document pair of {input_ids.shape[1]} tokens is longer than this model's "
                f"{self.config.max_position_embeddings} positions; use smaller max lengths"
            )
        hidden = self.encoder(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).last_hidden_state  # (B, L, d)
        return self.head(hidden[:, 0]).squeeze(-1)  # (B,)

    def score_groups(self, queries: Sequence[np.ndarray], groups: Sequence[Sequence[np.ndarray]]) -> torch.Tensor:
        """Query ids (b of them) and g document ids per query → scores (b, g), one pair per row of the encoder."""
        size = group_size(queries, groups)
        pairs, segments = [], []
        for query, group in zip(queries, groups, strict=True):
            for document in group:
                pairs.append(np.concatenate([query, document]))
                segments.append(
                    np.concatenate([np.zeros(len(query), np.int64), np.full(len(document), DOCUMENT_SEGMENT)])
                )
        input_ids, attention_mask = pad_token_ids(pairs, self.tokenizer.pad_token_id)  # (b·g, L) each
        token_type_ids, _ = pad_token_ids(segments, 0)  # (b·g, L)
        device = module_device(self)
        scores = self(input_ids.to(device), token_type_ids.to(device), attention_mask.to(device))  # (b·g,)
        return scores.view(len(queries), size)  # (b, g)

    def score_texts(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        max_query_length: int = DEFAULT_MAX_QUERY_LENGTH,
        max_doc_length: int = DEFAULT_MAX_DOC_LENGTH,
    ) -> torch.Tensor:
        """Scores (b,) of the text pairs (queries[i], documents[i])."""
        return score_text_pairs(self, queries, documents, max_query_length, max_doc_length)
