"""The BERT-Siamese ranker baseline (seed 004, section 4.2): one embedding per text, dot product as the score.

    query     `[CLS] q [SEP]` → embeddings (segment 0, positions 0..) → l layers → mean over valid tokens → q (d,)
    document  `[CLS] d [SEP]` → the same encoder, the same way                                    → e (d,)
    score     q · e

One encoder serves both texts (Reimers and Gurevych's Siamese network). The
score is the dot product, as the seed's baseline ranks by, not the cosine:
an unnormalised score has no fixed range, so the hinge margin and the
softmax need no temperature. Mean pooling counts [CLS] and [SEP] as
sentence-transformers does, so the packaged all-MiniLM-L6-v2 starts as the
sentence embedder it was trained to be (up to its normalisation). The
document embedding depends on the document alone: the efficient, less
accurate end of the comparison.

A checkpoint is a directory: config.json, the tokenizer, model.safetensors
and dilstore.json of kind "siamese" with layers = num_layers = l (every
layer sees the texts apart) and pooling "mean" (reader/modeling/ranker_checkpoints.py).
Starting, loading, saving and scoring texts are reader/modeling/ranker_base.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase

from dilstore.reader.batching import pad_id, pad_token_ids
from dilstore.reader.modeling.architectures import masked_mean, require_positions
from dilstore.reader.modeling.checkpoints import CheckpointMetadata
from dilstore.reader.modeling.ranker_base import RankerBase, encoder_weights
from dilstore.reader.modeling.ranker_checkpoints import RankerCheckpoint, read_ranker_checkpoint
from dilstore.reader.modeling.ranking_inputs import group_size, module_device
from dilstore.reader.text.tokenization import encode_document
from dilstore.storage.errors import DilstoreError

KIND = "siamese"
POOLING = "mean"


class SiameseRanker(RankerBase):
    """A BERT encoder shared by queries and documents; mean-pooled embeddings scored by dot product."""

    kind = KIND
    description = "Siamese ranker"

    def __init__(self, config: BertConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__(config, tokenizer)
        self.encoder = BertModel(config, add_pooling_layer=False)

    # ------------------------------------------------------------------ metadata, initialisation and loading

    def metadata(self) -> CheckpointMetadata:
        """dilstore.json: every layer sees query and document apart (layers l of l), mean pooling."""
        return CheckpointMetadata(
            kind=KIND,
            architecture=self.config.model_type,
            layers=self.num_layers,
            num_layers=self.num_layers,
            pooling=POOLING,
        )

    def _initialise_from(self, encoder: BertModel) -> None:
        """The encoder becomes a copy of `encoder`."""
        self.encoder.load_state_dict(encoder_weights(encoder))

    @classmethod
    def _read_checkpoint(cls, path: str | Path) -> RankerCheckpoint:
        """A siamese checkpoint, which must also record the mean pooling this ranker applies."""
        checkpoint = read_ranker_checkpoint(path, KIND)
        if checkpoint.metadata.pooling != POOLING:
            raise DilstoreError(
                f"{checkpoint.directory}: a siamese checkpoint must say pooling {POOLING!r}, "
                f"got {checkpoint.metadata.pooling!r}"
            )
        return checkpoint

    # ------------------------------------------------------------------ tokenization

    def tokenize_document(self, text: str, max_length: int) -> np.ndarray:
        """`[CLS] d [SEP]`, at most `max_length` tokens (the document's first pieces)."""
        return encode_document(self.tokenizer, text, max_length).token_ids

    # ------------------------------------------------------------------ scoring

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Texts (b, n) with 1/0 mask (b, n) → embeddings (b, d): the mean of the last states over valid tokens."""
        require_positions(self.config, input_ids.shape[1])
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (b, n, d)
        return masked_mean(hidden, attention_mask)  # (b, d)

    def forward(
        self, query_ids: torch.Tensor, query_mask: torch.Tensor, doc_ids: torch.Tensor, doc_mask: torch.Tensor
    ) -> torch.Tensor:
        """Pairs: query ids and mask (b, nq), document ids and mask (b, n) → scores (b,)."""
        return (self.embed(query_ids, query_mask) * self.embed(doc_ids, doc_mask)).sum(dim=-1)  # (b,)

    def score_groups(self, queries: Sequence[np.ndarray], groups: Sequence[Sequence[np.ndarray]]) -> torch.Tensor:
        """Query ids (b of them) and g document ids per query → scores (b, g); each text is embedded once."""
        size = group_size(queries, groups)
        device = module_device(self)
        pad = pad_id(self.tokenizer)
        query_ids, query_mask = pad_token_ids(list(queries), pad)  # (b, nq) each
        doc_ids, doc_mask = pad_token_ids([doc for group in groups for doc in group], pad)
        query_vectors = self.embed(query_ids.to(device), query_mask.to(device))  # (b, d)
        doc_vectors = self.embed(doc_ids.to(device), doc_mask.to(device))  # (b·g, d)
        doc_vectors = doc_vectors.view(len(queries), size, -1)  # (b, g, d)
        return torch.einsum("bd,bgd->bg", query_vectors, doc_vectors)  # (b, g)


class CosineBiEncoder(SiameseRanker):
    """The Siamese network scored by the cosine of its embeddings, as sentence-transformers ranks.

    Used untrained over all-MiniLM-L6-v2, it is the published reference the
    issue quotes (DL19 nDCG@10 0.642 reranking the BM25 top-100), so the
    evaluation path can be checked against a number measured elsewhere.
    Checkpoints record no similarity, so it is never saved.
    """

    description = "cosine bi-encoder"

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Texts (b, n) with 1/0 mask (b, n) → unit-length mean embeddings (b, d)."""
        return torch.nn.functional.normalize(super().embed(input_ids, attention_mask), dim=-1)  # (b, d)

    def save_pretrained(self, path: str | Path) -> Path:
        """Refused: a saved checkpoint would load back as the dot-product Siamese ranker."""
        raise DilstoreError(f"{path}: the cosine bi-encoder is an evaluation reference and is never saved")
