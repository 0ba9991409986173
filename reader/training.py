"""Fine-tune a DilBert reader on SQuAD-format data, run_squad style (issue 6).

One code path: the loss is computed on the model core's `forward`, the same
delayed-interaction composition that inference runs offline and online, so a
trained k is exactly the k that `precompute` and `ask` use.

- Data: SQuAD v1.1 JSON → sliding-window features (reader/qa_features.py);
  a window without the answer is labelled [CLS] (index 0 of the concatenation).
- Loss: the mean of start and end cross-entropies over `[question ; passage]`.
- AdamW (no decay on biases and LayerNorm) with linear warm-up then linear
  decay to zero, gradient clipping at 1.0, gradient accumulation.
- fp32 on CPU; bf16 (or fp16 with loss scaling) autocast on CUDA.
- Seeded: the window order of epoch e is a permutation drawn from seed + e,
  independent of the dropout RNG, so a resumed run skips exactly what it saw;
  windows of similar length are batched together to cut padding.
- Periodic checkpoints under OUTPUT/checkpoints/step-N (model + training
  state, see reader/training_state.py), written under a temporary name and
  renamed, so a run cut off at any moment leaves a usable checkpoint.
- The final model goes to OUTPUT itself, with dilstore_training.json (k, the
  command, the budget actually run).
"""

from __future__ import annotations

import json
import math
import platform
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from reader.default_model import TRAINING_METADATA_FILE
from reader.dilbert import DilBertReader
from reader.qa_batching import QABatch, collate_features
from reader.qa_features import QAFeature, build_features
from reader.squad_data import load_squad
from reader.training_state import (
    LoopPosition,
    latest_checkpoint,
    load_training_state,
    prune_checkpoints,
    save_training_state,
    step_directory,
)
from storage.errors import DilstoreError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# Micro-batches per length-sorted group (Hugging Face's LengthGroupedSampler uses 50).
LENGTH_GROUP = 50


@dataclass(frozen=True)
class TrainingConfig:
    """Everything that decides what a run computes (the seed's run_squad defaults where it has one)."""

    layers: int
    epochs: int = 2
    max_steps: int | None = None
    batch_size: int = 12
    gradient_accumulation: int = 1
    learning_rate: float = 3e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_seq_length: int = 384
    doc_stride: int = 128
    max_question_length: int = 64
    seed: int = 42
    save_every: int = 0
    keep_checkpoints: int = 2
    log_every: int = 10
    precision: str = "auto"
    train_limit: int | None = None
    group_by_length: bool = True

    def __post_init__(self) -> None:
        positive = {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "gradient_accumulation": self.gradient_accumulation,
            "max_seq_length": self.max_seq_length,
            "doc_stride": self.doc_stride,
            "max_question_length": self.max_question_length,
            "log_every": self.log_every,
            "keep_checkpoints": self.keep_checkpoints,
        }
        for name, value in positive.items():
            if value < 1:
                raise DilstoreError(f"{name.replace('_', '-')} must be at least 1, got {value}")
        if self.layers < 0:
            raise DilstoreError(f"layers (k) must be at least 0, got {self.layers}")
        if self.max_steps is not None and self.max_steps < 1:
            raise DilstoreError(f"max-steps must be at least 1, got {self.max_steps}")
        if self.train_limit is not None and self.train_limit < 1:
            raise DilstoreError(f"train-limit must be at least 1, got {self.train_limit}")
        if not 0 <= self.warmup_ratio < 1:
            raise DilstoreError(f"warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.learning_rate <= 0:
            raise DilstoreError(f"learning-rate must be positive, got {self.learning_rate}")
        if self.save_every < 0:
            raise DilstoreError(f"save-every must be 0 (only at the end) or positive, got {self.save_every}")
        if self.precision not in PRECISIONS:
            raise DilstoreError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.doc_stride >= self.max_seq_length:
            raise DilstoreError(
                f"doc-stride ({self.doc_stride}) must be smaller than max-seq-length ({self.max_seq_length})"
            )


@dataclass(frozen=True)
class TrainingData:
    """The labelled windows of a training file, and how to pad any subset of them into a batch."""

    features: list[QAFeature]
    questions: int
    pad_token_id: int

    def collate(self, indices: Sequence[int]) -> QABatch:
        """The padded batch of the windows at `indices`."""
        return collate_features([self.features[i] for i in indices], self.pad_token_id)


def load_training_data(tokenizer: Any, train_file: Path, config: TrainingConfig) -> TrainingData:
    """SQuAD training questions (the first `train_limit` when set) as labelled sliding-window features."""
    examples = load_squad(train_file)
    if config.train_limit is not None:
        examples = examples[: config.train_limit]
    if not examples:
        raise DilstoreError(f"{train_file}: no training questions")
    features = list(
        build_features(
            tokenizer,
            examples,
            max_seq_length=config.max_seq_length,
            doc_stride=config.doc_stride,
            max_question_length=config.max_question_length,
        )
    )
    return TrainingData(features=features, questions=len(examples), pad_token_id=tokenizer.pad_token_id)


@dataclass(frozen=True)
class TrainingResult:
    """What a run did: the budget actually spent and where the model is."""

    output: Path
    layers: int
    steps: int
    total_steps: int
    features_seen: int
    train_features: int
    train_questions: int
    train_seconds: float
    final_loss: float
    losses: list[float] = field(repr=False)
    reader: DilBertReader = field(repr=False, compare=False)


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and CUDA) so a run is repeatable."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def qa_loss(
    start_logits: torch.Tensor, end_logits: torch.Tensor, start_targets: torch.Tensor, end_targets: torch.Tensor
) -> torch.Tensor:
    """Mean of start and end cross-entropies; logits (b, nq+np), targets (b,) indices into the concatenation."""
    start = torch.nn.functional.cross_entropy(start_logits.float(), start_targets)
    end = torch.nn.functional.cross_entropy(end_logits.float(), end_targets)
    return (start + end) / 2


