"""How a trained run becomes a shipped checkpoint: fp16 weights, its training record and a model card.

The shipped checkpoints are found through reader/packaged/shipped.py; the
cards are rendered by reader/training/model_cards.py. Both the default reader
and the default ranker are packaged here (benchmarks/package_default_*.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dilstore.reader.modeling.checkpoints import EVALUATION_FILE, TRAINING_METADATA_FILE
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.fingerprint import weights_sha256
from dilstore.reader.modeling.online_variants import VARIANT_PREFIX, variant_base_weights, variant_paths
from dilstore.reader.text.files import read_json
from dilstore.reader.training.checkpoint_files import STATE_JSON, STATE_TENSORS
from dilstore.storage.atomic_files import atomic_write_text, give_new_file_modes
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import TMP_PREFIX

MODEL_CARD_FILE = "MODEL_CARD.md"
# Files a training run leaves that a shipped checkpoint does not need.
_NOT_SHIPPED = {"checkpoints", EVALUATION_FILE, STATE_TENSORS, STATE_JSON, "run_config.json"}


def fp16_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file with every float one as fp16 (integer tensors as they are), contiguous."""
    return {
        name: (tensor.to(torch.float16) if tensor.is_floating_point() else tensor).contiguous()
        for name, tensor in load_file(path).items()
    }


def package_checkpoint(source: Path, destination: Path, model_card: str) -> Path:
    """Copy a trained checkpoint to `destination` with every float tensor stored as fp16.

    Halving the weights keeps the shipped MiniLM reader near 45 MB; the model
    core upcasts on load. Training state (periodic checkpoints, optimizer) is
    left behind; config, tokenizer and dilstore.json are copied as they are,
    the training record (load_training_metadata) is written as
    dilstore_training.json, and `model_card` as MODEL_CARD.md. `source` is a
    run's output directory or one of its periodic checkpoints. Online layers
    for an encoding (`online-ENC.safetensors`, fp16 already) are copied as
    they are, and afterwards every one in `destination` that was not trained
    from the weights as packaged is removed (`drop_stale_variants`). A
    `destination` that is `source` itself is refused (a DilstoreError).
    """
    source, destination = Path(source), Path(destination)
    if destination.resolve() == source.resolve():  # its fp16 weights would replace the run's own
        raise DilstoreError(f"--destination {destination} is the checkpoint itself; package it into another folder")
    training = load_training_metadata(source)
    weight_files = [path for path in source.glob("*.safetensors") if path.name not in _NOT_SHIPPED]
    if not weight_files:
        raise DilstoreError(f"{source} holds no .safetensors weights to package")
    destination.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        # A temporary file is what an atomic write killed midway left: no part of the model.
        if path.name in _NOT_SHIPPED or path.name.startswith(TMP_PREFIX) or path.is_dir():
            continue
        if path.suffix == ".safetensors" and not path.name.startswith(VARIANT_PREFIX):
            save_file(fp16_tensors(path), destination / path.name, metadata={"format": "pt"})
        else:
            shutil.copy2(path, destination / path.name)
    drop_stale_variants(destination)
    give_new_file_modes(destination)
    atomic_write_text(destination / TRAINING_METADATA_FILE, json.dumps(training, indent=1))
    atomic_write_text(destination / MODEL_CARD_FILE, model_card)
    return destination


def drop_stale_variants(directory: Path) -> list[str]:
    """Remove the online variants in `directory` that were not trained from the reader's weights there; their names.

    A variant names the weights it extends (its `base_weights_sha256`): one
    of weights since replaced was refused by every reader, on every store of
    its encoding (retrain it with `train qa --freeze-lower --store-encoding
    ENC`), and an unreadable one too. A variant of the same weights, as when
    a checkpoint is packaged again for its card, stays.
    """
    variants = variant_paths(directory)
    if not variants:
        return []
    weights = weights_sha256(DilBertReader.from_pretrained(directory).model)
    stale = [path for path in variants if variant_base_weights(path) != weights]
    for path in stale:
        path.unlink()
    return [path.name for path in stale]


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
