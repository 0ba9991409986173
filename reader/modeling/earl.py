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

**The bi-encoder prior** (`prior=True`) adds what the base encoder already
knows to the judger's score, so fine-tuning starts from it instead of from a
random head:

    score = prior_scale · cos(mean(query states after layer l), mean(S1)) + judger score

Both means run over valid tokens, [CLS] and [SEP] included, as
sentence-transformers pools. The query's states after layer N continue
through the document module's layers N+1..l (in the tied and the untied
ranker), so at initialisation the query vector is the base encoder's
sentence embedding of the query. `prior_scale` is learned and starts at 20;
the score head starts at zero, so an untrained prior ranker scores exactly
20 × the base model's cosine (CosineBiEncoder's ranking). The document's
mean S1 vector is stored per passage beside S2, which cannot give it back
(passages/vectors, STORE_FORMAT.md).

Initialisation (section 3.4) from a pretrained encoder: the document module
is copy 1 of it; the query module is the first N layers (with embeddings) of
copy 2, and judger block i starts from copy 2's layer N + i, its
cross-attention a separate copy of that layer's self-attention. The tied
variant has no copy-2 query module: the query module is the document
module's embeddings and first N layers, shared parameters. The score head
starts from a fixed seed (at zero with the prior), so loading a base encoder
is reproducible.

`freeze_encoder` holds the encoder copies at their base weights (rounded to
fp16, in eval mode, no gradients): training then moves only the judger
blocks, the head and the prior's scale, so the prior stays the base model's
cosine, and the checkpoint leaves the encoder out, naming the base instead
(reader/modeling/earl_checkpoints.py).

Training and evaluation score (query, document) groups through
`score_groups`, the interface EARL shares with the other rankers
(reader/modeling/ranker_base.py, reader/training/ranking.py).

A checkpoint is a directory: the encoder's config.json, the tokenizer,
model.safetensors (this module's state dict, without the encoder when it is
frozen) and dilstore.json of kind "earl" (reader/modeling/earl_checkpoints.py). Loading, saving and scoring
texts are reader/modeling/ranker_base.py's, as for the baselines.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase

from dilstore.reader.batching import pad_id, pad_token_ids
from dilstore.reader.modeling.architectures import masked_mean
from dilstore.reader.modeling.checkpoints import BaseEncoderReference, CheckpointMetadata
from dilstore.reader.modeling.earl_blocks import JudgerBlock
from dilstore.reader.modeling.earl_checkpoints import (
    KIND,
    base_reference,
    base_weights_sha256,
    load_base_encoder,
    write_earl_checkpoint,
)
from dilstore.reader.modeling.prior import freeze_at_fp16, new_prior_scale, prior_scores
from dilstore.reader.modeling.ranker_base import RankerBase, encode_alone, encoder_weights, init_score_head, run_layers
from dilstore.reader.modeling.ranker_checkpoints import RankerCheckpoint
from dilstore.reader.modeling.ranking_inputs import group_size, module_device
from dilstore.reader.text.tokenization import TokenizedText, encode_document, encode_question
from dilstore.storage.errors import DilstoreError

POOLINGS = ("cls", "mean")
# State-dict prefixes of the encoder copies (document module, untied query module).
ENCODER_PREFIXES = ("document_encoder.", "query_encoder.")


@dataclass(frozen=True)
class EarlConfig:
    """Which EARL variant to build beside the encoder's BertConfig (as nanoGPT's GPTConfig beside GPT).

    `query_layers` is N (None: l − 2, resolved by the ranker, which knows
    the encoder's l; at most l − 1), so that M = l − N judger blocks follow;
    `pooling` is "cls" (ClsPool) or "mean" (AvePool, over valid query
    tokens); `tied` shares the query module with the document module's
    first N layers; `prior` adds the bi-encoder prior (module docstring).
    dilstore.json records these as layers, judger_blocks, pooling, tied and
    prior (reader/modeling/checkpoints.py).
    """

    query_layers: int | None = None
    pooling: str = "cls"
    tied: bool = False
    prior: bool = False

    def __post_init__(self) -> None:
        """Refuse an unknown pooling and a tied or prior that is not a bool; N is checked against l by the ranker."""
        if self.pooling not in POOLINGS:
            raise DilstoreError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if not isinstance(self.tied, bool):
            raise DilstoreError(f"tied must be True or False, got {self.tied!r}")
        if not isinstance(self.prior, bool):
            raise DilstoreError(f"prior must be True or False, got {self.prior!r}")

    @classmethod
    def from_metadata(cls, metadata: CheckpointMetadata) -> EarlConfig:
        """The variant an earl checkpoint's dilstore.json records (no `prior` in files older than it: off)."""
        return cls(
            query_layers=metadata.layers, pooling=metadata.pooling, tied=metadata.tied, prior=bool(metadata.prior)
        )


