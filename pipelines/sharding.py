"""Which shard a passage lands in: a stable hash of its id, modulo the shard count.

The key must be the same on every worker, every runner and every re-run, so it
is a keyed BLAKE2b of the id's UTF-8 bytes, never Python's salted `hash()`.
The shard count is fixed for a run (an option, or derived from the input size
only), so a re-run with the same inputs puts every passage in the same shard.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path

# Input bytes per shard when no --shards is given. 1 MiB of JSONL is about 2.5k
# MS MARCO passages: a shard writer holds its states in memory as float32
# (~300 MB for MiniLM) before encoding them, so shards must stay this small.
DEFAULT_INPUT_BYTES_PER_SHARD = 1 << 20
# Compressed inputs hold several times their size in text.
COMPRESSED_EXPANSION = 4
MIN_DEFAULT_SHARDS = 4  # a store's: work for 4 workers
MIN_DEFAULT_APPEND_SHARDS = 1  # an append's: each shard costs ~100 KB and ~30 files however few passages it holds
MAX_DEFAULT_SHARDS = 16384
_COMPRESSED_SUFFIXES = (".gz", ".bz2")
_PERSON = b"dilstore-shard"


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process and Python version."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big")


def shard_of(passage_id: str, num_shards: int) -> int:
    """The shard index in [0, num_shards) that holds `passage_id`."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    return stable_hash(passage_id) % num_shards


def default_shard_count(input_paths: Iterable[str | Path], minimum: int = MIN_DEFAULT_SHARDS) -> int:
    """A shard count from the inputs' size alone: one shard per ~1 MiB of text, `minimum` to 16384.

    Compressed files (.gz, .bz2) count four times their size. Depending only on
    the inputs keeps the count, and so every shard's contents, the same when a
    run is repeated with another runner or worker count.
    """
    total = 0
    for path in map(Path, input_paths):
        size = path.stat().st_size
        total += size * COMPRESSED_EXPANSION if path.suffix.lower() in _COMPRESSED_SUFFIXES else size
    wanted = math.ceil(total / DEFAULT_INPUT_BYTES_PER_SHARD)
    return min(MAX_DEFAULT_SHARDS, max(minimum, wanted))