class OptimizationSettings(Protocol):
    """The fields the shared optimizer, schedule, batching and precision helpers read.

    Both TrainingConfig (QA) and the ranking trainer's config have them, so
    one implementation serves `train qa` and `train earl|cross-encoder|siamese`.
    """

    epochs: int
    max_steps: int | None
    batch_size: int
    gradient_accumulation: int
    learning_rate: float
    weight_decay: float
    seed: int
    precision: str


def build_optimizer(model: torch.nn.Module, config: OptimizationSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases or LayerNorm weights), as BERT fine-tuning does."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name or "norm" in name.lower() else decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.learning_rate)


def total_optimizer_steps(num_features: int, config: OptimizationSettings) -> int:
    """Optimizer steps of the run: all epochs, or --max-steps when that is fewer."""
    micro_batches_per_epoch = math.ceil(num_features / config.batch_size)
    per_epoch = math.ceil(micro_batches_per_epoch / config.gradient_accumulation)
    full = per_epoch * config.epochs
    return full if config.max_steps is None else min(full, config.max_steps)


def epoch_order(num_features: int, seed: int, epoch: int) -> list[int]:
    """The window order of one epoch: a permutation drawn from its own generator (seed, epoch)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_features, generator=generator).tolist()


def optimizer_step_batches(
    num_features: int, config: OptimizationSettings, lengths: Sequence[int] | None = None
) -> Iterator[list[list[int]]]:
    """Feature indices for every optimizer step in run order: `gradient_accumulation` micro-batches each.

    With `lengths` (tokens per window; pass them only to group by length), each
    run of LENGTH_GROUP micro-batches of the shuffled order is sorted by
    length before it is cut, so a micro-batch holds windows of similar length
    and padding (which costs compute on CPU) stays small; the order stays
    random at the scale of groups. An epoch's last step may hold fewer
    micro-batches; steps never straddle epochs.
    """
    group = config.batch_size * LENGTH_GROUP
    for epoch in range(config.epochs):
        order = epoch_order(num_features, config.seed, epoch)
        if lengths is not None:
            order = [
                index
                for first in range(0, num_features, group)
                for index in sorted(order[first : first + group], key=lambda i: -lengths[i])
            ]
        micro = [order[i : i + config.batch_size] for i in range(0, num_features, config.batch_size)]
        for i in range(0, len(micro), config.gradient_accumulation):
            yield micro[i : i + config.gradient_accumulation]


def apply_optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    max_grad_norm: float,
) -> None:
    """One optimizer step over the accumulated gradients: unscale, clip to max_grad_norm, step, advance, zero."""
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def autocast_dtype(config: OptimizationSettings, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: None (fp32) on CPU; bf16 on CUDA when supported, else fp16."""
    if config.precision == "fp32" or (config.precision == "auto" and device.type != "cuda"):
        return None
    if device.type != "cuda":
        raise DilstoreError(f"precision {config.precision} needs a CUDA device; this run is on {device}")
    if config.precision == "fp16" or (config.precision == "auto" and not torch.cuda.is_bf16_supported()):
        return torch.float16
    return torch.bfloat16


