"""Random BERT-base checkpoints for the speed benchmarks: the seed's speed tables are for BERT-base.

They stand in for it without a download; their weights are random, so they
serve timing only, never quality.
"""

from __future__ import annotations

import json
from pathlib import Path

from dilstore.reader.modeling.checkpoints import base_model_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def write_random_bert_base(directory: Path, model_class: type, seed: int = 0) -> Path:
    """A BERT-base-sized checkpoint (12 layers, hidden 768, 12 heads) with RANDOM weights, for speed tests only.

    The seed's speed tables are for BERT-base; this stands in for it without a
    download. `model_class` is the Hugging Face class to save (BertModel for a
    ranker's encoder, BertForQuestionAnswering for a reader); the packaged
    MiniLM tokenizer (same uncased vocabulary) is copied beside it.
    """
    import torch
    from transformers import BertConfig

    base = base_model_dir()
    config = BertConfig(
        vocab_size=json.loads((base / "config.json").read_text(encoding="utf-8"))["vocab_size"],
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(seed)
    model_class(config).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            (Path(directory) / name).write_bytes((base / name).read_bytes())
    return Path(directory)
