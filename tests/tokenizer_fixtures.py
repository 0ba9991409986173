"""Tokenizers for the text-side tests: the packaged MiniLM WordPiece and a tiny RoBERTa-style byte-level BPE.

No RoBERTa vocabulary can be downloaded here, so the BPE tokenizer is trained
in memory on a few sentences (accents, Greek, Cyrillic, CJK, Hangul, emoji)
and wrapped in transformers' RobertaTokenizer: the same pre-tokenizer,
offset trimming and `<s> q </s>` template as roberta-base, with a 600-entry
vocabulary. Both are built once per test session.
"""

from __future__ import annotations

import json
from functools import cache

from transformers import AutoTokenizer, PreTrainedTokenizerBase, RobertaTokenizer

from reader.checkpoints import base_model_dir

BPE_CORPUS = [
    "The Zürich tram network opened in 1882 and is run by VBZ. It carries about 200 million people a year.",
    "Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911.",
    "The café sells crème brûlée for €4.50 😀😀 and 日本語 東京 김치 한국어 on Sundays.",
    "Ελληνικά, Русский язык and العربية are written in other scripts; the keeper was Ingrid Solberg.",
]


@cache
def minilm_tokenizer() -> PreTrainedTokenizerBase:
    """The packaged all-MiniLM-L6-v2 tokenizer (uncased BERT WordPiece, fast)."""
    return AutoTokenizer.from_pretrained(base_model_dir())


@cache
def tiny_bpe_tokenizer() -> PreTrainedTokenizerBase:
    """A RoBERTa tokenizer (byte-level BPE, trim_offsets) over a vocabulary trained on BPE_CORPUS."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        BPE_CORPUS * 10,
        vocab_size=600,
        min_frequency=1,
        special_tokens=["<pad>", "<unk>", "<s>", "</s>", "<mask>"],
        show_progress=False,
    )
    model = json.loads(bpe.to_str())["model"]
    return RobertaTokenizer(vocab=model["vocab"], merges=[tuple(pair) for pair in model["merges"]])
