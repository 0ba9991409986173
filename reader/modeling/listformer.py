"""Listformer: a listwise BERT reranker over one query and a whole candidate list in one pass (seed 003).

The input is one query and D documents, each document closed by a separator:

    `[CLS] q [SEP]`  `d₁ [SEP]`  `d₂ [SEP]` …  `d_D [SEP]`
     segment 0        segment 1 (every document), positions restart at 0 in each document

**Global-local attention** (section 3.1). Global tokens are every query token
([CLS] and the query's [SEP] included) and every document's separator: all
tokens attend to them. The query tokens attend to all tokens. A document's
tokens, its separator included, attend to their own document and to the
global tokens, so a separator sums up its own document in the light of the
query and of the other documents' separators: the thesis's intuition for
the separator. Its letter, separators attending to every token, gives every
separator one attention over one set of keys; in the plain Listformer (k = 0)
the separators of two documents of one length then start from the same
embedding at the same position and stay equal through every layer, so such
documents score alike whatever they say. Positions are document-wise, so
nothing tells a document where it sits in the list: a document's score does
not depend on its place, and permuting the documents permutes the scores.

**Blocked, not dense.** No N×N mask over the list is ever built. A layer
runs two attentions over the BERT layer's own query/key/value weights:

    local   documents as a batch dimension: each document's n tokens over
            its own n tokens + the nq query tokens + the D separators
            (its own separator is among its own tokens, so that copy is masked)
    global  the nq query tokens over all nq + D·n tokens

then BERT's attention output, feed-forward and LayerNorms position by
position. Attention memory is D·n·(n + nq + D) + nq·(nq + D·n) scores per
head: linear in the list length while D stays below n (the D separators
are keys of every document, which adds the D² term). The local attention
runs over blocks of documents (LOCAL_BLOCK_KEYS key rows each), so the
keys and values each document sees are copied a block at a time, never
for the whole list at once.

**Scores** come from each document's separator after the last layer:
r_j = W · s_j + b (section 3.1).

**The bi-encoder prior** (`prior=True`, reader/modeling/prior.py) adds the
base encoder's own sentence similarity to each document's score:

    r_j = W · s_j + b + prior_scale · cos(mean(base(`[CLS] q [SEP]`)), mean(base(`[CLS] d_j [SEP]`)))

from a second copy of the base encoder (`prior_encoder`) held frozen at its
base weights, so training moves the Listformer and the scale but never the
prior. The score head starts at zero, so an untrained prior Listformer ranks
exactly as the bi-encoder. A document's vector does not depend on the query
or the list: precompute stores it per passage (`passages/vectors`), and
online only the query runs through the prior encoder. A checkpoint leaves
the prior encoder out and names its base instead (`base_encoder` in
dilstore.json), as a frozen EARL does.

**The delayed Listformer** (`delayed_layers` = k, 0 ≤ k < l): in layers
1..k the query and each document attend only to themselves, so a
document's states after layer k do not depend on the query or on the other
documents and can be stored (`dilstore precompute --kind listformer`).
Online, the query runs layers 1..k alone, and layers k+1..l apply
global-local attention over the query and the stored documents. k = 0 is
the plain Listformer.

    offline   `d [SEP]` → embeddings (segment 1, positions from 0) → layers 1..k   (encode_documents)
              with the prior: `[CLS] d [SEP]` → prior encoder → mean              (document_vectors)
    online    `[CLS] q [SEP]` → embeddings (segment 0) → layers 1..k             (encode_queries)
              with the prior: `[CLS] q [SEP]` → prior encoder → mean              (query_vectors)
              query + D stored documents → global-local layers k+1..l → separators → scores  (score_lists)

Initialisation from a pretrained encoder: the encoder is a copy of it (all
its weights are reused: embeddings, query/key/value, attention output,
intermediate, output and LayerNorms); the score head starts from a fixed
seed (at zero with the prior). A checkpoint is a directory: config.json, the
tokenizer, model.safetensors and dilstore.json of kind "listformer" with
layers = k, num_layers = l and `prior` (reader/modeling/ranker_checkpoints.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase
from transformers.models.bert.modeling_bert import BertLayer, BertSelfAttention

from dilstore.reader.batching import pad_id, pad_token_ids
from dilstore.reader.modeling.architectures import masked_mean
from dilstore.reader.modeling.checkpoints import BaseEncoderReference, CheckpointMetadata
from dilstore.reader.modeling.earl_checkpoints import (
    base_reference,
    base_weights_sha256,
    load_base_encoder,
    write_earl_checkpoint,
)
from dilstore.reader.modeling.prior import freeze_at_fp16, new_prior_scale, prior_scores
from dilstore.reader.modeling.ranker_base import RankerBase, encode_alone, encoder_weights, init_score_head
from dilstore.reader.modeling.ranker_checkpoints import RankerCheckpoint
from dilstore.reader.modeling.ranking_inputs import group_size, module_device
from dilstore.reader.text.tokenization import first_passage_window
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import LISTFORMER

KIND = LISTFORMER
QUERY_SEGMENT = 0
DOCUMENT_SEGMENT = 1
PRIOR_PREFIX = "prior_encoder."
LOCAL_BLOCK_KEYS = 32_768  # key rows (lists × documents × (n + nq + D)) per block of the local attention


@dataclass(frozen=True)
class ListformerConfig:
    """Which Listformer to build beside the encoder's BertConfig.

    `delayed_layers` is k (0: the plain Listformer), checked against the
    encoder's l by the ranker (0 ≤ k < l); `prior` adds the bi-encoder prior
    (module docstring). dilstore.json records them as `layers` and `prior`.
    """

    delayed_layers: int = 0
    prior: bool = False

    def __post_init__(self) -> None:
        """Refuse a k that is not a non-negative integer, and a prior that is not a bool."""
        k = self.delayed_layers
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise DilstoreError(f"delayed_layers (k) must be a non-negative integer, got {k!r}")
        if not isinstance(self.prior, bool):
            raise DilstoreError(f"prior must be True or False, got {self.prior!r}")

    @classmethod
    def from_metadata(cls, metadata: CheckpointMetadata) -> ListformerConfig:
        """The variant a listformer checkpoint's dilstore.json records (no `prior`: off)."""
        return cls(delayed_layers=metadata.layers, prior=bool(metadata.prior))