def hardware_description(device: torch.device) -> str:
    """A short line for the metadata: the accelerator, or the CPU with torch's thread count."""
    if device.type == "cuda":
        return f"CUDA {torch.cuda.get_device_name(device)}"
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s)"


def train_qa(
    model_dir: Path,
    train_file: Path,
    output_dir: Path,
    config: TrainingConfig,
    *,
    command: str,
    resume: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
) -> TrainingResult:
    """Fine-tune the reader at `model_dir` (a base model or a reader) with k=config.layers; save to `output_dir`.

    With `resume`, the newest complete checkpoint under OUTPUT/checkpoints
    is loaded (weights, optimizer, scheduler, RNG, position) and the run
    continues where it stopped; the config must match the interrupted run's.
    """
    output_dir = Path(output_dir)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    checkpoints = output_dir / "checkpoints"
    seed_everything(config.seed)
    resume_from = _resume_point(checkpoints, config) if resume else None
    reader = DilBertReader.from_pretrained(resume_from or model_dir, layers=config.layers)
    data = load_training_data(reader.tokenizer, Path(train_file), config)
    reader.to(device).train()
    optimizer = build_optimizer(reader, config)
    total_steps = total_optimizer_steps(len(data.features), config)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(config.warmup_ratio * total_steps), total_steps)
    position = LoopPosition(step=0, features_seen=0, train_seconds=0.0)
    if resume_from is not None:
        position = load_training_state(resume_from, optimizer, scheduler)
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_run_config(output_dir, config, model_dir, train_file, command)
    run = _RunInfo(
        config, Path(model_dir), Path(train_file), command, device, len(data.features), data.questions, total_steps
    )

    dtype = autocast_dtype(config, device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    losses: list[float] = []
    bar = tqdm(total=total_steps, initial=position.step, disable=not progress, unit="step", dynamic_ncols=True)
    started = time.perf_counter() - position.train_seconds
    window_start, window_features = time.perf_counter(), 0
    lengths = [len(feature.question) + len(feature.passage) for feature in data.features]
    step_plan = optimizer_step_batches(len(data.features), config, lengths if config.group_by_length else None)
    for step_index, micro_batches in enumerate(step_plan):
        if step_index >= total_steps:
            break
        if step_index < position.step:
            continue
        step_loss = accumulate_gradients(reader, data, micro_batches, device, dtype, scaler)
        apply_optimizer_step(reader, optimizer, scheduler, scaler, config.max_grad_norm)
        seen = sum(len(batch) for batch in micro_batches)
        position = LoopPosition(
            step=step_index + 1,
            features_seen=position.features_seen + seen,
            train_seconds=time.perf_counter() - started,
        )
        losses.append(step_loss)
        window_features += seen
        rate = window_features / max(time.perf_counter() - window_start, 1e-9)
        bar.set_postfix(loss=f"{step_loss:.3f}", win_per_s=f"{rate:.1f}", refresh=False)
        bar.update(1)
        if position.step % config.log_every == 0 or position.step == total_steps:
            bar.write(
                f"step {position.step}/{total_steps} loss {float(np.mean(losses[-config.log_every:])):.4f} "
                f"lr {scheduler.get_last_lr()[0]:.2e} windows/s {rate:.2f} "
                f"seen {position.features_seen} elapsed {position.train_seconds:.0f}s"
            )
            window_start, window_features = time.perf_counter(), 0
        if config.save_every and position.step % config.save_every == 0 and position.step < total_steps:
            _save_checkpoint(reader, optimizer, scheduler, run, position, step_loss, checkpoints)
    bar.close()

    result = TrainingResult(
        output=output_dir,
        layers=reader.layers,
        steps=position.step,
        total_steps=total_steps,
        features_seen=position.features_seen,
        train_features=len(data.features),
        train_questions=data.questions,
        train_seconds=position.train_seconds,
        final_loss=losses[-1] if losses else float("nan"),
        losses=losses,
        reader=reader,
    )
    reader.eval()
    reader.save_pretrained(output_dir)
    _write_metadata(output_dir, reader, run, position, result.final_loss)
    return result


def accumulate_gradients(
    reader: DilBertReader,
    data: TrainingData,
    micro_batches: Sequence[Sequence[int]],
    device: torch.device,
    dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """Forward and backward over one optimizer step's micro-batches, adding into `.grad`; returns the mean loss.

    Each micro-batch's mean loss is divided by the number of micro-batches,
    so equal-sized micro-batches accumulate the gradient of one large batch.
    """
    scaler = scaler or torch.amp.GradScaler("cuda", enabled=False)
    total = 0.0
    for indices in micro_batches:
        batch = data.collate(indices).to(device)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            start_logits, end_logits = reader(
                batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask
            )  # each (b, nq + np)
        loss = qa_loss(start_logits, end_logits, batch.start_targets, batch.end_targets) / len(micro_batches)
        scaler.scale(loss).backward()
        total += float(loss.detach())
    return total


def _save_checkpoint(
    reader: DilBertReader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    run: _RunInfo,
    position: LoopPosition,
    loss: float,
    checkpoints: Path,
) -> Path:
    """Write a resumable checkpoint atomically (temporary folder, then rename) and prune old ones.

    It carries dilstore_training.json too, so a run cut off later still
    leaves a checkpoint that can be evaluated and packaged as it is.
    """
    final = step_directory(checkpoints, position.step)
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    reader.save_pretrained(partial)
    save_training_state(partial, optimizer, scheduler, position)
    _write_metadata(partial, reader, run, position, loss)
    partial.rename(final)
    prune_checkpoints(checkpoints, run.config.keep_checkpoints)
    return final


def _resume_point(checkpoints: Path, config: TrainingConfig) -> Path:
    """The checkpoint to resume from; a DilstoreError when there is none or its config differs."""
    found = latest_checkpoint(checkpoints)
    if found is None:
        raise DilstoreError(f"--resume: no complete checkpoint under {checkpoints}")
    saved_file = checkpoints.parent / "run_config.json"
    if saved_file.is_file():
        saved = json.loads(saved_file.read_text(encoding="utf-8"))["config"]
        differing = sorted(
            name for name, value in asdict(config).items() if name != "save_every" and saved.get(name) != value
        )
        if differing:
            raise DilstoreError(f"--resume: settings differ from the interrupted run ({saved_file}): {differing}")
    return found


def _write_run_config(
    output_dir: Path, config: TrainingConfig, model_dir: Path, train_file: Path, command: str
) -> None:
    """Record the settings at the start, so --resume can check it continues the same run."""
    document = {
        "config": asdict(config),
        "base_model": str(model_dir),
        "train_file": str(train_file),
        "command": command,
    }
    (output_dir / "run_config.json").write_text(json.dumps(document, indent=1), encoding="utf-8")


@dataclass(frozen=True)
class _RunInfo:
    """What stays fixed over a run and goes into every dilstore_training.json it writes."""

    config: TrainingConfig
    model_dir: Path
    train_file: Path
    command: str
    device: torch.device
    train_features: int
    train_questions: int
    total_steps: int


def _write_metadata(
    directory: Path, reader: DilBertReader, run: _RunInfo, position: LoopPosition, final_loss: float
) -> None:
    """dilstore_training.json: k, the command, and the budget this checkpoint was actually trained with."""
    document: dict[str, Any] = {
        "kind": "dilbert-qa",
        "layers": reader.layers,
        "num_layers": reader.num_layers,
        "command": run.command,
        "base_model": str(run.model_dir),
        "train_file": str(run.train_file),
        "config": asdict(run.config),
        "steps": position.step,
        "total_steps": run.total_steps,
        "features_seen": position.features_seen,
        "train_features": run.train_features,
        "train_questions": run.train_questions,
        "train_seconds": round(position.train_seconds, 1),
        "final_loss": final_loss,
        "hardware": hardware_description(run.device),
        "torch": torch.__version__,
    }
    (Path(directory) / TRAINING_METADATA_FILE).write_text(json.dumps(document, indent=1), encoding="utf-8")
