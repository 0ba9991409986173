"""DilBert: a delayed-interaction extractive QA reader over Hugging Face encoders (seed 002).

The first k of the l encoder layers see the question and the passage
separately; the last l - k layers see their concatenation, then the QA head
gives start and end logits. No parameter is added, so any BERT, ALBERT,
DistilBERT or RoBERTa checkpoint loads as a reader, and k = 0 is exactly the
plain Hugging Face QA model.

    passage  `p [SEP]`      → embeddings (segment 1, positions from the first) → layers 1..k  (offline, stored)
    question `[CLS] q [SEP]` → embeddings (segment 0, positions from the first) → layers 1..k  (once per question)
    concat(question states, passage states) → layers k+1..l → QA head → start, end logits      (per pair)

All three halves call the Hugging Face model's own embedding, layer and head
modules (see reader/modeling/architectures.py for where each architecture keeps them),
so the split model and the reference network share one definition. Padded
positions of either half never influence valid ones: every layer gets an
additive mask over the keys, and the logits of padded positions are set to
the dtype's minimum so that no decoder picks them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from dilstore.reader.modeling.architectures import (
    ATTENTION_IMPLEMENTATIONS,
    HEAD_INIT_SEED,
    Architecture,
    architecture_for,
    padding_attention_mask,
)
from dilstore.reader.modeling.checkpoints import (
    CheckpointMetadata,
    metadata_of_kind,
    require_checkpoint_dir,
    require_config_fits_weights,
    weight_shapes,
    write_metadata,
)
from dilstore.reader.modeling.load_errors import LOAD_ERRORS, load_failure
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import DILBERT
from dilstore.storage.messages import listed

# The head a base encoder lacks: initialised from HEAD_INIT_SEED instead.
_QA_HEAD_PREFIX = "qa_outputs."


def _weights_problem(loading: dict[str, Any], trained: bool) -> str | None:
    """What transformers' loading report says is wrong, or None: a weight the model needs that the file lacks (a
    base encoder may lack only the QA head), a weight whose shape is not the one config.json gives, or, in a
    dilstore checkpoint (`trained`), a weight the model does not have. transformers fills a missing weight at
    random and drops an unknown one with a warning that quiet commands hide: a store built so held wrong states
    that verified as whole. A shape it reported only as "look at the above report", a report quiet commands hide
    (hostile46 F10)."""
    missing = [name for name in loading.get("missing_keys", ()) if trained or not name.startswith(_QA_HEAD_PREFIX)]
    unknown = list(loading.get("unexpected_keys", ())) if trained else []
    parts = [
        f"{label} {listed(sorted(names))}" for label, names in (("missing", missing), ("unknown", unknown)) if names
    ]
    mismatched = sorted(loading.get("mismatched_keys", ()))
    if mismatched:
        name, stored, asked = mismatched[0]
        parts.append(f"{len(mismatched)} of another shape than config.json gives, e.g. {name!r}: "
                     f"{tuple(stored)} in the file, {tuple(asked)} by the config")  # fmt: skip
    return "; ".join(parts) or None



class DilBertReader(nn.Module):
    """The delayed-interaction QA reader: offline passage half, question half, online half.

    `layers` is k (0..l non-interaction layers), `num_layers` is l, and
    `hidden_size` is the width of every state this reader produces or takes.
    The wrapped Hugging Face model is `model` (a *ForQuestionAnswering with
    attention implementation "sdpa" or "eager") and its tokenizer is
    `tokenizer`.
    """

    kind = DILBERT

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, layers: int) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.architecture: Architecture = architecture_for(model.config.model_type)
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation not in ATTENTION_IMPLEMENTATIONS:
            raise DilstoreError(
                f"the DilBert reader runs the model's layers with an additive attention mask, which attention "
                f"implementation {implementation!r} does not take: load it with attn_implementation 'sdpa' or 'eager'"
            )
        self.num_layers: int = model.config.num_hidden_layers
        self.hidden_size: int = model.config.hidden_size
        if not isinstance(layers, int) or not 0 <= layers <= self.num_layers:
            raise DilstoreError(
                f"k (non-interaction layers) must be an integer in 0..{self.num_layers} for this "
                f"{self.num_layers}-layer {model.config.model_type} model, got {layers!r}"
            )
        self.layers: int = layers
        # The file of online layers swapped in for a store's encoding (reader/modeling/online_variants.py), if any.
        self.online_variant: str | None = None

    # ------------------------------------------------------------------ loading and saving

    @classmethod
    def from_pretrained(cls, path: str | Path, layers: int | None = None) -> DilBertReader:
        """Load a reader from a local directory: a dilstore checkpoint, or a base encoder with `layers` given.

        k comes from `layers` when given, else from the directory's
        dilstore.json. A base model without a QA head gets one initialised
        from a fixed seed. Weights are upcast to fp32 whatever dtype they were
        stored in. Nothing is ever downloaded.
        """
        directory = require_checkpoint_dir(Path(path))
        metadata = metadata_of_kind(directory, (cls.kind,), f", not a {cls.kind!r} reader")
        if layers is None:
            if metadata is None:
                raise DilstoreError(
                    f"{directory} is a base model without dilstore metadata: give the number of "
                    "non-interaction layers k explicitly (layers=K, or --layers K)"
                )
            layers = metadata.layers
        try:
            config = AutoConfig.from_pretrained(directory, local_files_only=True)
            architecture_for(config.model_type)
            require_config_fits_weights(directory, config, weight_shapes(directory))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(HEAD_INIT_SEED)
                model, loading = AutoModelForQuestionAnswering.from_pretrained(
                    directory,
                    dtype=torch.float32,
                    attn_implementation="sdpa",
                    local_files_only=True,
                    use_safetensors=True,  # a pickle checkpoint (pytorch_model.bin) is never loaded (hostile46 F5)
                    ignore_mismatched_sizes=True,  # reported by name below, not as "look at the above report"
                    output_loading_info=True,
                )
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except LOAD_ERRORS as error:
            raise DilstoreError(load_failure("a model", directory, error)) from error
        problem = _weights_problem(loading, trained=metadata is not None)
        if problem:
            raise DilstoreError(f"cannot load a model from {directory}: its weights do not fit its config: {problem}")
        return cls(model, tokenizer, layers).eval()

    def save_pretrained(self, path: str | Path) -> Path:
        """Write a plain Hugging Face checkpoint (config, safetensors, tokenizer) plus dilstore.json with k."""
        directory = Path(path)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
            write_metadata(directory, self.metadata())
        except OSError as error:
            raise DilstoreError(f"cannot save the reader to {directory}: {error}") from error
        return directory

    def metadata(self) -> CheckpointMetadata:
        """What dilstore.json records for this reader."""
        return CheckpointMetadata(
            kind=self.kind,
            architecture=self.model.config.model_type,
            layers=self.layers,
            num_layers=self.num_layers,
        )

    def offline_modules(self) -> list[nn.Module]:
        """The embeddings and layers 1..k: the modules whose weights shape the passage states a store keeps."""
        return [self.model.base_model.embeddings] + [
            self.architecture.layer_module(self.model, index) for index in range(self.layers)
        ]

    def online_state_names(self) -> list[str]:
        """The names in `model`'s state dict outside `offline_modules`: layers k+1..l and the head, sorted."""
        offline = {
            id(tensor) for module in self.offline_modules() for tensor in [*module.parameters(), *module.buffers()]
        }
        state = self.model.state_dict(keep_vars=True)
        return sorted(name for name, tensor in state.items() if id(tensor) not in offline)

    def fingerprinted_network(self) -> tuple[PreTrainedConfig, nn.Module]:
        """The config and the module whose weights a store's fingerprint hashes: the wrapped HF model."""
        return self.model.config, self.model

    def compile_layers(self) -> None:
        """Compile every encoder layer (torch.compile, shapes dynamic), so each runs as a few fused kernels.

        A 384-wide layer is many small kernels, whose launches and memory
        round trips can bound a GPU training step more than its arithmetic
        (benchmarks/bench_side_by_side.py measures whether compiling pays).
        The weights, their names and what the reader computes stay the same
        (within float rounding; dropout draws its masks differently). The
        first call compiles (seconds to minutes); later lengths reuse it.
        """
        for index in range(self.num_layers):
            self.architecture.layer_module(self.model, index).compile(dynamic=True)

    # ------------------------------------------------------------------ the three halves

    def encode_passages(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Offline half: `p [SEP]` ids (b, n) and their 1/0 mask → passage states (b, n, d) after layer k.

        The states depend on the passage alone, so they can be computed once
        per corpus and stored.
        """
        return self._non_interaction(input_ids, attention_mask, self.architecture.passage_segment)

    def encode_questions(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Question half: `[CLS] q [SEP]` ids (b, n) and mask → question states (b, n, d) after layer k."""
        return self._non_interaction(input_ids, attention_mask, self.architecture.question_segment)

    def interact(
        self,
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
        passage_states: torch.Tensor,
        passage_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Online half: layers k+1..l over concat(question, passage), then the QA head.

        Takes question states (b, nq, d) with mask (b, nq) and passage states
        (b, np, d) with mask (b, np); a question batch of 1 is broadcast over
        the b passages. Stored states of any float dtype are cast to the
        model's dtype. Returns start and end logits, each (b, nq + np) over
        the concatenation (question part first); padded positions hold the
        dtype's minimum.
        """
        states, mask = self.interaction_states(question_states, question_mask, passage_states, passage_mask)
        return self.answer_logits(states[-1], mask)

    def interaction_states(
        self,
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
        passage_states: torch.Tensor,
        passage_mask: torch.Tensor,
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Layers k+1..l over concat(question, passage): every state on the way, and the joint mask.

        Returns l - k + 1 states, each (b, nq + np, d): the concatenation as
        it enters layer k+1, then the output of each layer k+1..l (the last is
        what the QA head reads). Distillation compares these with a teacher's
        states of the same layers; `interact` keeps only the last.
        """
        batch = passage_states.shape[0]
        if question_states.shape[0] == 1 and batch > 1:
            question_states = question_states.expand(batch, -1, -1)  # (b, nq, d)
            question_mask = question_mask.expand(batch, -1)  # (b, nq)
        dtype = self.model.dtype
        hidden = torch.cat([question_states.to(dtype), passage_states.to(dtype)], dim=1)  # (b, nq + np, d)
        mask = torch.cat([question_mask, passage_mask.to(question_mask.dtype)], dim=1)  # (b, nq + np)
        return self.upper_states(hidden, mask), mask

    def upper_states(self, hidden: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """Layers k+1..l over joined question–passage rows (b, n, d) with their mask (b, n): `hidden`, then the
        output of each layer.

        A row may hold its question part padded before its passage (interaction_states) or the two side by side
        with padding only at the end (read_joined): layers k+1..l add no positions and mask out padding, so both
        read alike.
        """
        additive = padding_attention_mask(mask, hidden.shape[1], hidden.dtype)  # (b, 1, n, n)
        states = [hidden]
        for index in range(self.layers, self.num_layers):
            hidden = self.architecture.run_layer(self.model, index, hidden, additive)  # (b, n, d)
            states.append(hidden)
        return states

    def read_joined(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The online half over rows the caller joined (`upper_states`), each of the model's dtype: start and end
        logits, each (b, n), padding at the dtype's minimum."""
        return self.answer_logits(self.upper_states(hidden, mask)[-1], mask)

    def answer_logits(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The QA head over the last layer's states (b, n, d) → start and end logits (b, n), padding at the minimum."""
        hidden = self.architecture.head_dropout(self.model)(hidden)  # (b, n, d)
        logits = self.model.qa_outputs(hidden)  # (b, n, 2)
        start_logits, end_logits = logits.unbind(dim=-1)  # each (b, n)
        padding = ~mask.bool()  # (b, n)
        lowest = torch.finfo(logits.dtype).min
        return start_logits.masked_fill(padding, lowest), end_logits.masked_fill(padding, lowest)

    def forward(
        self,
        question_ids: torch.Tensor,
        question_mask: torch.Tensor,
        passage_ids: torch.Tensor,
        passage_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole composition (the training path): question and passage halves, then `interact`.

        Ids and masks are (b, nq) and (b, np); returns start and end logits, each (b, nq + np).
        """
        start_logits, end_logits, _ = self.forward_with_states(question_ids, question_mask, passage_ids, passage_mask)
        return start_logits, end_logits

    def forward_with_states(
        self,
        question_ids: torch.Tensor,
        question_mask: torch.Tensor,
        passage_ids: torch.Tensor,
        passage_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """`forward`, also returning the interaction states (see `interaction_states`) for distillation."""
        question_states = self.encode_questions(question_ids, question_mask)  # (b, nq, d)
        passage_states = self.encode_passages(passage_ids, passage_mask)  # (b, np, d)
        return self.forward_from_states(question_states, question_mask, passage_states, passage_mask)

    def forward_from_states(
        self,
        question_states: torch.Tensor,
        question_mask: torch.Tensor,
        passage_states: torch.Tensor,
        passage_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """`interact` that also returns the interaction states: the training path over given layer-k states.

        `train qa --freeze-lower` feeds it cached question and passage states
        (b, nq, d) and (b, np, d); returns start and end logits, each
        (b, nq + np), and the states of `interaction_states`.
        """
        states, mask = self.interaction_states(question_states, question_mask, passage_states, passage_mask)
        start_logits, end_logits = self.answer_logits(states[-1], mask)  # each (b, nq + np)
        return start_logits, end_logits, states

    def _non_interaction(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, segment: int | None
    ) -> torch.Tensor:
        """One segment alone: embeddings (positions from the first, the given segment id) → layers 1..k."""
        return self.architecture.encode_segment(self.model, input_ids, attention_mask, segment, self.layers)
