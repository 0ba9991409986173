"""Online layers tuned for one store encoding: `online-ENC.safetensors` beside a reader's weights.

A 2bit or 1bit store returns layer-k passage states with an error the online
layers never saw in training, and answers suffer. `train qa --freeze-lower
--store-encoding ENC` trains layers k+1..l and the head on exactly such
states while the offline part (the embeddings and layers 1..k) stays bit for
bit, so the trained online weights are all that differ from the checkpoint.
They ship as a small file beside it:

- a store's fingerprint stays the checkpoint's own, since its passage states
  do not change;
- a reader opening a store of encoding ENC checks that fingerprint, then
  swaps in `online-ENC.safetensors` when the checkpoint has one
  (`load_online_variant`); stores of other encodings read with the
  checkpoint's own online layers.

The file holds every online tensor (`DilBertReader.online_state_names`) in
fp16, like the checkpoint, and metadata: the format, the encoding, k, and the
sha256 of the checkpoint weights it was trained from (the fingerprint's
`weights_sha256`), so a file beside other weights is refused by name.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.fingerprint import config_sha256, weights_sha256
from dilstore.storage.atomic_files import give_new_file_mode
from dilstore.storage.encodings import get_encoding
from dilstore.storage.errors import DilstoreError

VARIANT_FORMAT = "dilstore-online-variant/1"
VARIANT_PREFIX = "online-"  # online-ENC.safetensors
_BASE_WEIGHTS_KEY = "base_weights_sha256"  # the metadata key naming the weights a variant extends
_STORED_DTYPE = torch.float16


def variant_path(directory: str | Path, encoding: str) -> Path:
    """Where a checkpoint keeps its online layers for stores of `encoding`."""
    return Path(directory) / f"{VARIANT_PREFIX}{get_encoding(encoding).name}.safetensors"


def variant_paths(directory: str | Path) -> list[Path]:
    """Every online variant file in a checkpoint folder, by name."""
    return sorted(Path(directory).glob(f"{VARIANT_PREFIX}*.safetensors"))


def variant_base_weights(path: Path) -> str | None:
    """The weights_sha256 a variant file records, or None when it cannot be read as one."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return (handle.metadata() or {}).get(_BASE_WEIGHTS_KEY)
    except (SafetensorError, OSError):
        return None


def write_online_variant(trained: DilBertReader, base: DilBertReader, encoding: str, directory: str | Path) -> Path:
    """Write `trained`'s online weights as the `encoding` variant of `base`, saved in `directory`; its path.

    `trained` must be `base` with only online weights changed: the same
    config, tokenizer, k and offline weights (compared after `base`'s
    storage dtype, as a store's states come from the stored checkpoint).
    """
    if trained.layers != base.layers or config_sha256(trained.model.config) != config_sha256(base.model.config):
        raise DilstoreError("the tuned reader has another k or config than the checkpoint it should extend")
    if trained.tokenizer.get_vocab() != base.tokenizer.get_vocab():
        raise DilstoreError("the tuned reader has another vocabulary than the checkpoint it should extend")
    online = set(base.online_state_names())
    trained_state, base_state = trained.model.state_dict(), base.model.state_dict()
    changed = sorted(
        name for name in base_state if name not in online and not torch.equal(trained_state[name], base_state[name])
    )
    if changed:
        raise DilstoreError(
            f"the tuned reader changed offline weights "
            f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}): "
            "stores precomputed with the checkpoint would not hold its passage states; train it with --freeze-lower"
        )
    tensors = {name: trained_state[name].detach().to("cpu", _STORED_DTYPE).contiguous() for name in sorted(online)}
    path = variant_path(directory, encoding)
    metadata = {
        "format": VARIANT_FORMAT,
        "encoding": get_encoding(encoding).name,
        "layers": str(base.layers),
        _BASE_WEIGHTS_KEY: weights_sha256(base.model),
    }
    save_file(tensors, str(path), metadata=metadata)
    give_new_file_mode(path)
    return path


def load_online_variant(
    reader: DilBertReader, directory: str | Path, encoding: str, weights: str | None = None
) -> Path | None:
    """Swap the `encoding` variant of the checkpoint in `directory` into `reader`, when there is one; its path.

    `reader` must be that checkpoint as loaded (its weights are what the
    variant names); a variant of other weights, another k or encoding, or
    with other tensors is refused with a DilstoreError naming the file.
    `weights`: the reader's weights_sha256 when the caller has it already
    (a store's fingerprint check), so the weights are not hashed twice.
    """
    path = variant_path(directory, encoding)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (no __iter__)
    except (SafetensorError, OSError) as error:
        raise DilstoreError(f"cannot read the online variant {path}: {error}") from error
    expected = {
        "format": VARIANT_FORMAT,
        "encoding": get_encoding(encoding).name,
        "layers": str(reader.layers),
        _BASE_WEIGHTS_KEY: weights if weights is not None else weights_sha256(reader.model),
    }
    wrong = [
        f"{key} {metadata.get(key)!r} (expected {value!r})"
        for key, value in expected.items()
        if metadata.get(key) != value
    ]
    if wrong:
        raise DilstoreError(
            f"online variant {path} does not belong to the checkpoint beside it: {'; '.join(wrong)}"
        )
    state = reader.model.state_dict()
    online = reader.online_state_names()
    if sorted(tensors) != online or any(tensors[name].shape != state[name].shape for name in online):
        raise DilstoreError(
            f"online variant {path} does not hold exactly the online tensors of this k={reader.layers} reader"
        )
    with torch.no_grad():
        for name in online:
            state[name].copy_(tensors[name].to(state[name].dtype))
    reader.online_variant = path.name
    return path
