"""What the trainable rankers share around their networks: starting, loading, saving and scoring texts.

EARL (reader/modeling/earl.py), the cross-encoder (reader/modeling/cross_encoder.py), the
Siamese ranker (reader/modeling/siamese.py) and the Listformer (reader/modeling/listformer.py)
differ in their networks, in how they take over a pretrained encoder's weights and in the
dilstore.json they write. How each starts from a base encoder directory, loads and saves a
checkpoint directory and scores text pairs is the same, so it is written
once here; RankerBase is also the scoring interface training and evaluation rely on.

Each ranker tokenizes a query and a document on its own, once (so training
and evaluation tokenize every paragraph a single time), and scores groups of
documents per query:

    tokenize_query(text, max_length)       → int ids, `[CLS] q [SEP]` (every ranker's query convention)
    tokenize_document(text, max_length)    → int ids (the ranker's own document convention)
    score_groups(queries, groups)          → scores (b, g): b queries, g documents each
    score_texts(queries, documents, ...)   → scores (b,) of b (query, document) text pairs

Training scores groups of 1 positive and n negatives, (b, 1 + n); evaluation
scores one query's candidates as one group, so EARL encodes that query once
and the Listformer reads the whole candidate list in one pass. Around them:

    from_encoder     copy the encoder's config, build the ranker, `_initialise_from` its weights
    from_base        from_encoder over a plain Hugging Face BERT directory (load_base_encoder)
    from_pretrained  `_read_checkpoint`, build the ranker it describes (`_built_for`), `_load_checkpoint_state`,
                     and take the query length it was trained with (`trained_query_length`)
    save_pretrained  config.json, tokenizer, model.safetensors and `metadata()` as dilstore.json
"""

from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Self

import numpy as np
import torch
from torch import nn
from transformers import BertConfig, BertModel, PreTrainedTokenizerBase

from dilstore.reader.modeling.architectures import HEAD_INIT_SEED, architecture_for
from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE, CheckpointMetadata, resolve_base_model
from dilstore.reader.modeling.earl_checkpoints import (
    base_weights_sha256,
    load_base_encoder,
    require_supported,
    write_earl_checkpoint,
)
from dilstore.reader.modeling.ranker_checkpoints import RankerCheckpoint, read_ranker_checkpoint
from dilstore.reader.modeling.ranking_inputs import DEFAULT_MAX_DOC_LENGTH, DEFAULT_MAX_QUERY_LENGTH
from dilstore.reader.text.tokenization import encode_query
from dilstore.storage.errors import DilstoreError


