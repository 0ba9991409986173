"""Train EARL and its two baselines end to end on (query, positive, negatives) triples (seed 004, 3.4 and 4.3).

One loop serves the three rankers of reader/rankers.py (EARL, the
cross-encoder and the Siamese encoder); each scores groups of 1 positive and
n negatives per query, (b, 1 + n), and the loss is the pairwise hinge or the
softmax cross-entropy of reader/earl_losses.py:

- Data: triples and paragraphs files (reader/ranking_files.py); every query
  and paragraph is tokenized once, by the ranker's own convention.
- AdamW (no decay on biases and LayerNorm) with linear warm-up then linear
  decay to zero, gradient clipping, gradient accumulation: reader/training.py's
  optimizer, schedule, step plan and autocast rules, shared with `train qa`.
- Seeded: the triple order of epoch e is a permutation drawn from seed + e, so
  a resumed run skips exactly what it saw; dropout continues from the saved RNG.
- fp32 on CPU; bf16 (or fp16 with loss scaling) autocast on CUDA.
- Periodic checkpoints under OUTPUT/checkpoints/step-N (ranker + training
  state, reader/training_state.py), written under a temporary name and
  renamed; `resume` continues from the newest one.
- The final ranker goes to OUTPUT with dilstore_training.json (kind, command,
  data, steps, seconds, hardware).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from reader.default_model import TRAINING_METADATA_FILE
from reader.earl import POOLINGS
from reader.earl_losses import DEFAULT_MARGIN, pairwise_hinge_loss, softmax_cross_entropy_loss
from reader.ranking_files import Triple, read_paragraphs, read_triples
from reader.ranking_inputs import DEFAULT_MAX_DOC_LENGTH, DEFAULT_MAX_QUERY_LENGTH, RANKER_KINDS, TrainableRanker
from reader.rankers import EarlOptions, load_ranker, new_ranker
from reader.training import (
    PRECISIONS,
    apply_optimizer_step,
    autocast_dtype,
    build_optimizer,
    hardware_description,
    optimizer_step_batches,
    seed_everything,
    total_optimizer_steps,
)
from reader.training_state import (
    LoopPosition,
    latest_checkpoint,
    load_training_state,
    prune_checkpoints,
    save_training_state,
    step_directory,
)
from storage.errors import DilstoreError

LOSSES = ("softmax", "hinge")
RUN_CONFIG_FILE = "run_config.json"


@dataclass(frozen=True)
class RankingTrainingConfig:
    """Everything that decides what a ranking run computes (the seed's AdamW 3e-5 and linear schedule)."""

    kind: str
    negatives: int = 7
    loss: str = "softmax"
    margin: float = DEFAULT_MARGIN
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 16
    gradient_accumulation: int = 1
    learning_rate: float = 3e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH
    max_doc_length: int = DEFAULT_MAX_DOC_LENGTH
    query_layers: int | None = None
    pooling: str = "cls"
    tied: bool = False
    seed: int = 42
    save_every: int = 0
    keep_checkpoints: int = 2
    log_every: int = 10
    precision: str = "auto"
    train_limit: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in RANKER_KINDS:
            raise DilstoreError(f"unknown ranker kind {self.kind!r}; the kinds are {', '.join(RANKER_KINDS)}")
        at_least_one = {
            "negatives": self.negatives,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "gradient_accumulation": self.gradient_accumulation,
            "log_every": self.log_every,
            "keep_checkpoints": self.keep_checkpoints,
        }
        for name, value in at_least_one.items():
            if value < 1:
                raise DilstoreError(f"{name.replace('_', '-')} must be at least 1, got {value}")
        for name, value in (("max_steps", self.max_steps), ("train_limit", self.train_limit)):
            if value is not None and value < 1:
                raise DilstoreError(f"{name.replace('_', '-')} must be at least 1, got {value}")
        if self.max_query_length < 3 or self.max_doc_length < 3:
            raise DilstoreError(
                f"max-query-length and max-doc-length must be at least 3 ([CLS] text [SEP]), "
                f"got {self.max_query_length} and {self.max_doc_length}"
            )
        if self.loss not in LOSSES:
            raise DilstoreError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.margin <= 0:
            raise DilstoreError(f"margin must be positive, got {self.margin}")
        if not 0 <= self.warmup_ratio < 1:
            raise DilstoreError(f"warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.learning_rate <= 0:
            raise DilstoreError(f"learning-rate must be positive, got {self.learning_rate}")
        if self.save_every < 0:
            raise DilstoreError(f"save-every must be 0 (only at the end) or positive, got {self.save_every}")
        if self.precision not in PRECISIONS:
            raise DilstoreError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.pooling not in POOLINGS:
            raise DilstoreError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.kind != "earl" and (self.query_layers is not None or self.pooling != "cls" or self.tied):
            raise DilstoreError("query-layers, pooling and tied describe an EARL ranker only")

    def earl_options(self) -> EarlOptions:
        """The EARL variant this config trains (ignored by the other kinds)."""
        return EarlOptions(query_layers=self.query_layers, pooling=self.pooling, tied=self.tied)


@dataclass(frozen=True)
class RankingData:
    """Triples with every query and paragraph tokenized once by the ranker being trained."""

    triples: list[Triple]
    query_tokens: list[np.ndarray]  # per triple
    doc_tokens: dict[str, np.ndarray]  # per paragraph id

    def batch(self, indices: Sequence[int]) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        """Queries and their [positive, negatives...] groups for the triples at `indices`."""
        queries = [self.query_tokens[i] for i in indices]
        groups = [
            [self.doc_tokens[pid] for pid in (self.triples[i].positive, *self.triples[i].negatives)] for i in indices
        ]
        return queries, groups


@dataclass(frozen=True)
class RankingTrainingResult:
    """What a run did: the budget actually spent and where the ranker is."""

    output: Path
    kind: str
    steps: int
    total_steps: int
    triples_seen: int
    train_triples: int
    train_seconds: float
    final_loss: float
    losses: list[float] = field(repr=False)
    ranker: TrainableRanker = field(repr=False, compare=False)


def load_ranking_data(
    ranker: TrainableRanker, triples_file: Path, paragraphs_file: Path, config: RankingTrainingConfig
) -> RankingData:
    """Read and check the files, keep the first `train_limit` triples and `negatives` negatives, tokenize once."""
    paragraphs = read_paragraphs(paragraphs_file)
    triples = read_triples(triples_file, paragraphs, paragraphs_file, config.negatives)
    if config.train_limit is not None:
        triples = triples[: config.train_limit]
    used = dict.fromkeys(pid for triple in triples for pid in (triple.positive, *triple.negatives))
    return RankingData(
        triples=triples,
        query_tokens=[ranker.tokenize_query(triple.query, config.max_query_length) for triple in triples],
        doc_tokens={pid: ranker.tokenize_document(paragraphs[pid], config.max_doc_length) for pid in used},
    )


def ranking_loss(scores: torch.Tensor, config: RankingTrainingConfig) -> torch.Tensor:
    """The configured loss over scores (b, 1 + n), positive first, computed in fp32."""
    scores = scores.float()  # (b, 1 + n)
    if config.loss == "hinge":
        return pairwise_hinge_loss(scores, config.margin)
    return softmax_cross_entropy_loss(scores)


def accumulate_ranking_gradients(
    ranker: TrainableRanker,
    data: RankingData,
    micro_batches: Sequence[Sequence[int]],
    config: RankingTrainingConfig,
    device: torch.device,
    dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """Forward and backward over one optimizer step's micro-batches, adding into `.grad`; returns the mean loss.

    Each micro-batch's loss is divided by the number of micro-batches, so
    equal micro-batches accumulate the gradient of one large batch.
    """
    scaler = scaler or torch.amp.GradScaler("cuda", enabled=False)
    total = 0.0
    for indices in micro_batches:
        queries, groups = data.batch(indices)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            scores = ranker.score_groups(queries, groups)  # (b, 1 + n)
        loss = ranking_loss(scores, config) / len(micro_batches)
        scaler.scale(loss).backward()
        total += float(loss.detach())
    return total


def train_ranker(
    base_model: Path,
    triples_file: Path,
    paragraphs_file: Path,
    output_dir: Path,
    config: RankingTrainingConfig,
    *,
    command: str,
    resume: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
) -> RankingTrainingResult:
    """Train a `config.kind` ranker initialised from the plain encoder `base_model`; save it to `output_dir`.

    With `resume`, the newest complete checkpoint under OUTPUT/checkpoints
    is loaded (weights, optimizer, scheduler, RNG, position) and the run
    continues where it stopped; the config must match the interrupted run's.
    """
    output_dir = Path(output_dir)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    checkpoints = output_dir / "checkpoints"
    seed_everything(config.seed)
    resume_from = _resume_point(checkpoints, config) if resume else None
    ranker = load_ranker(resume_from) if resume_from else new_ranker(config.kind, base_model, config.earl_options())
    if ranker.kind != config.kind:
        raise DilstoreError(f"--resume: {resume_from} holds a {ranker.kind!r} ranker, not {config.kind!r}")
    data = load_ranking_data(ranker, Path(triples_file), Path(paragraphs_file), config)
    ranker.to(device).train()
    optimizer = build_optimizer(ranker, config)
    total_steps = total_optimizer_steps(len(data.triples), config)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(config.warmup_ratio * total_steps), total_steps)
    position = LoopPosition(step=0, features_seen=0, train_seconds=0.0)
    if resume_from is not None:
        position = load_training_state(resume_from, optimizer, scheduler)
    output_dir.mkdir(parents=True, exist_ok=True)
    run = _RunInfo(config, Path(base_model), Path(triples_file), Path(paragraphs_file), command, device,
                   len(data.triples), total_steps)  # fmt: skip
    _write_run_config(output_dir, run)

    dtype = autocast_dtype(config, device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    losses: list[float] = []
    bar = tqdm(total=total_steps, initial=position.step, disable=not progress, unit="step", dynamic_ncols=True)
    started = time.perf_counter() - position.train_seconds
    window_start, window_pairs = time.perf_counter(), 0
    for step_index, micro_batches in enumerate(optimizer_step_batches(len(data.triples), config)):
        if step_index >= total_steps:
            break
        if step_index < position.step:
            continue
        step_loss = accumulate_ranking_gradients(ranker, data, micro_batches, config, device, dtype, scaler)
        apply_optimizer_step(ranker, optimizer, scheduler, scaler, config.max_grad_norm)
        seen = sum(len(batch) for batch in micro_batches)
        position = LoopPosition(
            step=step_index + 1,
            features_seen=position.features_seen + seen,
            train_seconds=time.perf_counter() - started,
        )
        losses.append(step_loss)
        window_pairs += seen * (1 + config.negatives)
        rate = window_pairs / max(time.perf_counter() - window_start, 1e-9)
        bar.set_postfix(loss=f"{step_loss:.3f}", pairs_per_s=f"{rate:.1f}", refresh=False)
        bar.update(1)
        if position.step % config.log_every == 0 or position.step == total_steps:
            bar.write(
                f"step {position.step}/{total_steps} loss {float(np.mean(losses[-config.log_every:])):.4f} "
                f"lr {scheduler.get_last_lr()[0]:.2e} pairs/s {rate:.1f} "
                f"triples {position.features_seen} elapsed {position.train_seconds:.0f}s"
            )
            window_start, window_pairs = time.perf_counter(), 0
        if config.save_every and position.step % config.save_every == 0 and position.step < total_steps:
            _save_checkpoint(ranker, optimizer, scheduler, run, position, step_loss, checkpoints)
    bar.close()

    final_loss = losses[-1] if losses else float("nan")
    ranker.eval()
    ranker.save_pretrained(output_dir)
    _write_metadata(output_dir, ranker, run, position, final_loss)
    return RankingTrainingResult(
        output=output_dir,
        kind=ranker.kind,
        steps=position.step,
        total_steps=total_steps,
        triples_seen=position.features_seen,
        train_triples=len(data.triples),
        train_seconds=position.train_seconds,
        final_loss=final_loss,
        losses=losses,
        ranker=ranker,
    )


@dataclass(frozen=True)
class _RunInfo:
    """What stays fixed over a run and goes into every dilstore_training.json it writes."""

    config: RankingTrainingConfig
    base_model: Path
    triples_file: Path
    paragraphs_file: Path
    command: str
    device: torch.device
    train_triples: int
    total_steps: int


def _save_checkpoint(
    ranker: TrainableRanker,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    run: _RunInfo,
    position: LoopPosition,
    loss: float,
    checkpoints: Path,
) -> Path:
    """Write a resumable checkpoint atomically (temporary folder, then rename) and prune old ones."""
    final = step_directory(checkpoints, position.step)
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    ranker.save_pretrained(partial)
    save_training_state(partial, optimizer, scheduler, position)
    _write_metadata(partial, ranker, run, position, loss)
    partial.rename(final)
    prune_checkpoints(checkpoints, run.config.keep_checkpoints)
    return final


def _resume_point(checkpoints: Path, config: RankingTrainingConfig) -> Path:
    """The checkpoint to resume from; a DilstoreError when there is none or its config differs."""
    found = latest_checkpoint(checkpoints)
    if found is None:
        raise DilstoreError(f"--resume: no complete checkpoint under {checkpoints}")
    saved_file = checkpoints.parent / RUN_CONFIG_FILE
    if saved_file.is_file():
        saved = json.loads(saved_file.read_text(encoding="utf-8"))["config"]
        differing = sorted(
            name for name, value in asdict(config).items() if name != "save_every" and saved.get(name) != value
        )
        if differing:
            raise DilstoreError(f"--resume: settings differ from the interrupted run ({saved_file}): {differing}")
    return found


def _write_run_config(output_dir: Path, run: _RunInfo) -> None:
    """Record the settings at the start, so --resume can check it continues the same run."""
    document = {
        "config": asdict(run.config),
        "base_model": str(run.base_model),
        "triples": str(run.triples_file),
        "paragraphs": str(run.paragraphs_file),
        "command": run.command,
    }
    (output_dir / RUN_CONFIG_FILE).write_text(json.dumps(document, indent=1), encoding="utf-8")


def _write_metadata(
    directory: Path, ranker: TrainableRanker, run: _RunInfo, position: LoopPosition, final_loss: float
) -> None:
    """dilstore_training.json: the kind, the command, the data and the budget this checkpoint was trained with."""
    document: dict[str, Any] = {
        "kind": ranker.kind,
        "command": run.command,
        "base_model": str(run.base_model),
        "triples": str(run.triples_file),
        "paragraphs": str(run.paragraphs_file),
        "config": asdict(run.config),
        "steps": position.step,
        "total_steps": run.total_steps,
        "triples_seen": position.features_seen,
        "pairs_seen": position.features_seen * (1 + run.config.negatives),
        "train_triples": run.train_triples,
        "train_seconds": round(position.train_seconds, 1),
        "final_loss": final_loss,
        "hardware": hardware_description(run.device),
        "torch": torch.__version__,
    }
    (Path(directory) / TRAINING_METADATA_FILE).write_text(json.dumps(document, indent=1), encoding="utf-8")
