"""One training run from start to saved model: the sequence `train qa` and `train earl|cross-encoder|siamese` share.

A trainer (reader/training/qa.py, reader/training/ranking.py) calls
`start_run`, loads its model (from `RunStart.resume_from` when resuming) and
its data, and hands both to `finish_run` as a `TrainerRun`. The two calls fix
the order every run takes, so both trainers seed, resume, record and save alike:

1. the device, the seeds (Python, numpy, torch), and the checkpoint to resume
   from, refused when the settings differ from the interrupted run's;
2. (the trainer) the model and the data, so a new model's random init comes
   from the seeded RNG;
3. the model on the device in train mode, AdamW and the schedule (restored,
   with the RNG, from the checkpoint on resume);
4. on resume, the input files compared with the interrupted run's (by SHA-256);
   then OUTPUT/run_config.json with the settings, the inputs, their digests
   and the command;
5. the shared loop (loop.run_training_loop), which saves the model and its
   dilstore_training.json at every checkpoint and at the end.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.text.files import read_json
from dilstore.reader.training.checkpoint_files import CHECKPOINTS_DIR, RUN_CONFIG_FILE, latest_checkpoint
from dilstore.reader.training.configs import LoopConfig
from dilstore.reader.training.loop import (
    Accumulate,
    LoopOutcome,
    Throughput,
    autocast_dtype,
    resume_point,
    run_record,
    run_training_loop,
    seed_everything,
    start_optimization,
    training_device,
    write_run_config,
    write_training_record,
)
from dilstore.reader.training.state import LoopPosition
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError

# The files of a saved Hugging Face model, which a run's final save writes into its --output.
MODEL_FILES = ("config.json", "model.safetensors")
# run_config.json's record of the SHA-256 of each input file, which --resume compares.
INPUT_DIGESTS = "input_sha256"


@dataclass(frozen=True)
class RunStart:
    """Where a run writes, the device it trains on, and the checkpoint it resumes from (None: a new run)."""

    output_dir: Path
    device: torch.device
    resume_from: Path | None


@dataclass(frozen=True)
class TrainerRun:
    """What a trainer hands `finish_run` once its model and data are loaded.

    `model` is a torch module with `save_pretrained(directory)` (a reader or a
    ranker); `identity` opens dilstore_training.json (the kind, and k for a reader);
    `inputs` names the files the run read (recorded in run_config.json and
    dilstore_training.json); `counts(position)` closes it: what the run had
    seen at `position`, and how large its data is. `save_checkpoint(directory)`,
    where given, saves a periodic checkpoint's weights in place of
    `model.save_pretrained` (the final model is always saved by the latter).
    """

    model: torch.nn.Module
    num_examples: int
    step_plan: Iterable[Sequence[Sequence[int]]]
    accumulate: Accumulate
    throughput: Throughput
    identity: Mapping[str, Any]
    inputs: Mapping[str, str]
    counts: Callable[[LoopPosition], dict[str, int]]
    learning_rates: Mapping[str, float] | None = None
    save_checkpoint: Callable[[Path], None] | None = None


def start_run(
    output_dir: Path, config: LoopConfig, *, resume: bool, device: str | torch.device | None
) -> RunStart:
    """Step 1 of the module docstring: pick the device, seed everything, and find the checkpoint to resume from.

    With `resume`, the newest complete checkpoint under OUTPUT/checkpoints is
    the one: `finish_run` restores its optimizer, scheduler, RNG and position,
    and the trainer loads its weights, so the run continues where it stopped;
    the config must match the interrupted run's (a DilstoreError otherwise).
    A run that finished has nothing to continue (a DilstoreError too).
    """
    output_dir = Path(output_dir)
    chosen = training_device(device)
    autocast_dtype(config, chosen)  # a precision the device lacks is refused before the run writes anything
    seed_everything(config.seed)
    if not resume:
        refuse_an_earlier_run(output_dir)
        return RunStart(output_dir, chosen, None)
    refuse_a_finished_run(output_dir)
    return RunStart(output_dir, chosen, resume_point(output_dir, config))


def refuse_an_earlier_run(output_dir: Path) -> None:
    """A DilstoreError when `output_dir` holds a run to continue or keep (a complete checkpoint or a final model),
    or any other model, which the run's final save would overwrite.

    A new run there would record its settings over the old run's and leave
    the old checkpoints beside its own, so a later --resume would continue
    the old run's weights under the new run's record (or overwrite a finished
    model). A model that no run made there is most likely the run's own base
    model (`--output` equal to `--base-model`). A run stopped before its
    first checkpoint left nothing to keep, so a new run may start there (as a
    scheduler relaunching it does); so did one whose final save was cut (its
    run_config.json and model files, but no record), and a new run's save
    replaces those files.
    """
    found = []
    latest = latest_checkpoint(output_dir / CHECKPOINTS_DIR)
    if latest is not None:
        found.append(f"checkpoint {latest.name}")
    if (output_dir / TRAINING_METADATA_FILE).is_file():
        found.append(f"a final model, {TRAINING_METADATA_FILE}")
    if found:
        finished = (output_dir / TRAINING_METADATA_FILE).is_file()  # refuse_a_finished_run: nothing left to resume
        go_on = "" if finished else "continue it with --resume, or "
        raise DilstoreError(
            f"--output {output_dir} holds a training run already ({', '.join(found)}): {go_on}give another --output "
            "(remove that folder to start over there)"
        )
    model_files = [name for name in MODEL_FILES if (output_dir / name).exists()]
    if model_files and not (output_dir / RUN_CONFIG_FILE).is_file():
        raise DilstoreError(
            f"--output {output_dir} holds a model ({', '.join(model_files)}) that the run's final save would "
            "overwrite (is it the base model?): give another --output"
        )


def refuse_a_finished_run(output_dir: Path) -> None:
    """A DilstoreError when `output_dir` holds a run's final model: --resume has nothing left to train.

    The last checkpoint lies some steps before the end (none is saved at the
    last step), so resuming a finished run repeated those steps and wrote
    the final model and its record again.
    """
    record = output_dir / TRAINING_METADATA_FILE
    if not record.is_file():
        return
    try:
        document = json.loads(record.read_text(encoding="utf-8"))
        where = f"step {document['steps']} of {document['total_steps']}"
    except (OSError, ValueError, TypeError, KeyError):
        where = "its final model saved"
    raise DilstoreError(
        f"--resume: the run in {output_dir} finished ({where}, {TRAINING_METADATA_FILE}): nothing to resume; "
        "evaluate or package it, or give another --output for a new run"
    )


def input_digests(inputs: Mapping[str, str]) -> dict[str, str]:
    """The SHA-256 of each input, by its name in `inputs`: of a file (training data), or of a model folder's
    weights (`model.safetensors`, the base model); other folders are left out."""
    digests = {}
    for name, given in inputs.items():
        path = Path(given)
        weights = path / "model.safetensors"
        if path.is_file() or weights.is_file():
            digests[name] = sha256_file(path if path.is_file() else weights)
    return digests


def refuse_other_inputs(record: Path, digests: Mapping[str, str]) -> None:
    """A DilstoreError when an input file of a resumed run differs from the one the interrupted run read, as its
    `record` (loop.run_record) lists them.

    resume_point compares the settings only; a resumed run that read another
    triples or SQuAD file would mix two datasets under one record. Runs
    recorded before digests were kept are not checked.
    """
    recorded = read_json(record).get(INPUT_DIGESTS, {}) if record.is_file() else {}
    differing = sorted(name for name, digest in recorded.items() if digests.get(name, digest) != digest)
    if differing:
        raise DilstoreError(
            f"--resume: not the data the interrupted run read: {', '.join(differing)} (its SHA-256 is recorded in "
            f"{record}); resume with the same files, or start a new run"
        )


def finish_run(
    start: RunStart, run: TrainerRun, config: LoopConfig, *, command: str, progress: bool
) -> LoopOutcome:
    """Steps 3 to 5 of the module docstring: optimize, record the run, train, and save the model to OUTPUT."""
    digests = input_digests(run.inputs)
    if start.resume_from is not None:
        refuse_other_inputs(run_record(start.output_dir, start.resume_from), digests)
    run.model.to(start.device).train()
    optimization = start_optimization(run.model, run.num_examples, config, start.resume_from, run.learning_rates)
    write_run_config(start.output_dir, config, command, {**run.inputs, INPUT_DIGESTS: digests})

    def save(directory: Path, position: LoopPosition, loss: float) -> None:
        """The model and its dilstore_training.json: a periodic checkpoint or the final model."""
        periodic = Path(directory) != start.output_dir
        (run.save_checkpoint if periodic and run.save_checkpoint else run.model.save_pretrained)(directory)
        document = {
            **run.identity,
            "command": command,
            **run.inputs,
            INPUT_DIGESTS: digests,
            "config": asdict(config),
            "steps": position.step,
            "total_steps": optimization.total_steps,
            **run.counts(position),
        }
        write_training_record(directory, document, position, loss, start.device)

    return run_training_loop(
        run.model,
        optimization,
        run.step_plan,
        accumulate=run.accumulate,
        save=save,
        config=config,
        device=start.device,
        output_dir=start.output_dir,
        throughput=run.throughput,
        progress=progress,
    )