class RankerBase(nn.Module, ABC):
    """A ranker module built as `cls(config, tokenizer)` (EARL: and an EarlConfig), saved as a checkpoint directory.

    A subclass sets `kind` (its dilstore.json kind) and `description` (how
    errors name it), and implements `tokenize_document`, `score_groups`,
    `metadata` and `_initialise_from`.
    """

    kind: str
    description: str

    def __init__(self, config: BertConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        """Keep the encoder's config, its l layers and the tokenizer; refuse a model type no ranker supports."""
        super().__init__()
        require_supported(config.model_type)
        self.config = config
        self.tokenizer = tokenizer
        self.num_layers: int = config.num_hidden_layers
        # Query tokens ([CLS] and [SEP] included) the ranker was trained with; serving keeps the same.
        self.max_query_length: int = DEFAULT_MAX_QUERY_LENGTH

    @classmethod
    def from_encoder(cls, encoder: BertModel, tokenizer: PreTrainedTokenizerBase) -> Self:
        """A new ranker over a copy of `encoder`'s config, initialised from its weights (eval mode).

        The weights are copied, never shared, and the caller's random stream is left alone.
        """
        return cls._started(encoder, partial(cls, tokenizer=tokenizer))

    @classmethod
    def from_base(cls, path: str | Path) -> Self:
        """A new ranker from a plain Hugging Face BERT directory (e.g. base_model_dir()), as `from_encoder`."""
        encoder, tokenizer = load_base_encoder(path)
        return cls.from_encoder(encoder, tokenizer)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Self:
        """Load a ranker saved by `save_pretrained` (eval mode); its variant comes from its dilstore.json.

        Weights are upcast to fp32 whatever dtype they were stored in.
        """
        checkpoint = cls._read_checkpoint(path)
        with torch.random.fork_rng(devices=[]):
            ranker = cls._built_for(checkpoint)
        ranker._load_checkpoint_state(checkpoint)
        ranker.max_query_length = trained_query_length(Path(path))
        return ranker.eval()

    def save_pretrained(self, path: str | Path) -> Path:
        """Write config.json, the tokenizer, model.safetensors and dilstore.json into `path`."""
        return write_earl_checkpoint(path, self.config, self.tokenizer, self.state_dict(), self.metadata())

    def tokenize_query(self, text: str, max_length: int) -> np.ndarray:
        """One query as `[CLS] q [SEP]` ids, at most `max_length` tokens: every ranker reads queries so."""
        return encode_query(self.tokenizer, text, max_length).token_ids

    def score_texts(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        max_query_length: int = DEFAULT_MAX_QUERY_LENGTH,
        max_doc_length: int = DEFAULT_MAX_DOC_LENGTH,
    ) -> torch.Tensor:
        """Scores (b,) of the text pairs (queries[i], documents[i]), each tokenized and truncated on its own."""
        if len(queries) != len(documents):
            raise DilstoreError(f"{len(queries)} queries but {len(documents)} documents to pair them with")
        query_ids = [self.tokenize_query(query, max_query_length) for query in queries]
        groups = [[self.tokenize_document(document, max_doc_length)] for document in documents]
        return self.score_groups(query_ids, groups)[:, 0]  # (b,)

    @abstractmethod
    def tokenize_document(self, text: str, max_length: int) -> np.ndarray:
        """One document's int ids, at most `max_length` tokens, in the ranker's own document convention."""

    @abstractmethod
    def score_groups(self, queries: Sequence[np.ndarray], groups: Sequence[Sequence[np.ndarray]]) -> torch.Tensor:
        """Scores (b, g) of b queries' ids against g documents' ids each (one group per query)."""

    @abstractmethod
    def metadata(self) -> CheckpointMetadata:
        """What dilstore.json records for this ranker."""

    @abstractmethod
    def _initialise_from(self, encoder: BertModel) -> None:
        """Take over the weights of the pretrained `encoder` (a BertModel of this ranker's config)."""

    @classmethod
    def _read_checkpoint(cls, path: str | Path) -> RankerCheckpoint:
        """The checkpoint directory `path`, read and checked as one of this `kind`."""
        return read_ranker_checkpoint(path, cls.kind)

    @classmethod
    def _built_for(cls, checkpoint: RankerCheckpoint) -> Self:
        """A fresh ranker (random weights) of the variant the checkpoint records; the baselines have no variants."""
        return cls(checkpoint.config, checkpoint.tokenizer)

    @classmethod
    def _started(cls, encoder: BertModel, build: Callable[[BertConfig], Self]) -> Self:
        """`build` over a copy of `encoder`'s config, initialised from its weights, in eval mode.

        `build` is the constructor with everything but the config bound (the
        tokenizer, EARL's variant). The caller's random stream is left alone.
        """
        base = encoder.base_model
        with torch.random.fork_rng(devices=[]):
            ranker = build(copy.deepcopy(base.config))
            ranker._initialise_from(base)
        return ranker.eval()

    def _load_with_named_base(
        self, checkpoint: RankerCheckpoint, hold: Callable[[BertModel], nn.Module], left_out: tuple[str, ...]
    ) -> None:
        """Load a checkpoint saved without the encoder it holds frozen, which dilstore.json names as its base.

        `hold` puts the base encoder into the ranker, frozen as in training, and
        returns the module whose fingerprint must be the one dilstore.json
        recorded; then the saved tensors must be exactly the ranker's other
        weights (none under the `left_out` state-dict prefixes).
        """
        reference = checkpoint.metadata.base_encoder
        assert reference is not None
        base = resolve_base_model(reference.model)
        if not base.is_dir():  # it said "model directory not found: BASE", a folder the user never gave
            raise DilstoreError(f"{checkpoint.directory} holds no encoder weights of its own: its dilstore.json names "
                                f"the base encoder {base}, which is not there (put the base it was trained from back "
                                "there)")  # fmt: skip
        encoder, _ = load_base_encoder(base)
        try:
            frozen = hold(encoder)
        except RuntimeError as error:
            raise DilstoreError(
                f"{checkpoint.directory}: its base encoder {reference.model} does not fit this {self.description}: "
                f"{error}"
            ) from error
        found = base_weights_sha256(frozen)
        if found != reference.weights_sha256:
            raise DilstoreError(
                f"{checkpoint.directory} was trained over base encoder {reference.model} with weights "
                f"{reference.weights_sha256[:12]}, but {base} has weights "
                f"{found[:12]}; install the base it was trained from"
            )
        missing, unexpected = self.load_state_dict(checkpoint.state, strict=False)
        stray = [name for name in missing if not name.startswith(left_out)] + list(unexpected)
        stray += [name for name in checkpoint.state if name.startswith(left_out)]
        if stray:
            raise DilstoreError(
                f"{checkpoint.directory}: the weights do not fit this {self.description} without its frozen base "
                f"encoder: {', '.join(sorted(stray)[:5])}"
            )

    def _load_checkpoint_state(self, checkpoint: RankerCheckpoint) -> None:
        """Put the checkpoint's weights into this freshly built ranker; every weight must fit exactly."""
        try:
            self.load_state_dict(checkpoint.state)
        except RuntimeError as error:
            raise DilstoreError(
                f"{checkpoint.directory}: the weights do not fit this {self.description}: {error}"
            ) from error


def encode_alone(
    encoder: BertModel, layers: int, input_ids: torch.Tensor, attention_mask: torch.Tensor, segment: int = 0
) -> torch.Tensor:
    """One text alone: ids (b, n) with 1/0 mask → embeddings (`segment`, positions from 0) → layers 1..`layers`.

    The states (b, n, d) of EARL's document and query modules and of the
    Listformer's delayed layers; a text longer than the encoder's positions
    raises DilstoreError.
    """
    return architecture_for("bert").encode_segment(encoder, input_ids, attention_mask, segment, layers)  # (b, n, d)


def run_layers(
    encoder: BertModel, first: int, stop: int, hidden: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """States (b, n, d) with 1/0 mask (b, n) through the encoder's layers first+1..stop → (b, n, d)."""
    return architecture_for("bert").run_layers(encoder, first, stop, hidden, attention_mask)  # (b, n, d)


def encoder_weights(encoder: BertModel) -> dict[str, torch.Tensor]:
    """`encoder`'s state dict without its pooler, which no ranker has."""
    return {name: tensor for name, tensor in encoder.state_dict().items() if not name.startswith("pooler.")}


def init_score_head(head: nn.Linear, std: float) -> None:
    """Weights from N(0, std²) under the fixed HEAD_INIT_SEED and zero bias, so a fresh ranker is reproducible.

    The caller's random stream is left alone.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(HEAD_INIT_SEED)
        nn.init.normal_(head.weight, std=std)
    nn.init.zeros_(head.bias)


def trained_query_length(path: Path) -> int:
    """The query length a checkpoint was trained with (its training record's config), else DEFAULT_MAX_QUERY_LENGTH.

    One value serves training and serving: a ranker reranks queries cut the
    way it saw them. A checkpoint without a training record (or one that
    names no length) gets the default that training uses.
    """
    record = path / TRAINING_METADATA_FILE
    if not record.is_file():
        return DEFAULT_MAX_QUERY_LENGTH
    try:
        length = json.loads(record.read_text(encoding="utf-8")).get("config", {}).get("max_query_length")
    except (ValueError, AttributeError, RecursionError) as error:  # deep nesting: hostile46 F4
        raise DilstoreError(f"{record}: not a training record ({error})") from error
    if length is None:
        return DEFAULT_MAX_QUERY_LENGTH
    if isinstance(length, bool) or not isinstance(length, int) or length < 3:
        raise DilstoreError(f"{record}: config.max_query_length must be an integer of at least 3, got {length!r}")
    return length
