"""Checkpoint directories of the two baseline rankers (kinds "cross-encoder" and "siamese").

The same plain layout as an EARL ranker (reader/modeling/earl_checkpoints.py), whose
writer they share:

    config.json        the encoder's BertConfig
    tokenizer files    the fast tokenizer
    model.safetensors  the ranker's whole state dict (never pickle)
    dilstore.json      the kind, with `layers` = how many layers see query and document apart:
                       0 for the cross-encoder (all l layers see the pair), l for the Siamese encoder

Every failure is a DilstoreError that names the directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import BertConfig, PreTrainedTokenizerBase

from dilstore.reader.modeling.checkpoints import CheckpointMetadata, require_checkpoint_dir, trained_metadata
from dilstore.reader.modeling.earl_checkpoints import load_checkpoint_files


@dataclass(frozen=True, eq=False)
class RankerCheckpoint:
    """What a baseline ranker checkpoint holds, read and checked but not yet put into a model."""

    directory: Path
    metadata: CheckpointMetadata
    config: BertConfig
    tokenizer: PreTrainedTokenizerBase
    state: dict[str, torch.Tensor]


def read_ranker_checkpoint(path: str | Path, kind: str) -> RankerCheckpoint:
    """Read a checkpoint of `kind` written by the ranker's save_pretrained; refuse any other kind."""
    directory = require_checkpoint_dir(Path(path))
    metadata = trained_metadata(directory, (kind,), f", not a {kind!r} ranker", f", not a trained {kind!r} ranker")
    return RankerCheckpoint(directory, metadata, *load_checkpoint_files(directory, metadata))
