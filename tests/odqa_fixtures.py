"""Tiny stores for the open-domain QA tests: a random 2-layer reader (k=1) and a handful of passages.

The store is written with the storage writer directly (no Beam): passages
are tokenized and encoded by reader/precompute.py's plain functions, exactly
as `dilstore precompute` does per shard.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from qa_training_fixtures import write_tiny_checkpoint

from pipelines.passages import Passage
from reader.dilbert import DilBertReader
from reader.fingerprint import model_fingerprint
from reader.precompute import encode_tokenized, tokenize_passage
from storage.finalize import finalize
from storage.writer import write_shard

MAX_LENGTH = 48
LAYERS = 1

_FILLER = " ".join(f"Line {i} of the harbour log mentions ropes, tides and gulls." for i in range(1, 7))

PASSAGES = [
    Passage("tram#0", "tram", "Zürich trams", "The Zürich tram network opened in 1882 and is run by VBZ."),
    Passage("curie#0", "curie", "Marie Curie", "Marie Curie won the Nobel Prize in Chemistry in 1911."),
    Passage("cafe#0", "cafe", "Café", "The café on the corner sells crème brûlée for €4.50 every Sunday."),
    Passage("kili#0", "kili", "Kilimanjaro", "Mount Kilimanjaro rises 5,895 metres above sea level in Tanzania."),
    # Longer than MAX_LENGTH tokens: stored as windows keeper#0, keeper#0~1, ...
    Passage("keeper#0", "keeper", "Lighthouse", _FILLER + " The lighthouse keeper was Ingrid Solberg. " + _FILLER),
]


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch single-threaded inside the block: tiny models gain nothing from threads on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def write_reader_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A random 2-layer BERT reader with k=1 and the MiniLM tokenizer, saved with its dilstore.json."""
    base = write_tiny_checkpoint(directory.with_name(directory.name + "-base"), seed=seed)
    reader = DilBertReader.from_pretrained(base, layers=LAYERS)
    return reader.save_pretrained(directory)


def write_store(
    directory: Path, model_dir: Path, encoding: str = "fp32", passages: list[Passage] = PASSAGES
) -> list[str]:
    """Encode `passages` with the model at `model_dir` into a finalized one-shard store; return the stored ids."""
    reader = DilBertReader.from_pretrained(model_dir)
    pieces = [
        piece for passage in passages for piece in tokenize_passage(reader.tokenizer, passage, MAX_LENGTH, "dilbert")
    ]
    records = encode_tokenized(reader, "dilbert", pieces)
    write_shard(directory, 0, records, kind="dilbert", encoding=encoding)
    finalize(directory, model_fingerprint(reader, "dilbert", encoding, MAX_LENGTH))
    return [record.id for record in records]


def write_collection(path: Path, documents: list[tuple[str, str]]) -> Path:
    """A pyserini JsonCollection file (`{"id","contents"}` per line) of (id, contents) for the BM25 index."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": id_, "contents": contents}, ensure_ascii=False) for id_, contents in documents]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
