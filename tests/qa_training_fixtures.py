"""Helpers for the training and reading-comprehension tests: a tiny random reader and a tiny SQuAD file.

The tiny reader is a 2-layer, 32-wide BERT with random weights and the real
all-MiniLM-L6-v2 WordPiece tokenizer, saved as a plain Hugging Face
checkpoint: the same kind of directory `dilstore train qa --model` starts from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from transformers import BertConfig, BertModel

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def write_tiny_checkpoint(directory: Path, *, dropout: float = 0.0, seed: int = 0) -> Path:
    """A random 2-layer BERT (hidden 32) with the MiniLM tokenizer, saved to `directory`."""
    import torch

    from reader.checkpoints import base_model_dir

    base = base_model_dir()
    vocab_size = json.loads((base / "config.json").read_text())["vocab_size"]
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, Path(directory) / name)
    return Path(directory)


def squad_document(paragraphs: list[tuple[str, list[tuple[str, str, str]]]]) -> dict[str, Any]:
    """A SQuAD v1.1 JSON document from (context, [(id, question, answer)]); answer_start is the first occurrence."""
    built = []
    for context, questions in paragraphs:
        qas = []
        for qid, question, answer in questions:
            start = context.index(answer)
            qas.append({"id": qid, "question": question, "answers": [{"text": answer, "answer_start": start}]})
        built.append({"context": context, "qas": qas})
    return {"version": "1.1", "data": [{"title": "Tiny", "paragraphs": built}]}


# Filler long enough that, at a small max length, a paragraph spans several windows.
_FILLER = " ".join(f"Sentence number {i} talks about nothing in particular." for i in range(1, 9))

HANDFUL = [
    (
        "The Zürich tram network opened in 1882 and is run by VBZ. It carries about 200 million people a year.",
        [
            ("q-zurich-year", "When did the Zürich tram network open?", "1882"),
            ("q-zurich-operator", "Who runs the tram network?", "VBZ"),
        ],
    ),
    (
        "Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911, the first person to win twice.",
        [("q-curie-chemistry", "In which year did Curie win the Chemistry prize?", "1911")],
    ),
    (
        "The café on the corner sells crème brûlée for €4.50 every Sunday morning.",
        [("q-cafe-price", "How much does the crème brûlée cost?", "€4.50")],
    ),
    (
        _FILLER + " The lighthouse keeper was named Ingrid Solberg. " + _FILLER,
        [("q-keeper", "What was the name of the lighthouse keeper?", "Ingrid Solberg")],
    ),
    (
        "Mount Kilimanjaro rises 5,895 metres above sea level in Tanzania.",
        [("q-kilimanjaro", "How high is Mount Kilimanjaro?", "5,895 metres")],
    ),
]


def write_squad(path: Path, paragraphs: list[tuple[str, list[tuple[str, str, str]]]] = HANDFUL) -> Path:
    """Write a tiny SQuAD v1.1 file and return its path."""
    Path(path).write_text(json.dumps(squad_document(paragraphs), ensure_ascii=False), encoding="utf-8")
    return Path(path)