class ListformerRanker(RankerBase):
    """One encoder whose layers k+1..l attend global-locally over a query and its document list, and a score head.

    Built from a config the weights are random; use `from_encoder`,
    `from_base` or `from_pretrained` for a pretrained or trained ranker.
    """

    kind = KIND
    description = "Listformer ranker"

    def __init__(
        self, config: BertConfig, tokenizer: PreTrainedTokenizerBase, listformer: ListformerConfig = ListformerConfig()
    ) -> None:
        super().__init__(config, tokenizer)
        if config.type_vocab_size < 2:
            raise DilstoreError(
                f"the Listformer needs segment embeddings for query and documents; this config has "
                f"type_vocab_size {config.type_vocab_size}"
            )
        if listformer.delayed_layers >= self.num_layers:
            raise DilstoreError(
                f"delayed_layers (k) must be in 0..{self.num_layers - 1} for this {self.num_layers}-layer encoder "
                f"(at least one layer must see the list), got {listformer.delayed_layers}"
            )
        self.delayed_layers: int = listformer.delayed_layers
        self.prior: bool = listformer.prior
        # The id the prior puts before a `d [SEP]` document: the tokenizer's [CLS].
        self.cls_token_id: int | None = tokenizer.cls_token_id
        self.hidden_size: int = config.hidden_size
        self.encoder = BertModel(config, add_pooling_layer=False)
        self.score = nn.Linear(config.hidden_size, 1)
        self.prior_encoder = BertModel(config, add_pooling_layer=False) if listformer.prior else None
        if self.prior_encoder is not None:
            self.prior_encoder.requires_grad_(False)  # the prior stays the base's: never trained
        self.prior_scale = new_prior_scale() if listformer.prior else None
        # The base the prior encoder is held at (set by from_base), which save_pretrained then leaves out.
        self.base_encoder: BaseEncoderReference | None = None

    @property
    def layers(self) -> int:
        """The split point a store's fingerprint records: the delayed layers k."""
        return self.delayed_layers

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights; stored states are cast to it."""
        return self.score.weight.dtype

    def fingerprinted_network(self) -> tuple[BertConfig, nn.Module]:
        """The config and the module whose weights a store's fingerprint hashes: the whole ranker."""
        return self.config, self

    # ------------------------------------------------------------------ initialising, loading and saving

    @classmethod
    def from_encoder(
        cls,
        encoder: BertModel,
        tokenizer: PreTrainedTokenizerBase,
        listformer: ListformerConfig = ListformerConfig(),
    ) -> ListformerRanker:
        """A new ranker over a copy of `encoder`'s weights (never shared); eval mode, caller's RNG untouched."""
        return cls._started(encoder, partial(cls, tokenizer=tokenizer, listformer=listformer))

    @classmethod
    def from_base(cls, path: str | Path, listformer: ListformerConfig = ListformerConfig()) -> ListformerRanker:
        """A new ranker from a plain Hugging Face BERT directory (e.g. base_model_dir()).

        With the prior, its checkpoints name this base instead of storing the prior encoder.
        """
        encoder, tokenizer = load_base_encoder(path)
        ranker = cls.from_encoder(encoder, tokenizer, listformer)
        if ranker.prior_encoder is not None:
            weights = base_weights_sha256(ranker.prior_encoder)
            ranker.base_encoder = BaseEncoderReference(model=base_reference(path, weights), weights_sha256=weights)
        return ranker

    def metadata(self) -> CheckpointMetadata:
        """dilstore.json: kind listformer, layers = k, num_layers = l, prior, and the prior encoder's base."""
        return CheckpointMetadata(
            kind=KIND,
            architecture=self.config.model_type,
            layers=self.delayed_layers,
            num_layers=self.num_layers,
            prior=self.prior,
            base_encoder=self.base_encoder,
        )

    def train(self, mode: bool = True) -> ListformerRanker:
        """Set training mode; the frozen prior encoder always stays in eval mode (no dropout in the prior)."""
        super().train(mode)
        if self.prior_encoder is not None:
            self.prior_encoder.eval()
        return self

    @classmethod
    def _built_for(cls, checkpoint: RankerCheckpoint) -> ListformerRanker:
        """A fresh ranker with the k the checkpoint's dilstore.json records."""
        return cls(checkpoint.config, checkpoint.tokenizer, ListformerConfig.from_metadata(checkpoint.metadata))

    @torch.no_grad()
    def _initialise_from(self, encoder: BertModel) -> None:
        """The encoder (and the prior encoder, frozen) become copies of `encoder`; the score head starts seeded.

        With the prior the head starts at zero, so the untrained ranker scores as the bi-encoder alone.
        """
        self.encoder.load_state_dict(encoder_weights(encoder))
        init_score_head(self.score, self.config.initializer_range)
        if self.prior_encoder is not None:
            self._hold_prior_encoder(encoder)
            nn.init.zeros_(self.score.weight)

    def _hold_prior_encoder(self, encoder: BertModel) -> None:
        """The prior encoder becomes a frozen fp16-rounded copy of `encoder` (reader/modeling/prior.py)."""
        assert self.prior_encoder is not None
        self.prior_encoder.load_state_dict(encoder_weights(encoder))
        freeze_at_fp16(self.prior_encoder.parameters())
        self.prior_encoder.eval()

    def _load_checkpoint_state(self, checkpoint: RankerCheckpoint) -> None:
        """The checkpoint's weights; a prior encoder it left out comes from the named base, fingerprint checked."""
        reference = checkpoint.metadata.base_encoder
        if reference is None or self.prior_encoder is None:
            super()._load_checkpoint_state(checkpoint)
            return

        def hold(encoder: BertModel) -> nn.Module:
            self._hold_prior_encoder(encoder)
            assert self.prior_encoder is not None
            return self.prior_encoder

        self._load_with_named_base(checkpoint, hold, (PRIOR_PREFIX,))
        self.base_encoder = reference

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.float16) -> Path:
        """Write the checkpoint with its floating-point weights as `dtype`: fp16 by default (half the size).

        Training keeps fp32 in its periodic checkpoints, so that a resumed
        run continues exactly; loading upcasts to fp32 either way. A prior
        encoder held at a named base (from_base) is left out.
        """
        leave_out = PRIOR_PREFIX if self.base_encoder is not None else None
        state = {
            name: tensor.to(dtype) if tensor.is_floating_point() else tensor
            for name, tensor in self.state_dict().items()
            if leave_out is None or not name.startswith(leave_out)
        }
        return write_earl_checkpoint(path, self.config, self.tokenizer, state, self.metadata())

    # ------------------------------------------------------------------ tokenization

    def tokenize_document(self, text: str, max_length: int) -> np.ndarray:
        """`d [SEP]` with at most max_length − 1 word pieces: the first window precompute stores of it."""
        if max_length < 2:
            raise DilstoreError(f"max_length {max_length} leaves no room for a document (d [SEP] needs 2)")
        return first_passage_window(self.tokenizer, text, max_length - 1).token_ids

    # ------------------------------------------------------------------ the offline and online halves

    def encode_documents(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Offline: `d [SEP]` ids (b, n) and 1/0 mask → states after layer k (b, n, d), each document alone."""
        return encode_alone(self.encoder, self.delayed_layers, input_ids, attention_mask, DOCUMENT_SEGMENT)

    def encode_queries(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Once per query: `[CLS] q [SEP]` ids (b, nq) and mask → states after layer k (b, nq, d), the query alone."""
        return encode_alone(self.encoder, self.delayed_layers, input_ids, attention_mask, QUERY_SEGMENT)

    def query_vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The prior's query side: `[CLS] q [SEP]` ids (b, nq) and mask → the prior encoder's mean, fp32 (b, d)."""
        return self._prior_vectors(input_ids, attention_mask)

    def document_vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The prior's document side: `d [SEP]` ids (b, n) and mask → mean of `[CLS] d [SEP]`, fp32 (b, d).

        What a store keeps per passage (passages/vectors): it depends on the document alone.
        """
        batch = input_ids.shape[0]
        cls = torch.full((batch, 1), self._cls_id(), dtype=input_ids.dtype, device=input_ids.device)  # (b, 1)
        ids = torch.cat([cls, input_ids], dim=1)  # (b, 1 + n)
        mask = torch.cat([torch.ones_like(cls), attention_mask.to(input_ids.dtype)], dim=1)  # (b, 1 + n)
        return self._prior_vectors(ids, mask)

    def score_lists(
        self,
        query_states: torch.Tensor,
        query_mask: torch.Tensor,
        doc_states: torch.Tensor,
        doc_mask: torch.Tensor,
        query_vectors: torch.Tensor | None = None,
        doc_vectors: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Online: layers k+1..l over B lists (encode_lists), then each document's separator → scores (B, D).

        A prior ranker also needs the prior's `query_vectors` (B, d) and
        `doc_vectors` (B, D, d) (query_vectors, document_vectors; a store's
        passages/vectors); its scores are fp32.
        """
        prior = self._prior_scores(query_vectors, doc_vectors)  # (B, D) or None
        _, doc_hidden = self.encode_lists(query_states, query_mask, doc_states, doc_mask)  # (B, D, n, d)
        separators = doc_mask.sum(dim=-1) - 1  # (B, D)
        scores = self.score(gather_separators(doc_hidden, separators)).squeeze(-1)  # (B, D)
        return scores if prior is None else scores + prior  # (B, D)

    def encode_lists(
        self,
        query_states: torch.Tensor,
        query_mask: torch.Tensor,
        doc_states: torch.Tensor,
        doc_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Online: the global-local layers k+1..l → the query's (B, nq, d) and the documents' (B, D, n, d) last states.

        Takes query states after layer k (B, nq, d) with 1/0 mask (B, nq) and
        document states after layer k (B, D, n, d) with mask (B, D, n). Each
        document's valid tokens come first and end with its separator;
        stored states of any float dtype are cast to the model's dtype.
        """
        separators = self._separators(query_states, query_mask, doc_states, doc_mask)  # (B, D)
        layout = ListLayout(query_mask, doc_mask, separators)
        query_hidden = query_states.to(self.dtype)  # (B, nq, d)
        doc_hidden = doc_states.to(self.dtype)  # (B, D, n, d)
        for index in range(self.delayed_layers, self.num_layers):
            query_hidden, doc_hidden = global_local_layer(
                self.encoder.encoder.layer[index], query_hidden, doc_hidden, layout
            )  # (B, nq, d), (B, D, n, d)
        return query_hidden, doc_hidden

    def forward(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        doc_ids: torch.Tensor,
        doc_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The unsplit path: query ids and mask (B, nq), document ids and mask (B, D, n) → scores (B, D)."""
        if doc_ids.dim() != 3 or doc_mask.shape != doc_ids.shape:
            raise DilstoreError(
                f"document ids and mask must both be (lists, documents, tokens), got {tuple(doc_ids.shape)} "
                f"and {tuple(doc_mask.shape)}"
            )
        lists, documents, _ = doc_ids.shape
        query_states = self.encode_queries(query_ids, query_mask)  # (B, nq, d)
        doc_states = self.encode_documents(doc_ids.flatten(0, 1), doc_mask.flatten(0, 1))  # (B·D, n, d)
        doc_states = doc_states.unflatten(0, (lists, documents))  # (B, D, n, d)
        vectors = {}
        if self.prior:
            vectors["query_vectors"] = self.query_vectors(query_ids, query_mask)  # (B, d)
            doc_vectors = self.document_vectors(doc_ids.flatten(0, 1), doc_mask.flatten(0, 1))  # (B·D, d)
            vectors["doc_vectors"] = doc_vectors.unflatten(0, (lists, documents))  # (B, D, d)
        return self.score_lists(query_states, query_mask, doc_states, doc_mask, **vectors)

    def score_groups(self, queries: Sequence[np.ndarray], groups: Sequence[Sequence[np.ndarray]]) -> torch.Tensor:
        """Query ids (b of them) and g document ids per query → scores (b, g): each group is one list, one pass."""
        size = group_size(queries, groups)
        pad = pad_id(self.tokenizer)
        query_ids, query_mask = pad_token_ids(list(queries), pad)  # (b, nq) each
        doc_ids, doc_mask = pad_token_ids([document for group in groups for document in group], pad)  # (b·g, n)
        device = module_device(self)
        return self(
            query_ids.to(device),
            query_mask.to(device),
            doc_ids.view(len(queries), size, -1).to(device),  # (b, g, n)
            doc_mask.view(len(queries), size, -1).to(device),  # (b, g, n)
        )  # (b, g)

    # ------------------------------------------------------------------ internals

    def _prior_vectors(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """`[CLS] text [SEP]` ids (b, n) and mask through the whole prior encoder → fp32 mean (b, d)."""
        if self.prior_encoder is None:
            raise DilstoreError("this Listformer has no prior; it has no prior vectors")
        with torch.no_grad():
            states = encode_alone(self.prior_encoder, self.num_layers, input_ids, attention_mask)  # (b, n, d)
        return masked_mean(states.float(), attention_mask)  # (b, d)

    def _prior_scores(
        self, query_vectors: torch.Tensor | None, doc_vectors: torch.Tensor | None
    ) -> torch.Tensor | None:
        """prior_scale · cos(query vector, each document vector) (B, D), or None for a ranker without the prior."""
        if self.prior_scale is None:
            if query_vectors is not None or doc_vectors is not None:
                raise DilstoreError("this Listformer has no prior; query_vectors and doc_vectors are not used")
            return None
        if query_vectors is None or doc_vectors is None:
            raise DilstoreError(
                "a prior Listformer needs query_vectors and doc_vectors (query_vectors, document_vectors; "
                "a store's passages/vectors)"
            )
        if doc_vectors.dim() != 3 or query_vectors.shape != (doc_vectors.shape[0], doc_vectors.shape[2]):
            raise DilstoreError(
                f"prior vectors must be (lists, d) and (lists, documents, d), got {tuple(query_vectors.shape)} "
                f"and {tuple(doc_vectors.shape)}"
            )
        return prior_scores(self.prior_scale, query_vectors.unsqueeze(1), doc_vectors)  # (B, D)

    def _cls_id(self) -> int:
        """The [CLS] id the prior puts before a `d [SEP]` document (cls_token_id)."""
        if self.cls_token_id is None:
            raise DilstoreError(f"{type(self.tokenizer).__name__} has no [CLS] token, which the prior needs")
        return int(self.cls_token_id)

    def _separators(
        self, query_states: torch.Tensor, query_mask: torch.Tensor, doc_states: torch.Tensor, doc_mask: torch.Tensor
    ) -> torch.Tensor:
        """Each document's separator index (B, D): its last valid token; a DilstoreError for inputs that do not fit."""
        if doc_states.dim() != 4 or doc_states.shape[-1] != self.hidden_size:
            raise DilstoreError(
                f"document states must be (lists, documents, tokens, {self.hidden_size}), got {tuple(doc_states.shape)}"
            )
        if tuple(doc_mask.shape) != tuple(doc_states.shape[:3]):
            raise DilstoreError(f"document mask {tuple(doc_mask.shape)} does not fit states {tuple(doc_states.shape)}")
        lists = doc_states.shape[0]
        if query_states.dim() != 3 or query_states.shape[0] != lists or query_mask.shape != query_states.shape[:2]:
            raise DilstoreError(
                f"query states {tuple(query_states.shape)} with mask {tuple(query_mask.shape)} do not fit "
                f"{lists} document lists"
            )
        lengths = doc_mask.sum(dim=-1)  # (B, D)
        if bool((lengths < 1).any()) or bool((query_mask.sum(dim=-1) < 1).any()):
            raise DilstoreError("every query and every document needs at least one token (its separator)")
        positions = torch.arange(doc_mask.shape[-1], device=doc_mask.device)  # (n,)
        if not torch.equal(doc_mask.bool(), positions < lengths.unsqueeze(-1)):
            raise DilstoreError("document masks must hold each document's tokens first, then padding")
        return lengths - 1  # (B, D)


@dataclass(frozen=True)
class ListLayout:
    """Where the tokens of B lists stand, the same in every global-local layer: masks and separators.

    `query_mask` (B, nq) and `doc_mask` (B, D, n) are 1/0 masks, each
    document's valid tokens first; `separators` (B, D) is each document's
    separator index, its last valid token.
    """

    query_mask: torch.Tensor  # (B, nq)
    doc_mask: torch.Tensor  # (B, D, n)
    separators: torch.Tensor  # (B, D)


def global_local_layer(
    layer: BertLayer, query_states: torch.Tensor, doc_states: torch.Tensor, layout: ListLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """One BERT layer with global-local attention: query (B, nq, d) and documents (B, D, n, d) → the same shapes.

    The attention is global_local_attention over the layer's own weights;
    the attention output (dense, dropout, residual, LayerNorm) and the
    feed-forward are the layer's own modules, applied token by token, and to
    the documents' valid tokens only: a list pads every document to its
    longest, and the feed-forward over the padding took most of the time and
    memory of a list of passages of mixed lengths. Padding states come out 0
    (no attention reads them: they are masked as keys, and their own rows are
    never used).
    """
    query_context, doc_context = global_local_attention(
        layer.attention.self, query_states, doc_states, layout
    )  # (B, nq, d), (B, D, n, d)
    query_hidden = layer.attention.output(query_context, query_states)  # (B, nq, d)
    query_out = layer.output(layer.intermediate(query_hidden), query_hidden)  # (B, nq, d)
    valid = layout.doc_mask.bool()  # (B, D, n)
    doc_hidden = layer.attention.output(doc_context[valid], doc_states[valid])  # (T, d): the T valid tokens
    doc_out = doc_states.new_zeros(doc_states.shape)  # (B, D, n, d)
    doc_out[valid] = layer.output(layer.intermediate(doc_hidden), doc_hidden)  # (T, d) into their places
    return query_out, doc_out


def global_local_attention(
    attention: BertSelfAttention, query_states: torch.Tensor, doc_states: torch.Tensor, layout: ListLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head global-local attention over a BERT self-attention's weights, blocked (module docstring).

    Query states (B, nq, d) and document states (B, D, n, d), laid out as
    `layout` says → the attention contexts of the query (B, nq, d) and of
    the documents (B, D, n, d), heads concatenated, before BERT's output dense.
    """
    query_mask, doc_mask, separators = layout.query_mask, layout.doc_mask, layout.separators
    lists, documents, length, width = doc_states.shape
    heads, head_size = attention.num_attention_heads, attention.attention_head_size
    dropout = attention.dropout.p if attention.training else 0.0

    def by_head(states: torch.Tensor) -> torch.Tensor:
        return states.unflatten(-1, (heads, head_size)).transpose(-3, -2)  # (..., t, d) → (..., h, t, hs)

    query_q, query_k, query_v = (by_head(p(query_states)) for p in (attention.query, attention.key, attention.value))
    # query_*: (B, h, nq, hs)
    doc_q, doc_k, doc_v = (by_head(p(doc_states)) for p in (attention.query, attention.key, attention.value))
    # doc_*: (B, D, h, n, hs)
    at_separator = separators[:, :, None, None, None].expand(lists, documents, heads, 1, head_size)  # (B, D, h, 1, hs)
    sep_k, sep_v = (t.gather(3, at_separator).squeeze(3).transpose(1, 2) for t in (doc_k, doc_v))
    # sep_*: (B, h, D, hs)

    # Local: documents as a batch dimension, each over its own tokens, the query tokens and every separator.
    shared_k, shared_v = torch.cat([query_k, sep_k], dim=2), torch.cat([query_v, sep_v], dim=2)  # (B, h, nq + D, hs)

    def local_keys(doc: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
        """A block of b documents' keys (or values): (B, b, h, n, hs) and the shared ones → (B, b, h, n+nq+D, hs)."""
        return torch.cat([doc, shared.unsqueeze(1).expand(-1, doc.shape[1], -1, -1, -1)], dim=3)

    own_separator = torch.eye(documents, dtype=torch.bool, device=doc_mask.device)  # (D, D)
    local_allowed = torch.cat(
        [
            doc_mask.bool(),  # (B, D, n)
            query_mask.bool().unsqueeze(1).expand(-1, documents, -1),  # (B, D, nq)
            ~own_separator.expand(lists, -1, -1),  # (B, D, D): the own separator is already among the own tokens
        ],
        dim=-1,
    )  # (B, D, n + nq + D)
    # Documents in blocks: each block's keys and values are copied out of the shared ones, so memory stays that
    # of LOCAL_BLOCK_KEYS key rows, not D·(n + nq + D) (rank48 F2: 3.6 GiB at 1,000 documents of 64 tokens).
    step = max(1, LOCAL_BLOCK_KEYS // (lists * local_allowed.shape[-1]))  # documents per block
    local = torch.cat([
        F.scaled_dot_product_attention(
            doc_q[:, block].flatten(0, 1),  # (B·b, h, n, hs)
            local_keys(doc_k[:, block], shared_k).flatten(0, 1),  # (B·b, h, n + nq + D, hs)
            local_keys(doc_v[:, block], shared_v).flatten(0, 1),  # (B·b, h, n + nq + D, hs)
            attn_mask=local_allowed[:, block].flatten(0, 1)[:, None, None, :],  # (B·b, 1, 1, n + nq + D)
            dropout_p=dropout,
        ).unflatten(0, (lists, -1))  # (B, b, h, n, hs)
        for block in (slice(start, start + step) for start in range(0, documents, step))
    ], dim=1)  # fmt: skip  # (B, D, h, n, hs)
    doc_context = local.transpose(2, 3).reshape(lists, documents, length, width)  # (B, D, n, d)

    # Global: the query tokens over every token of the list. (A separator's row is its local one above.)
    global_allowed = torch.cat([query_mask.bool(), doc_mask.bool().flatten(1)], dim=-1)  # (B, nq + D·n)
    every = partial(torch.cat, dim=2)  # joins (B, h, ·, hs) pieces along their tokens
    glob = F.scaled_dot_product_attention(
        query_q,  # (B, h, nq, hs)
        every([query_k, doc_k.transpose(1, 2).flatten(2, 3)]),  # (B, h, nq + D·n, hs)
        every([query_v, doc_v.transpose(1, 2).flatten(2, 3)]),  # (B, h, nq + D·n, hs)
        attn_mask=global_allowed[:, None, None, :],  # (B, 1, 1, nq + D·n)
        dropout_p=dropout,
    )  # (B, h, nq, hs)
    query_context = glob.transpose(1, 2).flatten(2)  # (B, nq, d)
    return query_context, doc_context


def gather_separators(doc_states: torch.Tensor, separators: torch.Tensor) -> torch.Tensor:
    """Document states (B, D, n, d) and separator indices (B, D) → the separators' states (B, D, d)."""
    index = separators[:, :, None, None].expand(-1, -1, 1, doc_states.shape[-1])  # (B, D, 1, d)
    return doc_states.gather(2, index).squeeze(2)  # (B, D, d)