class EarlRanker(RankerBase):
    """The EARL ranker: document module, query module, M judger blocks and a linear score head.

    `earl` says which variant (EarlConfig). Built from a config the weights
    are random; use `from_encoder`, `from_base` or `from_pretrained` for the
    paper's initialisation or a trained ranker.
    """

    kind = KIND
    description = "EARL ranker"

    def __init__(
        self, config: BertConfig, tokenizer: PreTrainedTokenizerBase, earl: EarlConfig = EarlConfig()
    ) -> None:
        super().__init__(config, tokenizer)
        num_layers = self.num_layers
        query_layers = max(num_layers - 2, 0) if earl.query_layers is None else earl.query_layers
        if not isinstance(query_layers, int) or isinstance(query_layers, bool) or not 0 <= query_layers < num_layers:
            raise DilstoreError(
                f"query_layers (N) must be an integer in 0..{num_layers - 1} for this {num_layers}-layer encoder "
                f"(at least one layer is left for the judger blocks), got {query_layers!r}"
            )
        self.query_layers: int = query_layers
        self.judger_blocks: int = num_layers - query_layers
        self.pooling: str = earl.pooling
        self.tied: bool = earl.tied
        self.prior: bool = earl.prior
        self.hidden_size: int = config.hidden_size
        self.document_encoder = BertModel(config, add_pooling_layer=False)
        self.query_encoder = (
            None if earl.tied else BertModel(_with_layers(config, query_layers), add_pooling_layer=False)
        )
        self.blocks = nn.ModuleList(JudgerBlock(config) for _ in range(self.judger_blocks))
        self.score = nn.Linear(config.hidden_size, 1)
        self.prior_scale = new_prior_scale() if earl.prior else None
        # Set by freeze_encoder: the base the encoder copies are held at, which save_pretrained then leaves out.
        self.base_encoder: BaseEncoderReference | None = None

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
        cls, encoder: BertModel, tokenizer: PreTrainedTokenizerBase, earl: EarlConfig = EarlConfig()
    ) -> EarlRanker:
        """The paper's initialisation from a pretrained BERT encoder (its weights are copied, never shared).

        Leaves the caller's random stream alone; returns the ranker in eval mode.
        """
        return cls._started(encoder, partial(cls, tokenizer=tokenizer, earl=earl))

    @classmethod
    def from_base(cls, path: str | Path, earl: EarlConfig = EarlConfig()) -> EarlRanker:
        """A new ranker from a plain Hugging Face BERT directory (e.g. base_model_dir()), initialised as the paper."""
        encoder, tokenizer = load_base_encoder(path)
        return cls.from_encoder(encoder, tokenizer, earl)

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
            prior=self.prior,
            base_encoder=self.base_encoder,
        )

    @classmethod
    def _built_for(cls, checkpoint: RankerCheckpoint) -> EarlRanker:
        """A fresh ranker of the variant the checkpoint's dilstore.json records."""
        return cls(checkpoint.config, checkpoint.tokenizer, EarlConfig.from_metadata(checkpoint.metadata))

    def _load_checkpoint_state(self, checkpoint: RankerCheckpoint) -> None:
        """The checkpoint's weights; for one saved without its encoder, the encoder comes from the named base.

        The base is loaded, frozen as in training (freeze_encoder) and must
        have the fingerprint dilstore.json recorded; then the saved tensors
        must be exactly the rest of the ranker.
        """
        reference = checkpoint.metadata.base_encoder
        if reference is None:
            super()._load_checkpoint_state(checkpoint)
            return

        def hold(encoder: BertModel) -> nn.Module:
            self._initialise_encoders(encoder)
            self.freeze_encoder(reference.model)
            return self.document_encoder

        self._load_with_named_base(checkpoint, hold, ENCODER_PREFIXES)
        self.base_encoder = reference

    def save_pretrained(self, path: str | Path) -> Path:
        """Write the checkpoint; with a frozen encoder (freeze_encoder), without the encoder's weights.

        Refuses to leave out an encoder that has moved from its base, which
        loading would silently replace.
        """
        if self.base_encoder is None:
            return super().save_pretrained(path)
        moved = self._encoder_reference().weights_sha256 != self.base_encoder.weights_sha256
        if moved or not self._query_copy_is_document_prefix():
            raise DilstoreError(
                f"cannot save to {path} without the encoder: it no longer equals its frozen base "
                f"{self.base_encoder.model}"
            )
        state = {name: tensor for name, tensor in self.state_dict().items() if not name.startswith(ENCODER_PREFIXES)}
        return write_earl_checkpoint(path, self.config, self.tokenizer, state, self.metadata())

    # ------------------------------------------------------------------ freezing the encoder

    def freeze_encoder(self, base: str | Path) -> BaseEncoderReference:
        """Hold the encoder copies at the base model they were initialised from, and return that reference.

        `base` is the base's directory or BASE_MODEL_REF. The copies are
        rounded to fp16 (so the fp32 package and an fp16 copy of it give the
        same ranker anywhere), stop taking gradients and stay in eval mode
        (no dropout: the prior is the base's cosine during training too);
        save_pretrained then writes only the judger blocks, the head and the
        prior's scale. An untied query module must still equal the document
        module's embeddings and first N layers.
        """
        if not self._query_copy_is_document_prefix():
            raise DilstoreError("cannot freeze the encoder: the untied query module differs from the document module")
        freeze_at_fp16(self._encoder_parameters())
        self.base_encoder = self._encoder_reference(base)
        self.train(self.training)
        return self.base_encoder

    def train(self, mode: bool = True) -> EarlRanker:
        """Set training mode; frozen encoder copies (freeze_encoder) always stay in eval mode."""
        super().train(mode)
        if self.base_encoder is not None:
            self.document_encoder.eval()
            if self.query_encoder is not None:
                self.query_encoder.eval()
        return self

    # ------------------------------------------------------------------ tokenization

    def tokenize_queries(self, queries: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`[CLS] q [SEP]` per query, truncated to `max_length`, right-padded: ids and mask, each (b, nq)."""
        return self._pad([encode_question(self.tokenizer, query, max_length) for query in queries])

    def tokenize_documents(self, documents: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`[CLS] d [SEP]` per document, truncated to `max_length`, right-padded: ids and mask, each (b, n)."""
        return self._pad([encode_document(self.tokenizer, document, max_length) for document in documents])

    def tokenize_document(self, text: str, max_length: int) -> np.ndarray:
        """One document as `[CLS] d [SEP]` ids, at most `max_length` (the training and evaluation interface)."""
        return encode_document(self.tokenizer, text, max_length).token_ids

    # ------------------------------------------------------------------ the offline and online halves

    def encode_documents(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Offline: `[CLS] d [SEP]` ids (b, n) and 1/0 mask → S1 states (b, n, d), the document module's output."""
        return encode_alone(self.document_encoder, self.num_layers, input_ids, attention_mask)  # (b, n, d)

    def document_key_values(self, doc_states: torch.Tensor) -> torch.Tensor:
        """Offline: S1 states (b, n, d) → S2 (b, n, M, 2, d), every judger block's cross-attention keys and values."""
        states = doc_states.to(self.dtype)  # (b, n, d)
        return torch.stack([block.cross_attention.key_values(states) for block in self.blocks], dim=2)

    def encode_queries(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Once per query: `[CLS] q [SEP]` ids (b, nq) and mask → query states (b, nq, d) after layer N."""
        return encode_alone(self.query_module, self.query_layers, input_ids, attention_mask)  # (b, nq, d)

    def judge(
        self,
        query_states: torch.Tensor,
        query_mask: torch.Tensor,
        doc_mask: torch.Tensor,
        *,
        doc_states: torch.Tensor | None = None,
        doc_key_values: torch.Tensor | None = None,
        query_vectors: torch.Tensor | None = None,
        doc_vectors: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Online, per pair: the M judger blocks, pooling and the score head (plus the prior) → scores (b,).

        Takes query states (b or 1, nq, d) with mask (b or 1, nq), the document
        mask `doc_mask` (b, n) and exactly one of S1 `doc_states` (b, n, d),
        whose keys and values are projected here, or stored S2
        `doc_key_values` (b, n, M, 2, d). A query batch of 1 is
        broadcast over the b documents; stored tensors of any float dtype are
        cast to the model's dtype.

        A prior ranker adds the prior, from `query_vectors` (b or 1, d) and
        `doc_vectors` (b, d) when given (`query_vectors` and
        `document_vectors`), else from the states: the query's always can be,
        the document's only from S1, so judging S2 needs `doc_vectors` (a
        store's passages/vectors).
        """
        if (doc_states is None) == (doc_key_values is None):
            raise DilstoreError("judge needs exactly one of doc_states (S1) or doc_key_values (S2)")
        batch = doc_mask.shape[0]
        if query_states.shape[0] not in (1, batch):
            raise DilstoreError(f"{query_states.shape[0]} queries cannot be judged against {batch} documents")
        # Before the query is broadcast, so a single query runs its last layers once.
        prior = self._prior_scores(query_states, query_mask, doc_mask, doc_states, query_vectors, doc_vectors)
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
        if query_states.shape[0] == 1 and batch > 1:
            query_states = query_states.expand(batch, -1, -1)  # (b, nq, d)
            query_mask = query_mask.expand(batch, -1)  # (b, nq)
        hidden = query_states.to(self.dtype)  # (b, nq, d)
        for index, block in enumerate(self.blocks):
            hidden = block(hidden, query_mask, key_values[:, :, index], doc_mask)  # (b, nq, d)
        scores = self.score(self._pool(hidden, query_mask)).squeeze(-1)  # (b,)
        return scores if prior is None else scores + prior  # (b,), fp32 with the prior

    def query_vectors(self, query_states: torch.Tensor, query_mask: torch.Tensor) -> torch.Tensor:
        """The prior's query side: states after layer N (b, nq, d) → document module layers N+1..l → mean (b, d)."""
        hidden = query_states.to(self.dtype)  # (b, nq, d)
        hidden = run_layers(self.document_encoder, self.query_layers, self.num_layers, hidden, query_mask)  # (b, nq, d)
        return masked_mean(hidden, query_mask)  # (b, d)

    def document_vectors(self, doc_states: torch.Tensor, doc_mask: torch.Tensor) -> torch.Tensor:
        """The prior's document side: S1 (b, n, d) → fp32 mean over valid tokens (b, d), what a store keeps."""
        return masked_mean(doc_states.float(), doc_mask)  # (b, d)

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
        query_vectors = None
        if self.prior:
            # Once per query, not per pair: the query's last layers only feed the prior.
            query_vectors = self.query_vectors(query_states, query_mask).repeat_interleave(size, dim=0)  # (b·g, d)
        query_states = query_states.repeat_interleave(size, dim=0)  # (b·g, nq, d)
        query_mask = query_mask.repeat_interleave(size, dim=0)  # (b·g, nq)
        scores = self.judge(
            query_states, query_mask, doc_mask, doc_states=doc_states, query_vectors=query_vectors
        )  # (b·g,)
        return scores.view(len(queries), size)  # (b, g)

    # ------------------------------------------------------------------ internals

    def _pool(self, hidden: torch.Tensor, query_mask: torch.Tensor) -> torch.Tensor:
        """Last judger states (b, nq, d) → (b, d): the [CLS] state, or the mean over valid query tokens."""
        if self.pooling == "cls":
            return hidden[:, 0]  # (b, d)
        return masked_mean(hidden, query_mask)  # (b, d)

    def _prior_scores(
        self,
        query_states: torch.Tensor,
        query_mask: torch.Tensor,
        doc_mask: torch.Tensor,
        doc_states: torch.Tensor | None,
        query_vectors: torch.Tensor | None,
        doc_vectors: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """prior_scale · cos(query vector, document vector) in fp32 (b,), or None for a ranker without the prior."""
        if self.prior_scale is None:
            if query_vectors is not None or doc_vectors is not None:
                raise DilstoreError("this EARL ranker has no prior; query_vectors and doc_vectors are not used")
            return None
        if doc_vectors is None:
            if doc_states is None:
                raise DilstoreError(
                    "a prior EARL ranker judging S2 needs doc_vectors, the mean S1 vector of each document "
                    "(a store's passages/vectors)"
                )
            doc_vectors = self.document_vectors(doc_states, doc_mask)  # (b, d)
        if query_vectors is None:
            query_vectors = self.query_vectors(query_states, query_mask)  # (b or 1, d)
        return prior_scores(self.prior_scale, query_vectors, doc_vectors)  # (b,)

    def _encoder_parameters(self) -> list[nn.Parameter]:
        """The encoder copies' parameters: the document module's, and the untied query module's."""
        modules = [self.document_encoder] + ([] if self.query_encoder is None else [self.query_encoder])
        return [parameter for module in modules for parameter in module.parameters()]

    def _query_copy_is_document_prefix(self) -> bool:
        """Whether an untied query module equals the document module's embeddings and first N layers (tied: True).

        Only then does it come back from the base with the document module.
        """
        if self.query_encoder is None:
            return True
        document = dict(self.document_encoder.named_parameters())
        return all(torch.equal(parameter, document[name]) for name, parameter in self.query_encoder.named_parameters())

    def _encoder_reference(self, base: str | Path | None = None) -> BaseEncoderReference:
        """The document module's base fingerprint, named after `base` (default: the recorded base)."""
        weights = base_weights_sha256(self.document_encoder)
        if base is None:
            assert self.base_encoder is not None
            return BaseEncoderReference(model=self.base_encoder.model, weights_sha256=weights)
        return BaseEncoderReference(model=base_reference(base, weights), weights_sha256=weights)

    @torch.no_grad()
    def _initialise_from(self, encoder: BertModel) -> None:
        """Copy 1 → document module, copy 2 → query module and judger blocks; seeded score head (zero with the
        prior)."""
        self._initialise_encoders(encoder)
        for index, block in enumerate(self.blocks):
            block.copy_from(encoder.encoder.layer[self.query_layers + index])
        init_score_head(self.score, self.config.initializer_range)
        if self.prior:
            nn.init.zeros_(self.score.weight)  # the untrained prior ranker scores as the bi-encoder alone

    @torch.no_grad()
    def _initialise_encoders(self, encoder: BertModel) -> None:
        """Copy `encoder`'s weights into the document module and the untied query module (its first N layers)."""
        state = encoder_weights(encoder)
        self.document_encoder.load_state_dict(state)
        if self.query_encoder is not None:
            query_prefixes = ("embeddings.", *(f"encoder.layer.{index}." for index in range(self.query_layers)))
            query_state = {name: tensor for name, tensor in state.items() if name.startswith(query_prefixes)}
            self.query_encoder.load_state_dict(query_state)

    def _pad(self, texts: list[TokenizedText]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad tokenized texts with the tokenizer's pad id: ids and mask, each (b, n) long."""
        if not texts:
            raise DilstoreError("nothing to tokenize: the list of texts is empty")
        return self._pad_ids([text.token_ids for text in texts])

    def _pad_ids(self, sequences: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad token id arrays with the tokenizer's pad id: ids and mask, each (b, n) long."""
        return pad_token_ids(sequences, pad_id(self.tokenizer))


def _with_layers(config: BertConfig, layers: int) -> BertConfig:
    """A copy of `config` with `layers` encoder layers (the query module's own encoder)."""
    truncated = copy.deepcopy(config)
    truncated.num_hidden_layers = layers
    return truncated

