"""Small models and corpora for the precompute tests (tests/test_pipeline_*.py, tests/test_precompute_*.py).

The tiny reader is a random 2-layer BERT (hidden 32) with the real
all-MiniLM-L6-v2 WordPiece tokenizer, saved as a dilstore checkpoint with
k = 1: fast enough for whole pipelines in a few seconds, and tokenizing real
text exactly as the shipped reader does. Its weights are random; nothing
here measures quality.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

TINY_LAYERS = 1
TINY_MAX_POSITIONS = 64
ROOT = Path(__file__).resolve().parents[1]


def save_tiny_reader(directory: Path, seed: int = 0) -> Path:
    """Save a random tiny BERT reader (k = 1) with the MiniLM tokenizer to `directory`."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, BertConfig

    from reader.checkpoints import base_model_dir
    from reader.dilbert import DilBertReader

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir(), local_files_only=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=TINY_MAX_POSITIONS,
    )
    torch.manual_seed(seed)
    model = AutoModelForQuestionAnswering.from_config(config).eval()
    return DilBertReader(model, tokenizer, layers=TINY_LAYERS).save_pretrained(directory)


def wiki_like_documents(count: int, words: int = 60, seed: int = 0) -> list[dict[str, str]]:
    """`count` documents of real-looking English words (random order), `{"id", "title", "text"}`."""
    vocabulary = (
        "the river valley city was founded in early century by settlers who built a bridge across "
        "water and later a railway station school church market hall museum library garden tower "
        "north south east west population grew during industrial period when factories opened"
    ).split()
    generator = np.random.default_rng(seed)
    return [
        {
            "id": f"doc-{number:03d}",
            "title": f"Title {number}",
            "text": " ".join(generator.choice(vocabulary, size=words + number % 7)),
        }
        for number in range(count)
    ]


def write_jsonl(path: Path, rows: Sequence[dict[str, object]]) -> Path:
    """Write rows as JSONL (UTF-8) and return the path."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def dilstore_command(arguments: Sequence[str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m runners.cli ARGS` in a subprocess (captured output, no progress bar noise)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "runners.cli", *arguments],
        cwd=cwd or ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def store_contents(store: Path) -> dict[str, tuple[str, str, np.ndarray, np.ndarray, np.ndarray]]:
    """Every stored passage by id: (title, text, token ids, char spans, states as float32)."""
    from storage.reader import open_store

    contents = {}
    with open_store(store) as opened:
        ids = [passage_id for shard in opened.manifest.shards for passage_id in shard_ids(opened, shard.index)]
        for passage in opened.fetch(ids):
            contents[passage.id] = (
                passage.title,
                passage.text,
                np.asarray(passage.token_ids),
                np.asarray(passage.char_spans),
                np.asarray(passage.states, dtype=np.float32),
            )
    return contents


def shard_ids(opened: object, shard: int) -> list[str]:
    """The passage ids one shard of an open store holds, in row order."""
    reader = opened.shard(shard)  # type: ignore[attr-defined]
    return [reader.id_at(row) for row in range(reader.attributes.passages)]
