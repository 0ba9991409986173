"""The training commands' settings, apart from the training code: they need no torch.

`LoopConfig` holds what the shared loop (reader/training/loop.py) reads and `TrainingConfig` what `train qa`
(reader/training/qa.py) adds. Both refuse a setting out of range when made, so `train qa` makes its config before
torch, transformers and the model load: `--layers -1`, `--learning-rate -1` or `--epochs 0` waited 5-7 s for them
(left61 F10).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dilstore.reader.data.qa_features import (
    DEFAULT_MAX_QUESTION_LENGTH,
    DEFAULT_MAX_SEQ_LENGTH,
    require_stride_within_window,
)
from dilstore.reader.text.tokenization import DEFAULT_STRIDE
from dilstore.storage.checks import require_at_least_one
from dilstore.storage.encodings import get_encoding
from dilstore.storage.errors import DilstoreError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# numpy's seeding (seed_everything) takes seeds from 0 to this; it raised a ValueError on others mid-start.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """The settings the shared optimizer, schedule, batching, precision, logging and checkpointing read.

    `train qa`'s TrainingConfig and the rankers' RankingTrainingConfig add
    their own settings and defaults for `epochs` and `batch_size`, so one
    loop serves `train qa` and `train earl|cross-encoder|siamese|listformer`.
    """

    epochs: int
    max_steps: int | None = None
    batch_size: int
    gradient_accumulation: int = 1
    learning_rate: float = 3e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    save_every: int = 0
    save_every_minutes: float = 10.0
    keep_checkpoints: int = 2
    log_every: int = 10
    precision: str = "auto"
    train_limit: int | None = None

    def __post_init__(self) -> None:
        """A DilstoreError naming the option when a setting the shared loop reads is out of range."""
        require_at_least_one(
            {
                "epochs": self.epochs,
                "batch_size": self.batch_size,
                "gradient_accumulation_steps": self.gradient_accumulation,  # its flag's name
                "log_every": self.log_every,
                "keep_checkpoints": self.keep_checkpoints,
                "max_steps": self.max_steps,
            }
        )
        require_finite(
            {
                "learning-rate": self.learning_rate,
                "weight-decay": self.weight_decay,
                "max-grad-norm": self.max_grad_norm,
            }
        )
        if not 0 <= self.warmup_ratio < 1:
            raise DilstoreError(f"warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.learning_rate <= 0:
            raise DilstoreError(f"learning-rate must be positive, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise DilstoreError(f"weight-decay must be at least 0, got {self.weight_decay}")
        if self.max_grad_norm <= 0:
            raise DilstoreError(f"max-grad-norm must be positive, got {self.max_grad_norm}")
        if self.save_every < 0:
            raise DilstoreError(f"save-every must be 0 (only at the end) or positive, got {self.save_every}")
        if not self.save_every_minutes >= 0:
            raise DilstoreError(
                f"save-every-minutes must be 0 (not by time) or positive, got {self.save_every_minutes}"
            )
        if self.precision not in PRECISIONS:
            raise DilstoreError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise DilstoreError(f"seed must be from 0 to {MAX_SEED}, got {self.seed}")


def require_finite(settings: Mapping[str, float]) -> None:
    """A DilstoreError naming the first setting that is NaN or infinite.

    Range checks alone let NaN through (every comparison with it is false), and a NaN or infinite rate trains
    every weight to NaN without an error.
    """
    for name, value in settings.items():
        if not math.isfinite(value):
            raise DilstoreError(f"{name} must be a finite number, got {value}")


# How a shared-normalisation group's length is measured when micro-batches are grouped by length. A micro-batch
# pads every window to its longest question and passage, so "longest" (its longest window) groups alike what the
# padding depends on: at 32 groups a micro-batch over SQuAD-train, real tokens are 0.672 of those computed against
# 0.529 with "sum" (over its windows; BENCHMARKS.md).
GROUP_LENGTHS = ("longest", "sum")
# Settings that act only with another: option -> its settings (TrainingConfig fields).
_ACTING_ONLY_WITH = {
    "teacher": ("distillation_temperature", "distillation_weight", "representation_weight"),
    "shared_norm": ("shared_norm_negatives", "group_length"),
}


def _group_length_before(saved: dict[str, Any]) -> str:
    """The group_length of a run recorded before the setting existed: shared-normalisation runs grouped by the sum
    over a group's windows; plain runs' one-window examples measure the same either way, so they read as the default.
    """
    return "sum" if saved.get("shared_norm") is not None else "longest"


@dataclass(frozen=True, kw_only=True)
class TrainingConfig(LoopConfig):
    """Everything that decides what a run computes (the seed's run_squad defaults where it has one)."""

    layers: int
    epochs: int = 2
    batch_size: int = 12
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    doc_stride: int = DEFAULT_STRIDE
    max_question_length: int = DEFAULT_MAX_QUESTION_LENGTH
    group_by_length: bool = True
    # How a shared-normalisation group's length is measured for length grouping (GROUP_LENGTHS); resume_point reads
    # a run_config.json without it as _group_length_before says.
    group_length: str = field(default="longest", metadata={"before": _group_length_before})
    teacher: str | None = None
    distillation_temperature: float = 2.0
    distillation_weight: float = 1.0
    representation_weight: float = 1.0
    shared_norm: str | None = None
    shared_norm_negatives: int = 3
    freeze_lower: bool = False
    store_encoding: str | None = None
    codebook: str | None = None
    chunk_windows: int | None = None  # None: length_chunks.default_chunk_windows of the run's device
    compile: bool = False  # DilBertReader.compile_layers before training: how a step is computed, not what

    def _refuse_settings_without_their_option(self) -> None:
        """A DilstoreError naming the settings changed from their defaults that only act with an option not given
        (distillation's without --teacher, shared normalisation's without --shared-norm): they were ignored."""
        defaults = {item.name: item.default for item in fields(self)}
        for option, settings in _ACTING_ONLY_WITH.items():
            if getattr(self, option) is None:
                changed = [name for name in settings if getattr(self, name) != defaults[name]]
                if changed:
                    names = ", ".join(f"--{name.replace('_', '-')}" for name in changed)
                    verb = "acts" if len(changed) == 1 else "act"
                    raise DilstoreError(f"{names} {verb} only with --{option.replace('_', '-')}, which is not given")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_length not in GROUP_LENGTHS:
            raise DilstoreError(f"group-length must be one of {', '.join(GROUP_LENGTHS)}, got {self.group_length!r}")
        if self.chunk_windows is not None and self.chunk_windows < 0:
            raise DilstoreError(
                f"chunk-windows must be 0 (one pass per micro-batch) or positive, got {self.chunk_windows}"
            )
        if self.store_encoding is not None:
            get_encoding(self.store_encoding)
            if not self.freeze_lower:
                raise DilstoreError(
                    "store-encoding trains on states as a store returns them, which needs --freeze-lower: "
                    "the lower layers must stay as they are so that the stored passage states do not change"
                )
        if self.codebook is not None and self.store_encoding is None:
            raise DilstoreError("codebook is the one a --store-encoding round trip uses; give --store-encoding too")
        if self.codebook is not None and not get_encoding(self.store_encoding).codebook:
            raise DilstoreError(f"codebook is for the 2bit and 1bit encodings, not {self.store_encoding}: "
                                "its round trip reads none")  # fmt: skip
        if self.shared_norm is not None and self.shared_norm_negatives < 1:
            raise DilstoreError(
                f"shared-norm-negatives must be at least 1 (paragraphs beside the answer's), got "
                f"{self.shared_norm_negatives}"
            )
        require_at_least_one(
            {
                "max_seq_length": self.max_seq_length,
                "doc_stride": self.doc_stride,
                "max_question_length": self.max_question_length,
                "train_limit": self.train_limit,
            }
        )
        if self.layers < 0:
            raise DilstoreError(f"layers (k) must be at least 0, got {self.layers}")
        require_finite({"distillation temperature": self.distillation_temperature,
                        "alpha": self.distillation_weight, "beta": self.representation_weight})  # fmt: skip
        if self.distillation_temperature <= 0 or self.distillation_weight < 0 or self.representation_weight < 0:
            raise DilstoreError(
                "distillation temperature must be positive and its weights at least 0, got "
                f"T={self.distillation_temperature}, alpha={self.distillation_weight}, "
                f"beta={self.representation_weight}"
            )
        require_stride_within_window(self.doc_stride, self.max_seq_length)
        self._refuse_settings_without_their_option()  # last: a bad value is named as such first
