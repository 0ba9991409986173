"""How DilBert reaches into each supported Hugging Face encoder: one small adapter per architecture.

The delayed-interaction reader never re-implements attention. It calls the
Hugging Face model's own embedding module, its own encoder layer modules and
its own QA head. What differs between architectures is only where those
modules live and which position and segment ids they expect:

| model_type  | embeddings                | layer i (0-based)                                   | segment ids (q, p) | first position  |
|-------------|---------------------------|-----------------------------------------------------|--------------------|-----------------|
| bert        | bert.embeddings           | bert.encoder.layer[i]                               | 0, 1               | 0               |
| albert      | albert.embeddings + proj  | albert.encoder.albert_layer_groups[group(i)]        | 0, 1               | 0               |
| distilbert  | distilbert.embeddings     | distilbert.transformer.layer[i]                     | none               | 0               |
| roberta     | roberta.embeddings        | roberta.encoder.layer[i]                            | 0, 0               | pad_token_id+1  |

BERT covers MiniLM and multilingual BERT (same model_type). ALBERT shares
weights: its l layers reuse `num_hidden_groups` layer groups, and its
embeddings are projected from `embedding_size` to `hidden_size`
(`encoder.embedding_hidden_mapping_in`) before layer 1. RoBERTa has a token
type vocabulary of 1, so both segments use 0.

Every layer module is called as `module(hidden_states, attention_mask)` with
an additive float mask of shape (batch, 1, queries, keys): 0 where attention
is allowed and the dtype's minimum elsewhere. Both the "eager" and the "sdpa"
attention implementations of transformers 5 accept that form.
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from dilstore.storage.errors import DilstoreError
from dilstore.storage.messages import shown

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
# A new head (a QA head on a base model, a ranker's score head) is initialised from this seed, so loading is
# reproducible.
HEAD_INIT_SEED = 0


@dataclass(frozen=True)
class Architecture:
    """What differs between the supported encoders: segment ids plus small accessors.

    `first_position(config)` is the position id of a segment's first token;
    `layer_module(model, i)` returns the module that computes encoder layer
    i (0-based) of a *ForQuestionAnswering model; `project(model, embeddings)`
    maps the embedding output to the hidden size (identity except for ALBERT);
    `head_dropout(model)` is the dropout the QA model applies before its head.
    """

    model_type: str
    question_segment: int | None
    passage_segment: int | None
    first_position: Callable[[PreTrainedConfig], int]
    layer_module: Callable[[PreTrainedModel, int], nn.Module]
    project: Callable[[PreTrainedModel, torch.Tensor], torch.Tensor]
    head_dropout: Callable[[PreTrainedModel], nn.Module]

    def embed(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        segment: int | None,
    ) -> torch.Tensor:
        """Token ids (b, n) → input states of layer 1 (b, n, hidden), through the model's own embeddings."""
        embeddings = model.base_model.embeddings
        if segment is None:
            states = embeddings(input_ids=input_ids, position_ids=position_ids)  # (b, n, hidden)
        else:
            token_type_ids = torch.full_like(input_ids, segment)  # (b, n)
            states = embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids)
        return self.project(model, states)  # (b, n, hidden)

    def run_layer(
        self, model: PreTrainedModel, index: int, hidden_states: torch.Tensor, additive_mask: torch.Tensor
    ) -> torch.Tensor:
        """Encoder layer `index` (0-based) over (b, n, hidden) states with an additive (b, 1, n, n) mask."""
        output = self.layer_module(model, index)(hidden_states, additive_mask)
        # transformers 5 layers return a tensor; a tuple's first item is the hidden states in any release.
        return output[0] if isinstance(output, tuple) else output  # (b, n, hidden)

    def run_layers(
        self, model: PreTrainedModel, first: int, stop: int, hidden: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """States (b, n, hidden) with 1/0 mask (b, n) through encoder layers first+1..stop → (b, n, hidden)."""
        additive = padding_attention_mask(attention_mask, hidden.shape[1], hidden.dtype)  # (b, 1, n, n)
        for index in range(first, stop):
            hidden = self.run_layer(model, index, hidden, additive)  # (b, n, hidden)
        return hidden

    def encode_segment(
        self, model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, segment: int | None,
        stop: int,
    ) -> torch.Tensor:  # fmt: skip
        """One segment alone: ids (b, n) with 1/0 mask → embeddings (positions from the model's first, `segment`'s
        type id) → layers 1..`stop` (b, n, hidden).

        This is the delayed-interaction rule of ARCHITECTURE.md (each segment's
        positions restart at the first): DilBert's passage and question
        halves, EARL's document and query modules and the Listformer's delayed
        layers all run it, so a rule for a new architecture reaches all of them.
        """
        batch, length = input_ids.shape
        first = self.first_position(model.config)
        require_positions(model.config, length, first)
        positions = torch.arange(first, first + length, device=input_ids.device)  # (n,)
        hidden = self.embed(model, input_ids, positions.expand(batch, length), segment)  # (b, n, hidden)
        return self.run_layers(model, 0, stop, hidden, attention_mask)  # (b, n, hidden)


def segment_positions(config: PreTrainedConfig) -> int:
    """The most tokens one segment may hold: the positions the encoder embeds (`max_position_embeddings`) from
    the architecture's first one on (RoBERTa's segments start at pad_token_id + 1, so two fewer)."""
    return int(config.max_position_embeddings) - architecture_for(config.model_type).first_position(config)


def require_segment_limit(config: PreTrainedConfig, limit: int, text: str, flag: str) -> None:
    """A DilstoreError, before any work, if a `text` of `limit` tokens (the `flag` option) would not fit the model's
    segment positions; found late, it stopped a long run at the first long input, without naming `flag`."""
    positions = segment_positions(config)
    if limit > positions:
        raise DilstoreError(f"the {text} limit {shown(limit)} ({flag}) is more than this model's {positions} positions")


def require_positions(config: PreTrainedConfig, length: int, first: int = 0) -> None:
    """A DilstoreError when a text of `length` tokens, positioned from `first`, has no room in the model."""
    if first + length > config.max_position_embeddings:
        raise DilstoreError(
            f"a text of {length} tokens is longer than this model's {config.max_position_embeddings - first} "
            "positions; use a smaller max length"
        )


def padding_attention_mask(key_mask: torch.Tensor, queries: int, dtype: torch.dtype) -> torch.Tensor:
    """A (b, keys) 1/0 validity mask → the additive (b, 1, queries, keys) mask every layer takes.

    0 where the key is a real token, the dtype's minimum where it is padding,
    the form both the eager and the sdpa attention of transformers 5 accept.
    """
    allowed = key_mask.bool()[:, None, None, :]  # (b, 1, 1, keys)
    additive = torch.zeros(allowed.shape, dtype=dtype, device=key_mask.device)  # (b, 1, 1, keys)
    additive = additive.masked_fill(~allowed, torch.finfo(dtype).min)  # (b, 1, 1, keys)
    return additive.expand(-1, -1, queries, -1)  # (b, 1, queries, keys)


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """States (b, n, d) with 1/0 mask (b, n) → their mean over valid tokens (b, d): the rankers' mean pooling."""
    weights = mask.to(states.dtype).unsqueeze(-1)  # (b, n, 1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (b, d)


def _no_projection(model: PreTrainedModel, states: torch.Tensor) -> torch.Tensor:
    return states


def _albert_projection(model: PreTrainedModel, states: torch.Tensor) -> torch.Tensor:
    return model.base_model.encoder.embedding_hidden_mapping_in(states)  # (b, n, embedding) → (b, n, hidden)


def _albert_layer(model: PreTrainedModel, index: int) -> nn.Module:
    config = model.config
    # The same group arithmetic as AlbertTransformer.forward: layers are spread evenly over the groups.
    group = int(index / (config.num_hidden_layers / config.num_hidden_groups))
    return model.base_model.encoder.albert_layer_groups[group]


def _no_head_dropout(model: PreTrainedModel) -> nn.Module:
    return nn.Identity()


def _position_zero(config: PreTrainedConfig) -> int:
    return 0


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        model_type="bert",
        question_segment=0,
        passage_segment=1,
        first_position=_position_zero,
        layer_module=lambda model, index: model.base_model.encoder.layer[index],
        project=_no_projection,
        head_dropout=_no_head_dropout,
    ),
    "albert": Architecture(
        model_type="albert",
        question_segment=0,
        passage_segment=1,
        first_position=_position_zero,
        layer_module=_albert_layer,
        project=_albert_projection,
        head_dropout=_no_head_dropout,
    ),
    "distilbert": Architecture(
        model_type="distilbert",
        question_segment=None,
        passage_segment=None,
        first_position=_position_zero,
        layer_module=lambda model, index: model.base_model.transformer.layer[index],
        project=_no_projection,
        # DistilBertForQuestionAnswering applies dropout (qa_dropout) before its QA head.
        head_dropout=lambda model: model.dropout,
    ),
    "roberta": Architecture(
        model_type="roberta",
        question_segment=0,
        passage_segment=0,
        # RoBERTa numbers positions from padding_idx + 1 (padding_idx is the pad token id).
        first_position=lambda config: config.pad_token_id + 1,
        layer_module=lambda model, index: model.base_model.encoder.layer[index],
        project=_no_projection,
        head_dropout=_no_head_dropout,
    ),
}


def architecture_for(model_type: str) -> Architecture:
    """The adapter for a config's model_type; a DilstoreError lists the supported ones otherwise."""
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise DilstoreError(
            f"model_type {model_type!r} is not supported by the DilBert reader; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        ) from None
