"""The training loop that `train qa` and `train earl|cross-encoder|siamese` share, and the parts it is made of.

A trainer (reader/training/qa.py, reader/training/ranking.py) loads its model
and data and says how to compute one step's gradients; reader/training/runs.py
puts a run together in one order (seed, resume, optimize, record, train, save);
everything else is here, so both run the same way:

- AdamW (no decay on biases and LayerNorm) with linear warm-up then linear
  decay to zero, gradient clipping, gradient accumulation.
- fp32 on CPU; bf16 (or fp16 with loss scaling) autocast on CUDA.
- Seeded: the example order of epoch e is a permutation drawn from seed + e,
  independent of the dropout RNG, so a resumed run skips exactly what it saw.
- A progress bar, and a log line every `log_every` steps.
- No wait for the device inside a step: a step's loss stays a device tensor
  until a log line, a checkpoint or the end reads it, so on a GPU the host
  queues the next step while this one computes.
- Periodic checkpoints under OUTPUT/checkpoints/step-N (model + training
  state, see reader/training/state.py), every N steps and at least every M
  minutes of training, so a killed run loses at most M minutes; each is
  written under a temporary name and
  renamed, so a run cut off at any moment leaves a usable checkpoint; only
  the newest `keep_checkpoints` are kept (with `save_every`, those at its
  multiples: a checkpoint taken by time goes once a newer one exists).
- Resumption from the newest checkpoint, refused when the settings recorded
  in OUTPUT/run_config.json at the start differ.
- SIGTERM or SIGINT (Ctrl-C) ends the run after the step in progress, with a
  checkpoint of it (StoppedBySignal), so a stop asked for loses nothing; a
  second signal acts at once, as without this; one during the last step acts
  once the final model is saved.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.progress_lines import bar_options, steady_bar
from dilstore.reader.text.files import read_json
from dilstore.reader.training.checkpoint_files import (
    CHECKPOINTS_DIR,
    RUN_CONFIG_FILE,
    latest_checkpoint,
    step_directory,
)
from dilstore.reader.training.configs import LoopConfig
from dilstore.reader.training.hardware import cpu_model
from dilstore.reader.training.state import (
    PARTIAL_SUFFIX,
    LoopPosition,
    load_training_state,
    prune_checkpoints,
    remove_partial_checkpoints,
    save_training_state,
    verify_checkpoint,
)
from dilstore.storage.atomic_files import atomic_write_text, give_new_file_modes
from dilstore.storage.checks import finite_float
from dilstore.storage.cpus import cgroup_cpu_quota, runnable_cpu_count
from dilstore.storage.durability import fsync_dir, fsync_tree, remove_path
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.file_errors import FILE_SIZE_ADVICE

# Micro-batches per length-sorted group (Hugging Face's LengthGroupedSampler uses 50).
LENGTH_GROUP = 50
# Settings a resumed run may change: how often it saves and logs, how many checkpoints it keeps, how it chunks and
# compiles (none changes a result), and the teacher's and shared-norm triples' paths, as their content is checked
# by SHA-256 (INPUT_DIGESTS) like the base's and --train's.
_MAY_CHANGE_ON_RESUME = frozenset({"save_every", "save_every_minutes", "keep_checkpoints", "log_every",
                                   "chunk_windows", "compile", "teacher", "shared_norm"})
# What a save that could not write raises: safetensors' own error is no OSError (its message carries the OS's).
SAVE_ERRORS = (OSError, SafetensorError)


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and CUDA) so a run is repeatable."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def training_device(device: str | torch.device | None) -> torch.device:
    """The device asked for, or CUDA when available, else the CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def build_optimizer(
    model: torch.nn.Module, config: LoopConfig, learning_rates: Mapping[str, float] | None = None
) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases or LayerNorm weights), as BERT fine-tuning does.

    Trainable parameters only. `learning_rates` maps parameter-name prefixes
    to their own peak learning rate (the first matching prefix wins; e.g. a
    low one for EARL's encoder copies); every other parameter takes
    `config.learning_rate`. The schedule scales each group alike.
    """
    groups: dict[tuple[float, bool], list[torch.nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        prefix = next((prefix for prefix in learning_rates or {} if name.startswith(prefix)), None)
        rate = config.learning_rate if prefix is None else learning_rates[prefix]  # type: ignore[index]
        decays = not (parameter.ndim < 2 or "LayerNorm" in name or "norm" in name.lower())
        groups.setdefault((rate, decays), []).append(parameter)
    return torch.optim.AdamW(
        [
            {"params": parameters, "lr": rate, "weight_decay": config.weight_decay if decays else 0.0}
            for (rate, decays), parameters in sorted(groups.items(), key=lambda item: (-item[0][0], not item[0][1]))
        ],
        lr=config.learning_rate,
    )


def total_optimizer_steps(num_features: int, config: LoopConfig) -> int:
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
    num_features: int, config: LoopConfig, lengths: Sequence[int] | None = None
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


def autocast_dtype(config: LoopConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: None (fp32) on CPU; bf16 on CUDA when supported, else fp16; bf16 on CPU when asked.

    A CPU with AVX512-BF16 or AMX runs bf16 matrix products natively, so asking for bf16 there speeds a step
    (BENCHMARKS.md measures it), and it is what training on CUDA uses. fp16 needs CUDA (its loss scaling does).
    """
    if config.precision == "fp32" or (config.precision == "auto" and device.type != "cuda"):
        return None
    if config.precision == "bf16" and device.type == "cpu":
        return torch.bfloat16
    if device.type != "cuda":
        raise DilstoreError(f"precision {config.precision} needs a CUDA device; this run is on {device}")
    if config.precision == "fp16" or (config.precision == "auto" and not torch.cuda.is_bf16_supported()):
        return torch.float16
    return torch.bfloat16


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """Autocast to `dtype` on `device`; with None (fp32) a context that changes nothing."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def accumulate_micro_batches(
    micro_batches: Sequence[Sequence[int]],
    micro_batch_loss: Callable[[Sequence[int]], torch.Tensor],
    scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """Backward over one optimizer step's micro-batches, adding into `.grad`; returns the step's mean loss.

    `micro_batch_loss` gives the mean loss of the examples at some indices.
    Each is divided by the number of micro-batches, so equal-sized
    micro-batches accumulate the gradient of one large batch. The step's
    loss comes back as a 0-dimensional tensor on the loss's device.
    """
    scaler = scaler or torch.amp.GradScaler("cuda", enabled=False)
    losses = []
    for indices in micro_batches:
        loss = micro_batch_loss(indices) / len(micro_batches)
        scaler.scale(loss).backward()
        losses.append(loss.detach())
    return torch.stack(losses).sum()  # (): on the loss's device, read only when needed (module docstring)


def hardware_description(device: torch.device, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """A short line for the metadata (and the model card that quotes it): the accelerator, or the CPU's model with
    the logical CPUs the run may use (of the machine's, where fewer) and torch's thread count."""
    if device.type == "cuda":
        return f"CUDA {torch.cuda.get_device_name(device)}"
    return f"CPU {cpu_model(cpuinfo)} ({usable_cpus()}), {torch.get_num_threads()} torch thread(s)"


def usable_cpus() -> str:
    """The logical CPUs this process may run on, and the machine's count where that is more: a run held to some of
    them (taskset, a container's cpuset) was described as on all of them (review52 F3). A cgroup CPU quota below
    them is named too: a run in a container held to 2 CPUs' time of a 64-core host (`docker run --cpus 2`, a
    Kubernetes CPU limit) was recorded, and its card described, as on "64 logical CPUs" (left58 F5)."""
    machine = os.cpu_count()
    usable = runnable_cpu_count()
    if usable is None:
        return "logical CPUs not known"
    of = "" if machine is None or usable >= machine else f" of {machine}"
    counted = f"{usable} logical CPU(s){of}" if of else f"{usable} logical CPUs"
    quota = cgroup_cpu_quota()
    return counted if quota is None or quota >= usable else f"{counted}, held to {quota} by a cgroup CPU quota"


def write_training_record(
    directory: Path, document: dict[str, Any], position: LoopPosition, final_loss: float, device: torch.device
) -> None:
    """Write dilstore_training.json: the trainer's `document`, then the time trained, last loss, hardware and torch.

    A last loss that is not finite (a step fp16's gradient scaler skipped, or a call that ran no step) is written as
    null: json.dumps wrote NaN, which is no JSON and which other languages' parsers refuse (left61 F4)."""
    record = {
        **document,
        "train_seconds": round(position.train_seconds, 1),
        "final_loss": finite_float(final_loss),
        "hardware": hardware_description(device),
        "torch": torch.__version__,
    }
    atomic_write_text(Path(directory) / TRAINING_METADATA_FILE, json.dumps(record, indent=1))


def resume_point(output_dir: Path, config: LoopConfig) -> Path:
    """The checkpoint under OUTPUT/checkpoints to resume from; a DilstoreError when there is none or the config differs.

    `config` (a dataclass) is compared with the one write_run_config recorded,
    all but how often checkpoints are saved, which may change between the parts of a run.
    The checkpoint's files must still have the checksums recorded when it was saved.
    A setting the recorded file lacks (one added since that run started)
    counts as the value runs had before it existed: its field's metadata
    "before" (a function of the recorded settings) when it changed what a
    run does, else its default.
    """
    checkpoints = Path(output_dir) / CHECKPOINTS_DIR
    found = latest_checkpoint(checkpoints)
    if found is None:
        raise DilstoreError(f"--resume: no complete checkpoint under {checkpoints}")
    saved_file = run_record(output_dir, found)
    if saved_file.is_file():
        saved = read_run_settings(saved_file)
        if (theirs := _trainer_of(saved)) != (ours := _trainer_of(asdict(config))):
            raise DilstoreError(f"--resume: {output_dir} holds a `dilstore train {theirs}` run ({saved_file}), not a "
                                f"`train {ours}` one: resume it with its own command, or give this run another "
                                "--output")  # fmt: skip
        defaults = {
            item.name: item.metadata["before"](saved) if "before" in item.metadata else item.default
            for item in fields(config)
            if item.default is not MISSING
        }
        differing = [
            f"{_flag(name)} {value} (the run had {saved.get(name, defaults.get(name))})"
            for name, value in sorted(asdict(config).items())
            if name not in _MAY_CHANGE_ON_RESUME and saved.get(name, defaults.get(name)) != value
        ]
        if differing:
            raise DilstoreError(f"--resume: settings differ from the interrupted run ({saved_file}): "
                                f"{'; '.join(differing)}")  # fmt: skip
    verify_checkpoint(found)
    return found


def _trainer_of(settings: Mapping[str, Any]) -> str:
    """The `dilstore train` command whose run recorded `settings`: a ranker's kind, else `qa` (a reader's run records
    no kind). A resume into another trainer's run listed every setting the two configs differ in (train52)."""
    kind = settings.get("kind")
    return kind if isinstance(kind, str) else "qa"


# Settings whose command-line flag is not their name with dashes.
_FLAGS = {"gradient_accumulation": "--gradient-accumulation-steps", "group_by_length": "--no-group-by-length",
          "kind": "the ranker kind"}  # fmt: skip


def _flag(setting: str) -> str:
    """How the command line names a setting (`learning_rate`: --learning-rate)."""
    return _FLAGS.get(setting, "--" + setting.replace("_", "-"))


def run_record(output_dir: Path, checkpoint: Path) -> Path:
    """Where a resumed run's settings and input digests were recorded: OUTPUT/run_config.json, or, in a folder
    that lacks it (rebuilt from a copied checkpoints/), the checkpoint's own dilstore_training.json, which holds
    them too. Without the fallback such a resume took any settings, data and base without a word."""
    recorded = Path(output_dir) / RUN_CONFIG_FILE
    return recorded if recorded.is_file() else Path(checkpoint) / TRAINING_METADATA_FILE


def read_run_settings(path: Path) -> dict[str, Any]:
    """The settings ("config") write_run_config recorded in `path`; a DilstoreError naming the file when it holds
    none (cut short or edited by hand: a JSONDecodeError or KeyError traceback on --resume)."""
    document = read_json(path)
    settings = document.get("config") if isinstance(document, dict) else None
    if not isinstance(settings, dict):
        raise DilstoreError(f"--resume: {path} holds no run settings (a JSON object with a \"config\" object); "
                            "it cannot tell whether this command continues that run")  # fmt: skip
    return settings


def write_run_config(output_dir: Path, config: LoopConfig, command: str, inputs: Mapping[str, object]) -> None:
    """Create `output_dir` and record the settings, the `inputs` (name: path, and their digests) and the command.

    resume_point reads it back, so --resume can check it continues the same run.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    document = {"config": asdict(config), **inputs, "command": command}
    # Whole or not at all: written in place, a kill or a full disk left it empty, and no --resume could read it.
    atomic_write_text(output_dir / RUN_CONFIG_FILE, json.dumps(document, indent=1))


@dataclass(frozen=True)
class Optimization:
    """A run's optimizer and schedule, its length in optimizer steps, and the position it starts from."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    total_steps: int
    start: LoopPosition


def start_optimization(
    model: torch.nn.Module,
    num_examples: int,
    config: LoopConfig,
    resume_from: Path | None,
    learning_rates: Mapping[str, float] | None = None,
) -> Optimization:
    """AdamW and the linear warm-up and decay over the run's steps, restored from `resume_from` when given.

    `learning_rates` gives some parameters their own peak rate (build_optimizer).
    Restoring also restores the torch RNG, so call this once every module is built.
    """
    optimizer = build_optimizer(model, config, learning_rates)
    total_steps = total_optimizer_steps(num_examples, config)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(config.warmup_ratio * total_steps), total_steps)
    start = LoopPosition(step=0, features_seen=0, train_seconds=0.0)
    if resume_from is not None:
        start = load_training_state(resume_from, optimizer, scheduler)
    return Optimization(optimizer=optimizer, scheduler=scheduler, total_steps=total_steps, start=start)


@dataclass(frozen=True)
class Throughput:
    """How a trainer reports its speed in the progress bar and the log lines."""

    per_example: int  # units counted per training example: 1 window, or the 1 + n pairs of a triple
    bar_name: str  # the progress bar's key for units per second
    log_name: str  # the log line's label for units per second
    log_digits: int  # decimals of units per second in the log line
    seen_name: str  # the log line's label for the examples seen so far


class Accumulate(Protocol):
    """Forward and backward over one optimizer step's micro-batches (example indices); returns the step's loss.

    The loss is a 0-dimensional tensor on the model's device, so that the loop can read it without a wait per step.
    """

    def __call__(
        self, micro_batches: Sequence[Sequence[int]], *, dtype: torch.dtype | None, scaler: torch.amp.GradScaler
    ) -> torch.Tensor: ...


class SaveModel(Protocol):
    """Write the model and its dilstore_training.json (budget at `position`, last loss) into an existing folder."""

    def __call__(self, directory: Path, position: LoopPosition, loss: float) -> None: ...


@dataclass(frozen=True)
class LoopOutcome:
    """Where the loop stopped, the run's length in optimizer steps, and the loss of every step this call ran."""

    position: LoopPosition
    total_steps: int
    losses: list[float]

    @property
    def final_loss(self) -> float:
        """The last step's loss; NaN when this call ran no step."""
        return self.losses[-1] if self.losses else float("nan")


def run_training_loop(
    model: torch.nn.Module,
    optimization: Optimization,
    step_plan: Iterable[Sequence[Sequence[int]]],
    *,
    accumulate: Accumulate,
    save: SaveModel,
    config: LoopConfig,
    device: torch.device,
    output_dir: Path,
    throughput: Throughput,
    progress: bool = True,
) -> LoopOutcome:
    """Run the steps of `step_plan` from `optimization.start` on, then save the model to `output_dir` in eval mode.

    Every `config.log_every` steps (and at the last) a line reports the mean
    loss since the last line, the learning rate and the speed; every
    `config.save_every` steps, and whenever `config.save_every_minutes` of
    training passed since the last one (0: never by time), a resumable
    checkpoint goes under OUTPUT/checkpoints, except at the last step.
    SIGTERM or SIGINT ends it after the step in progress with a checkpoint
    of that step, raising StoppedBySignal (module docstring).
    """
    dtype = autocast_dtype(config, device)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    total_steps, position = optimization.total_steps, optimization.start
    log = _StepLog(position, total_steps, config.log_every, throughput, progress)
    if config.max_steps is not None and config.max_steps > total_steps:  # train46 F6: it was cut without a word
        log.write(f"--max-steps {config.max_steps} is more than the {total_steps} step(s) of {config.epochs} "
                  "epoch(s): the run ends there; raise --epochs for more")  # fmt: skip
    started = time.perf_counter() - position.train_seconds
    last_save = time.perf_counter()
    remove_partial_checkpoints(Path(output_dir) / CHECKPOINTS_DIR)  # what a kill inside an earlier save left
    with _stop_requests() as stop:
        for step_index, micro_batches in enumerate(step_plan):
            if step_index >= total_steps:
                break
            if step_index < position.step:
                continue
            step_loss = accumulate(micro_batches, dtype=dtype, scaler=scaler)
            apply_optimizer_step(model, optimization.optimizer, optimization.scheduler, scaler, config.max_grad_norm)
            seen = sum(len(batch) for batch in micro_batches)
            position = LoopPosition(
                step=step_index + 1,
                features_seen=position.features_seen + seen,
                train_seconds=time.perf_counter() - started,
            )
            log.record(position, step_loss, seen, optimization.scheduler)
            stopping = stop.signal_number is not None and position.step < total_steps
            if position.step < total_steps and (stopping or _checkpoint_due(config, position.step, last_save)):
                loss_value = step_loss.item()
                require_finite_weights(model, position.step, loss_value, output_dir)
                _save_checkpoint(output_dir, optimization, position, loss_value, save, config)
                last_save = time.perf_counter()
            if stopping:
                log.close()
                raise _stopped(output_dir, position, total_steps, stop.signal_number)
        log.close()
        outcome = LoopOutcome(position=position, total_steps=total_steps, losses=log.step_losses())
        require_finite_weights(model, position.step, outcome.final_loss, output_dir)
        model.eval()
        # Still under the stop handlers: a SIGTERM here ended the process mid-save, leaving a final model without
        # its record, which a re-run took for a base model and --resume for no run at all.
        try:
            save(output_dir, position, outcome.final_loss)
            give_new_file_modes(output_dir)
            fsync_tree(output_dir)  # an error only the write-back meets (EIO, an NFS quota) fails the save (disk56 F4)
        except SAVE_ERRORS as error:
            raise save_failed(f"the model to {output_dir}", error, output_dir) from None
    if stop.signal_number is not None:
        signal.raise_signal(stop.signal_number)  # asked during the last step: it acts now that the model is saved
    return outcome


class _StepLog:
    """The loop's report of its steps: a progress bar, and every `log_every` steps (and at the last) a line on stderr
    with the mean loss since the line before, the learning rate and the speed. stdout holds only the result (--json).

    Each step's loss stays a () tensor on the device until a log line, a checkpoint or the end reads it.
    """

    def __init__(
        self, start: LoopPosition, total_steps: int, log_every: int, throughput: Throughput, progress: bool
    ) -> None:
        self.total_steps, self.log_every, self.throughput = total_steps, log_every, throughput
        self.losses: list[torch.Tensor] = []
        self.logged_loss, self.logged_step = "-", start.step
        self.speed = _SpeedWindow(throughput.per_example)
        self.bar = steady_bar(tqdm)(total=total_steps, initial=start.step, disable=not progress, unit="step",
                                    desc="train", **bar_options())  # fmt: skip

    def write(self, line: str) -> None:
        """A line on stderr above the bar."""
        self.bar.write(line, file=sys.stderr)

    def record(
        self, position: LoopPosition, loss: torch.Tensor, examples: int, scheduler: torch.optim.lr_scheduler.LRScheduler
    ) -> None:
        """Count the step that ended at `position` with `loss` over `examples` examples; log it if a line is due."""
        self.losses.append(loss)
        rate = self.speed.add(examples)
        line_due = position.step % self.log_every == 0 or position.step == self.total_steps
        if line_due:  # the mean over the steps since the last line (fewer than log_every before the last)
            self.logged_loss = f"{torch.stack(self.losses[-(position.step - self.logged_step) :]).mean().item():.4f}"
            self.logged_step = position.step
        self.bar.set_postfix(loss=self.logged_loss, **{self.throughput.bar_name: f"{rate:.1f}"}, refresh=False)
        self.bar.update(1)
        if line_due:
            learning_rate = scheduler.get_last_lr()[0]
            self.write(_log_line(position, self.total_steps, self.logged_loss, learning_rate, rate, self.throughput))
            self.speed.restart()

    def close(self) -> None:
        self.bar.close()

    def step_losses(self) -> list[float]:
        """Every recorded step's loss, read from the device at once."""
        return torch.stack(self.losses).tolist() if self.losses else []


class _SpeedWindow:
    """Units (throughput.per_example per example) per second since the window's start: the speed a log line shows,
    restarted after each line."""

    def __init__(self, per_example: int) -> None:
        self.per_example = per_example
        self.restart()

    def restart(self) -> None:
        self.start, self.units = time.perf_counter(), 0

    def add(self, examples: int) -> float:
        """Count a step's `examples`; the speed since the window's start."""
        self.units += examples * self.per_example
        return self.units / max(time.perf_counter() - self.start, 1e-9)


def _log_line(
    position: LoopPosition, total_steps: int, loss: str, learning_rate: float, rate: float, throughput: Throughput
) -> str:
    """A training log line: step, mean loss since the last line, learning rate, speed, examples seen, time."""
    return (f"step {position.step}/{total_steps} loss {loss} lr {learning_rate:.2e} {throughput.log_name} "
            f"{rate:.{throughput.log_digits}f} {throughput.seen_name} {position.features_seen} "
            f"elapsed {position.train_seconds:.0f}s")  # fmt: skip


def _checkpoint_due(config: LoopConfig, step: int, last_save: float) -> bool:
    """Whether step `step` ends with a checkpoint: every save_every steps, or save_every_minutes after the last."""
    due_by_steps = config.save_every and step % config.save_every == 0
    minutes = (time.perf_counter() - last_save) / 60
    return bool(due_by_steps or (config.save_every_minutes and minutes >= config.save_every_minutes))


def require_finite_weights(model: torch.nn.Module, step: int, loss: float, output_dir: Path) -> None:
    """A DilstoreError, before anything is saved, when training diverged and some weight is NaN or infinite.

    Checked at each checkpoint and at the end (one pass over the weights), not at every step, so that the loss stays
    on the device between log lines. A non-finite loss alone is not divergence: under fp16 the gradient scaler skips
    such a step and the weights stay finite.
    """
    broken = [name for name, parameter in model.named_parameters() if not torch.isfinite(parameter).all()]
    if broken:
        raise DilstoreError(
            f"training diverged: at step {step} (loss {loss}) {len(broken)} weight tensor(s) hold NaN or infinity, "
            f"first {broken[0]!r}; nothing was saved for this step, and the checkpoints under {output_dir} before it "
            "are kept; train again with a lower --learning-rate"
        )


@dataclass
class _StopRequest:
    """The signal that asked the loop to stop after the step in progress, once one has."""

    signal_number: int | None = None


@contextmanager
def _stop_requests() -> Iterator[_StopRequest]:
    """While training, the first SIGTERM, SIGINT or SIGHUP (the terminal that started the run closed) asks for a stop
    after the step in progress; a second acts as it would without this (the handlers in place before are back from
    the first). A signal ignored before stays ignored (SIGHUP under `nohup`: the run must outlive its terminal).
    Only the main thread may set handlers, so elsewhere the signals keep theirs."""
    request = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {number: handler or signal.SIG_DFL for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
                if (handler := signal.getsignal(number)) is not signal.SIG_IGN}  # fmt: skip

    def ask(number: int, frame: Any) -> None:
        request.signal_number = number
        for other, handler in previous.items():
            signal.signal(other, handler)
        # On a line of its own above the bar, which owned the line it was written onto (longrun45 F8).
        tqdm.write(f"{signal.Signals(number).name}: stopping once the step in progress is done, with a checkpoint "
                   "(the final model if it is the last step); again to stop at once", file=sys.stderr)  # fmt: skip

    for number in previous:
        signal.signal(number, ask)
    try:
        yield request
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _stopped(output_dir: Path, position: LoopPosition, total_steps: int, signal_number: int) -> StoppedBySignal:
    """The error that ends a run stopped by `signal_number` once the step at `position` is checkpointed."""
    checkpoint = step_directory(Path(output_dir) / CHECKPOINTS_DIR, position.step)
    return StoppedBySignal(
        f"stopped by {signal.Signals(signal_number).name} after step {position.step} of {total_steps}; "
        f"checkpoint {checkpoint}: continue with the same command and --resume",
        signal_number,
    )


def _save_checkpoint(
    output_dir: Path, optimization: Optimization, position: LoopPosition, loss: float, save: SaveModel,
    config: LoopConfig,
) -> None:
    """Write a resumable checkpoint atomically (temporary folder, then rename), then prune (`prune_checkpoints`).

    It carries dilstore_training.json too, so a run cut off later still
    leaves a checkpoint that can be evaluated and packaged as it is.
    """
    checkpoints = Path(output_dir) / CHECKPOINTS_DIR
    final = step_directory(checkpoints, position.step)
    partial = final.with_name(final.name + PARTIAL_SUFFIX)  # a leftover was removed as the loop started
    try:
        partial.mkdir(parents=True)
        save(partial, position, loss)
        curve_point = bool(config.save_every) and position.step % config.save_every == 0
        save_training_state(partial, optimization.optimizer, optimization.scheduler, position, curve_point=curve_point)
        give_new_file_modes(partial)
        # On the disk before it is published: a write-back that fails (EIO, an NFS quota met at close) is met here,
        # where the checkpoint was renamed into place as complete and the older ones pruned after it (disk56 F4).
        fsync_tree(partial)
        partial.rename(final)
        fsync_dir(checkpoints)
    except SAVE_ERRORS as error:
        remove_path(partial)  # a model and its optimizer state: it kept full the disk that had just filled up
        raise save_failed(f"checkpoint {final}", error, output_dir) from None
    prune_checkpoints(checkpoints, config.keep_checkpoints, config.save_every)


def save_failed(what: str, error: OSError | SafetensorError, output_dir: Path) -> DilstoreError:
    """The one-line error of a save of `what` that failed with `error`: the problem and how to go on, from the
    newest checkpoint when there is one (full49 F1: a traceback and exit 1, from safetensors' error)."""
    if isinstance(error, OSError):
        problem = f"{error.strerror or error}{f' ({error.filename})' if error.filename else ''}"
        number = error.errno
    else:  # "Error while serializing: I/O error: No space left on device (os error 28)"
        problem = str(error).rpartition("I/O error: ")[2]
        number = next((code for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) if f"(os error {code})" in problem),
                      None)  # fmt: skip
    again = ("run the same command with --resume" if latest_checkpoint(Path(output_dir) / CHECKPOINTS_DIR)
             else "run the same command again")  # fmt: skip
    if number in (errno.ENOSPC, errno.EDQUOT):
        advice = "free space"
    elif number == errno.EFBIG:  # said "check the disk", where precompute says to raise the limit (left56b F4)
        advice = FILE_SIZE_ADVICE
    else:
        advice = "check the disk"
    return DilstoreError(f"cannot write {what}: {problem}: {advice}, then {again}")
