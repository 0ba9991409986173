"""Reading the checkpoint directories of the trainable rankers (kinds "earl", "cross-encoder", "siamese", "listformer").

One plain layout, written by write_earl_checkpoint (reader/modeling/earl_checkpoints.py):

    config.json        the encoder's BertConfig
    tokenizer files    the fast tokenizer
    model.safetensors  the ranker's whole state dict (never pickle); EARL may leave out a frozen encoder
    dilstore.json      the kind, with `layers` = how many layers see query and document apart:
                       N for EARL (which adds judger_blocks, pooling, tied and prior), 0 for the
                       cross-encoder (all l layers see the pair), l for the Siamese encoder, k (the
                       delayed layers) for the Listformer, which writes its weights in fp16

Every failure is a DilstoreError that names the directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import BertConfig, PreTrainedTokenizerBase

from dilstore.reader.modeling.checkpoints import CheckpointMetadata, require_checkpoint_dir, trained_metadata
from dilstore.reader.modeling.earl_checkpoints import KIND as EARL_KIND
from dilstore.reader.modeling.earl_checkpoints import load_checkpoint_files, read_earl_metadata


@dataclass(frozen=True, eq=False)
class RankerCheckpoint:
    """What a ranker checkpoint holds, read and checked but not yet put into a model."""

    directory: Path
    metadata: CheckpointMetadata
    config: BertConfig
    tokenizer: PreTrainedTokenizerBase
    state: dict[str, torch.Tensor]


def read_ranker_checkpoint(path: str | Path, kind: str) -> RankerCheckpoint:
    """Read a checkpoint of ranker `kind` written by its save_pretrained; refuse a base encoder or any other kind.

    Its dilstore.json is checked before any weight is read (an earl one
    must also describe the judger blocks: read_earl_metadata).
    """
    directory = require_checkpoint_dir(Path(path))
    if kind == EARL_KIND:
        metadata = read_earl_metadata(directory)
    else:
        metadata = trained_metadata(directory, (kind,), f", not a {kind!r} ranker", f", not a trained {kind!r} ranker")
    return RankerCheckpoint(directory, metadata, *load_checkpoint_files(directory, metadata))
