"""Builders for the store tests: random ragged passages, fingerprints, small finalized stores."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from storage.finalize import finalize
from storage.fingerprint import Fingerprint
from storage.records import PassageRecord
from storage.writer import write_shard

WORDS = ("the", "Zarr", "shard", "naïve", "café", "东京", "😀", "über", "store", "id")


def scratch_dir() -> tempfile.TemporaryDirectory:
    """A temporary directory, on tmpfs where the machine has one: store writes are metadata-heavy."""
    shm = Path("/dev/shm")
    return tempfile.TemporaryDirectory(dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None)


def fingerprint_for(kind: str = "dilbert", encoding: str = "fp32", max_length: int = 512) -> Fingerprint:
    """A fingerprint of a made-up model, for stores written by tests."""
    return Fingerprint(
        architecture="BertModel",
        config_sha256="c" * 64,
        weights_sha256="w" * 64,
        tokenizer_sha256="t" * 64,
        kind=kind,
        layers=4,
        encoding=encoding,
        max_length=max_length,
    )


def passage(passage_id: str, words: int, state_shape: Sequence[int], rng: np.random.Generator) -> PassageRecord:
    """A passage of `words` word tokens plus a trailing special token, with spans into its text."""
    chosen = [WORDS[i] for i in rng.integers(0, len(WORDS), words)]
    text = " ".join(chosen)
    starts = np.cumsum([0] + [len(word) + 1 for word in chosen[:-1]]) if chosen else np.zeros(0, dtype=np.int64)
    spans = np.stack([starts, starts + [len(word) for word in chosen]], axis=1) if chosen else np.zeros((0, 2))
    spans = np.concatenate([spans, [[-1, -1]]]).astype(np.int32)  # (words + 1, 2), [SEP] last
    n = words + 1
    states = rng.standard_normal((n, *state_shape)).astype(np.float32)
    states[..., 0] *= 8.0  # an outlier channel, like BERT's
    return PassageRecord(
        id=passage_id,
        title=f"Title of {passage_id}",
        text=text,
        token_ids=rng.integers(1000, 30000, n).astype(np.int32),
        char_spans=spans,
        states=states,
    )


def random_shards(
    shard_sizes: Sequence[int], state_shape: Sequence[int] = (8,), seed: int = 0, max_words: int = 40
) -> list[list[PassageRecord]]:
    """Shards of random passages with ids unique across shards."""
    rng = np.random.default_rng(seed)
    return [
        [passage(f"s{shard}/p{row}", int(rng.integers(0, max_words)), state_shape, rng) for row in range(size)]
        for shard, size in enumerate(shard_sizes)
    ]


def build_store(
    root: Path,
    shards: Sequence[Sequence[PassageRecord]],
    *,
    kind: str = "dilbert",
    encoding: str = "fp32",
    compressor: str | None = None,
) -> Path:
    """Write every shard (not durable: tests) and finalize; return the root."""
    for index, records in enumerate(shards):
        write_shard(root, index, records, kind=kind, encoding=encoding, compressor=compressor, durable=False)
    root.mkdir(parents=True, exist_ok=True)
    finalize(root, fingerprint_for(kind, encoding), {"command": "test"})
    return root
