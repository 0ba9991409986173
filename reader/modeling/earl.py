"""EARL: a BERT ranker whose document half runs offline (seed 004, published as MORES).

One module serves both halves (section 3.2). With l encoder layers, N query
layers and M = l − N judger blocks:

    document  `[CLS] d [SEP]` → embeddings (segment 0, positions from 0) → layers 1..l → S1 states  (offline)
              S1 → every judger block's cross-attention keys and values          → S2 (b, n, M, 2, d)  (offline)
    query     `[CLS] q [SEP]` → embeddings (segment 0, positions from 0) → layers 1..N             (once per query)
    judging   query states → M judger blocks over S1 or S2 → pool (CLS or mean) → linear → score   (per pair)

Judger blocks update query tokens only (reader/modeling/earl_blocks.py), so document
states never depend on the query and S1 or S2 can be stored. Judging from S2
skips the document-length × d² key/value projections online and gives the
same scores as judging from S1.

Initialisation (section 3.4) from a pretrained encoder: the document module
is copy 1 of it; the query module is the first N layers (with embeddings) of
copy 2, and judger block i starts from copy 2's layer N + i, its
cross-attention a separate copy of that layer's self-attention. The tied
variant has no copy-2 query module: the query module is the document
module's embeddings and first N layers, shared parameters. The score head
starts from a fixed seed, so loading a base encoder is reproducible.

Training and evaluation score (query, document) groups through
`score_groups` and `score_texts`, the interface EARL shares with its two
baselines (reader/modeling/ranking_inputs.py, reader/training/ranking.py).

A checkpoint is a directory: the encoder's config.json, the tokenizer,
model.safetensors (this module's state dict) and dilstore.json of kind
"earl" (reader/modeling/earl_checkpoints.py). Loading, saving and scoring texts are
reader/modeling/ranker_base.py's, as for the baselines.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase

from dilstore.reader.batching import pad_token_ids
from dilstore.reader.modeling.architectures import architecture_for
from dilstore.reader.modeling.checkpoints import CheckpointMetadata
from dilstore.reader.modeling.dilbert import padding_attention_mask
from dilstore.reader.modeling.earl_blocks import JudgerBlock
from dilstore.reader.modeling.earl_checkpoints import KIND, EarlCheckpoint, read_earl_checkpoint
from dilstore.reader.modeling.ranker_base import RankerBase, encoder_weights, init_score_head
from dilstore.reader.modeling.ranking_inputs import group_size, module_device
from dilstore.reader.text.tokenization import TokenizedText, encode_document, encode_question
from dilstore.storage.errors import DilstoreError

POOLINGS = ("cls", "mean")


class EarlRanker(RankerBase):
    """The EARL ranker: document module, query module, M judger blocks and a linear score head.

    `query_layers` is N (default l − 2, at most l − 1), `judger_blocks` is
    M = l − N, `pooling` is "cls" (ClsPool) or "mean" (AvePool, over valid
    query tokens) and `tied` shares the query module with the document
    module's first N layers. Built from a config the weights are random; use
    `from_encoder`, `from_base` or `from_pretrained` for the paper's
    initialisation or a trained ranker.
    """

    kind = KIND
    description = "EARL ranker"

    def __init__(
        self,
        config: BertConfig,
        tokenizer: PreTrainedTokenizerBase,
        query_layers: int | None = None,
        pooling: str = "cls",
        tied: bool = False,
    ) -> None:
        super().__init__(config, tokenizer)
        num_layers = self.num_layers
        query_layers = max(num_layers - 2, 0) if query_layers is None else query_layers
        if not isinstance(query_layers, int) or isinstance(query_layers, bool) or not 0 <= query_layers < num_layers:
            raise DilstoreError(
                f"query_layers (N) must be an integer in 0..{num_layers - 1} for this {num_layers}-layer encoder "
                f"(at least one layer is left for the judger blocks), got {query_layers!r}"
            )
        if pooling not in POOLINGS:
            raise DilstoreError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if not isinstance(tied, bool):
            raise DilstoreError(f"tied must be True or False, got {tied!r}")
        self.query_layers: int = query_layers
        self.judger_blocks: int = num_layers - query_layers
        self.pooling: str = pooling
        self.tied: bool = tied
        self.hidden_size: int = config.hidden_size
        self.document_encoder = BertModel(config, add_pooling_layer=False)
        self.query_encoder = None if tied else BertModel(_with_layers(config, query_layers), add_pooling_layer=False)
        self.blocks = nn.ModuleList(JudgerBlock(config) for _ in range(self.judger_blocks))
        self.score = nn.Linear(config.hidden_size, 1)

    @property
    def query_module(self) -> BertModel:
        """The encoder whose embeddings and first N layers are the query module: the document module's when tied."""
        return self.document_encoder if self.query_encoder is None else self.query_encoder

    @property
    def layers(self) -> int:
        """The split point a store's fingerprint records: the query layers N."""
        return self.query_layers

    def fingerprinted_network(self) -> tuple[BertConfig, nn.Module]:
        """The config and the module whose weights a store's fingerprint hashes: the whole ranker."""
        return self.config, self

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights; stored states are cast to it."""
        return self.score.weight.dtype

    # ------------------------------------------------------------------ initialising, loading and saving

    @classmethod
    def from_encoder(
        cls,
        encoder: BertModel,
        tokenizer: PreTrainedTokenizerBase,
        query_layers: int | None = None,
        pooling: str = "cls",
        tied: bool = False,
    ) -> EarlRanker:
        """The paper's initialisation from a pretrained BERT encoder (its weights are copied, never shared).

        Leaves the caller's random stream alone; returns the ranker in eval mode.
        """
        return super().from_encoder(encoder, tokenizer, query_layers, pooling, tied)

    @classmethod
    def from_base(
        cls, path: str | Path, query_layers: int | None = None, pooling: str = "cls", tied: bool = False
    ) -> EarlRanker:
        """A new ranker from a plain Hugging Face BERT directory (e.g. base_model_dir()), initialised as the paper."""
        return super().from_base(path, query_layers, pooling, tied)

    def metadata(self) -> CheckpointMetadata:
        """What dilstore.json records for this ranker."""
        return CheckpointMetadata(
            kind=self.kind,
            architecture=self.config.model_type,
            layers=self.query_layers,
            num_layers=self.num_layers,
            judger_blocks=self.judger_blocks,
            pooling=self.pooling,
            tied=self.tied,
        )

    @classmethod
    def _read_checkpoint(cls, path: str | Path) -> EarlCheckpoint:
        """An earl checkpoint, whose metadata must also describe the judger blocks."""
        return read_earl_checkpoint(path)

    @classmethod
    def _checkpoint_options(cls, metadata: CheckpointMetadata) -> tuple[int, str | None, bool | None]:
        """N, pooling and tying as dilstore.json records them."""
        return metadata.layers, metadata.pooling, metadata.tied

    # ------------------------------------------------------------------ tokenization

    def tokenize_queries(self, queries: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`[CLS] q [SEP]` per query, truncated to `max_length`, right-padded: ids and mask, each (b, nq)."""
        return self._pad([encode_question(self.tokenizer, query, max_length) for query in queries])

    def tokenize_documents(self, documents: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`[CLS] d [SEP]` per document, truncated to `max_length`, right-padded: ids and mask, each (b, n)."""
        return self._pad([encode_document(self.tokenizer, document, max_length) for document in documents])

    def tokenize_query(self, text: str, max_length: int) -> np.ndarray:
        """One query as `[CLS] q [SEP]` ids, at most `max_length` (the training and evaluation interface)."""
        return encode_question(self.tokenizer, text, max_length).token_ids

    def tokenize_document(self, text: str, max_length: int) -> np.ndarray:
        """One document as `[CLS] d [SEP]` ids, at most `max_length` (the training and evaluation interface)."""
        return encode_document(self.tokenizer, text, max_length).token_ids

    # ------------------------------------------------------------------ the offline and online halves

    def encode_documents(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Offline: `[CLS] d [SEP]` ids (b, n) and 1/0 mask → S1 states (b, n, d), the document module's output."""
        return self._encode(self.document_encoder, self.num_layers, input_ids, attention_mask)

    def document_key_values(self, doc_states: torch.Tensor) -> torch.Tensor:
        """Offline: S1 states (b, n, d) → S2 (b, n, M, 2, d), every judger block's cross-attention keys and values."""
        states = doc_states.to(self.dtype)  # (b, n, d)
        return torch.stack([block.cross_attention.key_values(states) for block in self.blocks], dim=2)

    def encode_queries(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Once per query: `[CLS] q [SEP]` ids (b, nq) and mask → query states (b, nq, d) after layer N."""
        return self._encode(self.query_module, self.query_layers, input_ids, attention_mask)

    def judge(
        self,
        query_states: torch.Tensor,
        query_mask: torch.Tensor,
        doc_mask: torch.Tensor,
        *,
        doc_states: torch.Tensor | None = None,
        doc_key_values: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Online, per pair: the M judger blocks, pooling and the score head → scores (b,).

        Takes query states (b or 1, nq, d) with mask (b or 1, nq), the document
        mask `doc_mask` (b, n) and exactly one of S1 `doc_states` (b, n, d),
        whose keys and values are projected here, or stored S2
        `doc_key_values` (b, n, M, 2, d). A query batch of 1 is
        broadcast over the b documents; stored tensors of any float dtype are
        cast to the model's dtype.
        """
        if (doc_states is None) == (doc_key_values is None):
            raise DilstoreError("judge needs exactly one of doc_states (S1) or doc_key_values (S2)")
        if doc_key_values is None:
            key_values = self.document_key_values(doc_states)  # (b, n, M, 2, d)
        else:
            expected = (self.judger_blocks, 2, self.hidden_size)
            if doc_key_values.dim() != 5 or tuple(doc_key_values.shape[2:]) != expected:
                raise DilstoreError(
                    f"doc_key_values must be (b, n, {', '.join(map(str, expected))}) for this ranker, "
                    f"got {tuple(doc_key_values.shape)}"
                )
            key_values = doc_key_values.to(self.dtype)  # (b, n, M, 2, d)
        batch = key_values.shape[0]
        if query_states.shape[0] == 1 and batch > 1:
            query_states = query_states.expand(batch, -1, -1)  # (b, nq, d)
            query_mask = query_mask.expand(batch, -1)  # (b, nq)
        elif query_states.shape[0] != batch:
            raise DilstoreError(f"{query_states.shape[0]} queries cannot be judged against {batch} documents")
        hidden = query_states.to(self.dtype)  # (b, nq, d)
        for index, block in enumerate(self.blocks):
            hidden = block(hidden, query_mask, key_values[:, :, index], doc_mask)  # (b, nq, d)
        return self.score(self._pool(hidden, query_mask)).squeeze(-1)  # (b,)

    def forward(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        doc_ids: torch.Tensor,
        doc_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The unsplit training path: ids and masks (b, nq) and (b, n) → scores (b,), judged from S1."""
        query_states = self.encode_queries(query_ids, query_mask)  # (b, nq, d)
        doc_states = self.encode_documents(doc_ids, doc_mask)  # (b, n, d)
        return self.judge(query_states, query_mask, doc_mask, doc_states=doc_states)

    def score_groups(self, queries: Sequence[np.ndarray], groups: Sequence[Sequence[np.ndarray]]) -> torch.Tensor:
        """Query ids (b of them) and g document ids per query → scores (b, g), judged from S1.

        The training forward over (b, 1 + n) groups and evaluation's
        per-query candidate lists: each query is encoded once and its states
        are repeated over its g documents.
        """
        size = group_size(queries, groups)
        device = module_device(self)
        query_ids, query_mask = self._pad_ids(list(queries))  # (b, nq) each
        doc_ids, doc_mask = self._pad_ids([document for group in groups for document in group])  # (b·g, n) each
        query_ids, query_mask, doc_ids, doc_mask = (t.to(device) for t in (query_ids, query_mask, doc_ids, doc_mask))
        query_states = self.encode_queries(query_ids, query_mask)  # (b, nq, d)
        doc_states = self.encode_documents(doc_ids, doc_mask)  # (b·g, n, d)
        query_states = query_states.repeat_interleave(size, dim=0)  # (b·g, nq, d)
        query_mask = query_mask.repeat_interleave(size, dim=0)  # (b·g, nq)
        scores = self.judge(query_states, query_mask, doc_mask, doc_states=doc_states)  # (b·g,)
        return scores.view(len(queries), size)  # (b, g)

    # ------------------------------------------------------------------ internals

    def _encode(
        self, encoder: BertModel, layers: int, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """One text alone: the encoder's embeddings (segment 0, positions from 0) → its layers 1..`layers`."""
        batch, length = input_ids.shape
        if length > self.config.max_position_embeddings:
            raise DilstoreError(
                f"a text of {length} tokens is longer than this model's {self.config.max_position_embeddings} "
                "positions; use a smaller max length"
            )
        bert = architecture_for("bert")
        position_ids = torch.arange(length, device=input_ids.device).expand(batch, length)  # (b, n)
        hidden = bert.embed(encoder, input_ids, position_ids, segment=0)  # (b, n, d)
        additive = padding_attention_mask(attention_mask, length, hidden.dtype)  # (b, 1, n, n)
        for index in range(layers):
            hidden = bert.run_layer(encoder, index, hidden, additive)  # (b, n, d)
        return hidden

    def _pool(self, hidden: torch.Tensor, query_mask: torch.Tensor) -> torch.Tensor:
        """Last judger states (b, nq, d) → (b, d): the [CLS] state, or the mean over valid query tokens."""
        if self.pooling == "cls":
            return hidden[:, 0]  # (b, d)
        weights = query_mask.to(hidden.dtype).unsqueeze(-1)  # (b, nq, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (b, d)

    @torch.no_grad()
    def _initialise_from(self, encoder: BertModel) -> None:
        """Copy 1 → document module, copy 2 → query module and judger blocks; seeded score head."""
        state = encoder_weights(encoder)
        self.document_encoder.load_state_dict(state)
        if self.query_encoder is not None:
            query_prefixes = ("embeddings.", *(f"encoder.layer.{index}." for index in range(self.query_layers)))
            query_state = {name: tensor for name, tensor in state.items() if name.startswith(query_prefixes)}
            self.query_encoder.load_state_dict(query_state)
        for index, block in enumerate(self.blocks):
            block.copy_from(encoder.encoder.layer[self.query_layers + index])
        init_score_head(self.score, self.config.initializer_range)

    def _pad(self, texts: list[TokenizedText]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad tokenized texts with the tokenizer's pad id: ids and mask, each (b, n) long."""
        if not texts:
            raise DilstoreError("nothing to tokenize: the list of texts is empty")
        return self._pad_ids([text.token_ids for text in texts])

    def _pad_ids(self, sequences: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad token id arrays with the tokenizer's pad id: ids and mask, each (b, n) long."""
        if self.tokenizer.pad_token_id is None:
            raise DilstoreError(f"{type(self.tokenizer).__name__} has no pad token, which batching needs")
        return pad_token_ids(sequences, self.tokenizer.pad_token_id)


def _with_layers(config: BertConfig, layers: int) -> BertConfig:
    """A copy of `config` with `layers` encoder layers (the query module's own encoder)."""
    truncated = copy.deepcopy(config)
    truncated.num_hidden_layers = layers
    return truncated

