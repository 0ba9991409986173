"""The BERT ranker baseline (seed 004, section 4.2): a cross-encoder over the concatenated query and document.

    `[CLS] q [SEP] d [SEP]` → embeddings (segment 0 for `[CLS] q [SEP]`, 1 for `d [SEP]`, positions from 0)
                            → all l layers over the pair → the [CLS] state → linear → score

Every layer attends across query and document, so nothing can be computed
offline: the accurate, slow end of the comparison. The document part holds
the same word pieces as EARL's `[CLS] d [SEP]` at the same max length
(max_length − 2 pieces, then [SEP]), so the rankers see the same text.

A checkpoint is a directory: config.json, the tokenizer, model.safetensors
and dilstore.json of kind "cross-encoder" with layers = 0 (no layer sees the
texts apart) and num_layers = l (reader/modeling/ranker_checkpoints.py). Starting,
loading, saving and scoring texts are reader/modeling/ranker_base.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase

from dilstore.reader.batching import pad_id, pad_token_ids
from dilstore.reader.modeling.checkpoints import CheckpointMetadata
from dilstore.reader.modeling.ranker_base import RankerBase, encoder_weights, init_score_head
from dilstore.reader.modeling.ranking_inputs import group_size, module_device
from dilstore.reader.text.tokenization import first_passage_window
from dilstore.storage.errors import DilstoreError

KIND = "cross-encoder"
DOCUMENT_SEGMENT = 1


class CrossEncoderRanker(RankerBase):
    """A BERT encoder over `[CLS] q [SEP] d [SEP]` and a linear score on the [CLS] state."""

    kind = KIND
    description = "cross-encoder"

    def __init__(self, config: BertConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__(config, tokenizer)
        if config.type_vocab_size < 2:
            raise DilstoreError(
                f"the cross-encoder needs segment embeddings for query and document; this config has "
                f"type_vocab_size {config.type_vocab_size}"
            )
        self.encoder = BertModel(config, add_pooling_layer=False)
        self.head = nn.Linear(config.hidden_size, 1)

    # ------------------------------------------------------------------ metadata and initialisation

    def metadata(self) -> CheckpointMetadata:
        """dilstore.json: no layer sees query and document apart (layers 0 of l)."""
        return CheckpointMetadata(kind=KIND, architecture=self.config.model_type, layers=0, num_layers=self.num_layers)

    @torch.no_grad()
    def _initialise_from(self, encoder: BertModel) -> None:
        """The encoder becomes a copy of `encoder`; the head starts from a fixed seed."""
        self.encoder.load_state_dict(encoder_weights(encoder))
        init_score_head(self.head, self.config.initializer_range)

    # ------------------------------------------------------------------ tokenization

    def tokenize_document(self, text: str, max_length: int) -> np.ndarray:
        """`d [SEP]` with at most max_length − 2 word pieces: the same pieces EARL reads at that max length."""
        if max_length < 3:
            raise DilstoreError(f"max_length {max_length} leaves no room for the document ([CLS] d [SEP] needs 3)")
        return first_passage_window(self.tokenizer, text, max_length - 2).token_ids

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
        input_ids, attention_mask = pad_token_ids(pairs, pad_id(self.tokenizer))  # (b·g, L) each
        token_type_ids, _ = pad_token_ids(segments, 0)  # (b·g, L)
        device = module_device(self)
        scores = self(input_ids.to(device), token_type_ids.to(device), attention_mask.to(device))  # (b·g,)
        return scores.view(len(queries), size)  # (b, g)
