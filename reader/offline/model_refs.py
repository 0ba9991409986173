"""The packaged-model references precompute takes for --model, and the folder each names.

Apart from reader/offline/encoding.py (which imports them from here) because that module imports torch and
transformers: `precompute` looks for a --model folder before Beam and the model stack load, and a mistyped one is
named at once, not after some 10 s of imports (fast59 F6).
"""

from __future__ import annotations

from pathlib import Path

from dilstore.reader.modeling.checkpoints import resolve_base_model
from dilstore.reader.packaged.shipped import default_checkpoint_dir, default_listformer_dir, default_ranker_dir

# Symbolic model references (with reader.modeling.checkpoints.BASE_MODEL_REF), resolved on each worker to the
# installed package's copy, so a remote worker finds the packaged models wherever its site-packages is.
DEFAULT_CHECKPOINT_REF = "package:default-checkpoint"
DEFAULT_RANKER_REF = "package:default-ranker"
DEFAULT_LISTFORMER_REF = "package:default-listformer"


def resolve_model_dir(model: str) -> Path:
    """A model directory from a path or a packaged-model reference (see DEFAULT_CHECKPOINT_REF)."""
    if model == DEFAULT_CHECKPOINT_REF:
        return default_checkpoint_dir()
    if model == DEFAULT_RANKER_REF:
        return default_ranker_dir()
    if model == DEFAULT_LISTFORMER_REF:
        return default_listformer_dir()
    return resolve_base_model(model)
