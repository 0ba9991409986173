"""EARL's judger block (seed 004, section 3.2): query tokens attend to the document, then to each other.

    query states ──cross-attention over document K/V──▶ + residual, LayerNorm
                 ──self-attention over query tokens──▶ + residual, LayerNorm
                 ──feed-forward (intermediate, output)──▶ + residual, LayerNorm

Only query tokens are updated; document tokens are keys and values only, so
their projections can be computed once per document and stored (strategy
S2). Each sub-layer follows BERT's post-LN form `LayerNorm(x + dropout(f(x)))`.
A block is initialised from one BERT layer (section 3.4): the cross-attention
gets a copy of the layer's self-attention weights (its own parameters from
then on), the self-attention and feed-forward get the layer's own weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig
from transformers.activations import ACT2FN
from transformers.models.bert.modeling_bert import BertAttention, BertLayer

from dilstore.reader.modeling.architectures import padding_attention_mask
from dilstore.storage.errors import DilstoreError


class JudgerAttention(nn.Module):
    """Multi-head attention of query tokens over given keys/values, then BERT's output dense + residual + LayerNorm.

    Keys and values come in as one (b, n, 2, d) tensor: projected here from
    states (`key_values`) or loaded from a store; all heads are concatenated
    along d = heads · head_size, as BERT lays them out.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        if hidden % config.num_attention_heads:
            raise DilstoreError(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {config.num_attention_heads}"
            )
        self.heads: int = config.num_attention_heads
        self.head_size: int = hidden // self.heads
        self.attention_dropout: float = config.attention_probs_dropout_prob
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.layer_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def key_values(self, states: torch.Tensor) -> torch.Tensor:
        """States (b, n, d) → their key and value projections stacked as (b, n, 2, d)."""
        return torch.stack([self.key(states), self.value(states)], dim=2)  # (b, n, 2, d)

    def forward(self, hidden: torch.Tensor, key_values: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Query states (b, nq, d) attend over key_values (b, n, 2, d) whose padding key_mask (b, n) is 0.

        Returns the updated query states (b, nq, d).
        """
        batch, queries, width = hidden.shape
        heads = (self.heads, self.head_size)
        queries_by_head = self.query(hidden).unflatten(-1, heads).transpose(1, 2)  # (b, h, nq, head_size)
        keys, values = key_values.unbind(dim=2)  # each (b, n, d), not necessarily contiguous when stored
        keys = keys.unflatten(-1, heads).transpose(1, 2)  # (b, h, n, head_size)
        values = values.unflatten(-1, heads).transpose(1, 2)  # (b, h, n, head_size)
        additive = padding_attention_mask(key_mask, queries, hidden.dtype)  # (b, 1, nq, n)
        dropout = self.attention_dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(queries_by_head, keys, values, attn_mask=additive, dropout_p=dropout)
        # context: (b, h, nq, head_size)
        context = context.transpose(1, 2).reshape(batch, queries, width)  # (b, nq, d)
        return self.layer_norm(self.dropout(self.output(context)) + hidden)  # (b, nq, d)

    @torch.no_grad()
    def copy_from(self, attention: BertAttention) -> None:
        """Copy a BERT attention sub-layer's weights (query/key/value, output dense, LayerNorm) into this one."""
        pairs = [
            (self.query, attention.self.query),
            (self.key, attention.self.key),
            (self.value, attention.self.value),
            (self.output, attention.output.dense),
            (self.layer_norm, attention.output.LayerNorm),
        ]
        for target, source in pairs:
            _copy_parameters(target, source)


class JudgerBlock(nn.Module):
    """One judger block: query→document cross-attention, query self-attention, feed-forward."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.cross_attention = JudgerAttention(config)
        self.self_attention = JudgerAttention(config)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        act = config.hidden_act
        self.activation = ACT2FN[act] if isinstance(act, str) else act
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden: torch.Tensor,
        query_mask: torch.Tensor,
        document_key_values: torch.Tensor,
        document_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Query states (b, nq, d) with mask (b, nq), document K/V (b, n, 2, d) with mask (b, n) → (b, nq, d)."""
        hidden = self.cross_attention(hidden, document_key_values, document_mask)  # (b, nq, d)
        hidden = self.self_attention(hidden, self.self_attention.key_values(hidden), query_mask)  # (b, nq, d)
        feed_forward = self.output(self.activation(self.intermediate(hidden)))  # (b, nq, d)
        return self.output_norm(self.dropout(feed_forward) + hidden)  # (b, nq, d)

    @torch.no_grad()
    def copy_from(self, layer: BertLayer) -> None:
        """The paper's initialisation from one BERT layer: its self-attention twice, then its feed-forward."""
        self.cross_attention.copy_from(layer.attention)
        self.self_attention.copy_from(layer.attention)
        _copy_parameters(self.intermediate, layer.intermediate.dense)
        _copy_parameters(self.output, layer.output.dense)
        _copy_parameters(self.output_norm, layer.output.LayerNorm)


def _copy_parameters(target: nn.Module, source: nn.Module) -> None:
    """Copy the values of `source`'s weight and bias into `target`'s own (separate) parameters."""
    target.weight.copy_(source.weight)
    target.bias.copy_(source.bias)
