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


def write_random_small_reader(directory: Path, num_layers: int = 2, layers: int = 1, seed: int = 0) -> Path:
    """A small DilBert reader with RANDOM weights and MiniLM's width (hidden 384, 12 heads, FFN 1536), for size tests.

    `num_layers` encoder layers, of which the first `layers` (k) are the
    offline half; the packaged MiniLM tokenizer, so real text tokenizes as the
    shipped reader does. It stores states of the real width at a fraction of
    the full model's compute; its weights are random, so it serves size and
    memory measurements only, never quality.
    """
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, BertConfig

    from dilstore.reader.modeling.dilbert import DilBertReader

    base = base_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=384, num_hidden_layers=num_layers, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForQuestionAnswering.from_config(config).eval()
    return DilBertReader(model, tokenizer, layers=layers).save_pretrained(directory)
