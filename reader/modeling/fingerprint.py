"""The fingerprint a store carries of the model that made it, so a reader can refuse a mismatched store.

Three hashes identify the network: the config (canonical JSON without the
keys that do not change what the model computes), the weights (sha256 over
every state-dict tensor in sorted-name order: name, dtype, shape, bytes) and
the tokenizer (canonical JSON of its `tokenizers` pipeline: vocabulary,
normalizer, pre-tokenizer, post-processor, added tokens). Each is stable
across a save/load round trip and across machines, and changes when anything
that shapes the stored states changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from transformers import PreTrainedConfig, PreTrainedTokenizerBase

from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint

# Config keys that record provenance or runtime switches, not the computation.
_VOLATILE_CONFIG_KEYS = frozenset(
    {
        "_name_or_path",
        "_commit_hash",
        "_attn_implementation_autoset",
        "architectures",
        "attn_implementation",
        "dtype",
        "torch_dtype",
        "transformers_version",
        "use_cache",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "gradient_checkpointing",
    }
)
# Tokenizer pipeline keys that are call-time settings (changed by calls with truncation/padding).
_VOLATILE_TOKENIZER_KEYS = frozenset({"truncation", "padding"})


class FingerprintSource(Protocol):
    """What a model exposes for fingerprinting: its network, tokenizer and split point.

    `fingerprinted_network()` gives the Hugging Face config and the module
    whose state dict holds every weight; `layers` is the split point (k for
    DilBert, the query layers N for EARL).
    """

    tokenizer: PreTrainedTokenizerBase
    layers: int

    def fingerprinted_network(self) -> tuple[PreTrainedConfig, torch.nn.Module]:
        """The config and the module whose state dict holds every weight the stored states depend on."""
        ...


def _canonical_sha256(document: Any) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_sha256(config: PreTrainedConfig) -> str:
    """sha256 of the config as canonical JSON, without provenance and runtime-switch keys."""
    document = {key: value for key, value in config.to_dict().items() if key not in _VOLATILE_CONFIG_KEYS}
    return _canonical_sha256(document)


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over every state-dict tensor in sorted-name order: name, dtype, shape, then raw bytes."""
    return tensors_sha256(model.state_dict())


def tensors_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over named tensors in sorted-name order: name, dtype, shape, then raw bytes (weights_sha256's scheme)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        header = {"name": name, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}
        digest.update(json.dumps(header, sort_keys=True).encode("utf-8"))
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokenizer_sha256(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 of the tokenizer's `tokenizers` pipeline (what tokenizer.json holds) as canonical JSON."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise DilstoreError(
            f"{type(tokenizer).__name__} has no `tokenizers` backend (no tokenizer.json); "
            "dilstore fingerprints need a tokenizers-backed tokenizer"
        )
    return _pipeline_sha256(backend.to_str())


@functools.lru_cache(maxsize=8)
def _pipeline_sha256(pipeline: str) -> str:
    """tokenizer_sha256 of a pipeline's JSON text, remembered per process.

    A precompute run fingerprints the same tokenizer several times, and writing a
    30,000-word vocabulary out again as canonical JSON costs about 0.2 s each time.
    """
    document = json.loads(pipeline)
    return _canonical_sha256({key: value for key, value in document.items() if key not in _VOLATILE_TOKENIZER_KEYS})


def model_fingerprint(reader: FingerprintSource, kind: str, encoding: str, max_length: int) -> Fingerprint:
    """The fingerprint of `reader`'s network, split (reader.layers) and the store's encoding and max length."""
    config, network = reader.fingerprinted_network()
    return Fingerprint(
        architecture=config.model_type,
        config_sha256=config_sha256(config),
        weights_sha256=weights_sha256(network),
        tokenizer_sha256=tokenizer_sha256(reader.tokenizer),
        kind=kind,
        layers=reader.layers,
        encoding=encoding,
        max_length=max_length,
    )
