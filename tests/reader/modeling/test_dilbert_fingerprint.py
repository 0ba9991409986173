"""model_fingerprint: stable across save/load, and changed by anything that changes the stored states."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer, BertConfig

from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.fingerprint import (
    config_sha256,
    model_fingerprint,
    tensors_sha256,
    tokenizer_sha256,
    weights_sha256,
)
from dilstore.storage.fingerprint import Fingerprint
from tests.fixtures.dilbert_tiny import tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(base_model_dir())


@pytest.fixture()
def reader(tokenizer) -> DilBertReader:
    return DilBertReader(tiny_model("bert"), tokenizer, layers=2)


def test_fingerprint_fields(reader: DilBertReader) -> None:
    fingerprint = model_fingerprint(reader, "dilbert", "fp16", 192)
    assert isinstance(fingerprint, Fingerprint)
    assert (fingerprint.architecture, fingerprint.kind, fingerprint.layers) == ("bert", "dilbert", 2)
    assert (fingerprint.encoding, fingerprint.max_length) == ("fp16", 192)
    for digest in (fingerprint.config_sha256, fingerprint.weights_sha256, fingerprint.tokenizer_sha256):
        assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert Fingerprint.from_dict(fingerprint.to_dict()) == fingerprint


def test_fingerprint_survives_a_save_and_load_round_trip(reader: DilBertReader, tmp_path: Path) -> None:
    reader.save_pretrained(tmp_path)
    loaded = DilBertReader.from_pretrained(tmp_path)
    assert model_fingerprint(loaded, "dilbert", "fp32", 128) == model_fingerprint(reader, "dilbert", "fp32", 128)


def test_real_minilm_fingerprint_survives_a_round_trip(tmp_path: Path) -> None:
    """The packaged base model (config from transformers 4.8, no QA head) and its saved reader agree."""
    base = DilBertReader.from_pretrained(base_model_dir(), layers=4)
    base.save_pretrained(tmp_path)
    assert model_fingerprint(DilBertReader.from_pretrained(tmp_path), "dilbert", "fp16", 192) == model_fingerprint(
        base, "dilbert", "fp16", 192
    )


def test_weights_hash_sees_a_single_changed_value(reader: DilBertReader) -> None:
    before = weights_sha256(reader.model)
    with torch.no_grad():
        reader.model.bert.encoder.layer[1].output.dense.bias[3] += 1e-6
    assert weights_sha256(reader.model) != before


def test_weights_hash_sees_names_shapes_and_dtypes_not_only_bytes() -> None:
    """The same bytes under another name, in another shape or as another dtype hash apart (mut58: with each
    tensor's header left out of the hash, no test noticed)."""
    values = torch.arange(6, dtype=torch.float32)
    hashes = {
        tensors_sha256({"a": values}),
        tensors_sha256({"b": values}),
        tensors_sha256({"a": values.reshape(2, 3)}),
        tensors_sha256({"a": values.view(torch.int32)}),
    }
    assert len(hashes) == 4
    # Every tensor counts, in name order whatever the dict's order (a hash of all but the last went unnoticed).
    both = tensors_sha256({"a": values, "b": values * 2})
    assert tensors_sha256({"b": values * 2, "a": values}) == both
    assert tensors_sha256({"a": values, "b": values * 3}) != both


def test_config_hash_sees_every_integer_setting() -> None:
    """Each integer setting of a BERT config (layers, heads, sizes, vocabulary, ...) changes the hash (mut58: a
    setting taken for provenance, num_hidden_layers say, went unnoticed)."""
    config = BertConfig()
    before = config_sha256(config)
    settings = {key: value for key, value in config.to_dict().items()
                if isinstance(value, int) and not isinstance(value, bool)}  # fmt: skip
    assert {"num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size"} <= set(settings)
    for key, value in settings.items():
        changed = copy.deepcopy(config)
        setattr(changed, key, value + 1)
        assert config_sha256(changed) != before, key


def test_config_hash_sees_an_architectural_change_but_not_provenance(reader: DilBertReader) -> None:
    before = config_sha256(reader.model.config)
    renamed = copy.deepcopy(reader.model.config)
    renamed._name_or_path = "/somewhere/else"
    renamed.architectures = ["BertModel"]
    assert config_sha256(renamed) == before
    changed = copy.deepcopy(reader.model.config)
    changed.layer_norm_eps = 1e-6
    assert config_sha256(changed) != before


def test_tokenizer_hash_ignores_call_settings_but_sees_the_vocabulary(tokenizer) -> None:
    before = tokenizer_sha256(tokenizer)
    tokenizer("a question", "a passage", truncation="only_second", max_length=8, padding="max_length")
    assert tokenizer_sha256(tokenizer) == before
    extended = copy.deepcopy(tokenizer)
    extended.add_tokens(["dilstoreword"])
    assert tokenizer_sha256(extended) != before


def test_tokenizer_hash_sees_every_part_of_the_pipeline_but_the_call_settings() -> None:
    """Each part of a tokenizer.json pipeline (normalizer, pre-tokenizer, model, ...) changes the hash, the call-time
    truncation and padding do not (mut58: a normalizer taken for a call setting, a cased tokenizer hashing as the
    uncased one, went unnoticed). A stand-in tokenizer, so that no 30,000-word vocabulary is hashed."""
    pipeline = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                "normalizer": {"type": "BertNormalizer", "lowercase": True},
                "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": None, "decoder": None,
                "model": {"type": "WordPiece", "vocab": {"a": 0}}}  # fmt: skip

    def digest(document: dict) -> str:
        text = json.dumps(document)
        return tokenizer_sha256(SimpleNamespace(backend_tokenizer=SimpleNamespace(to_str=lambda: text)))

    before = digest(pipeline)
    assert digest({**pipeline, "truncation": {"max_length": 8}, "padding": {"length": 8}}) == before
    for key in ("version", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"):
        assert digest({**pipeline, key: {"type": "Other"}}) != before, key


def test_split_and_store_settings_are_part_of_the_fingerprint(reader: DilBertReader, tokenizer) -> None:
    base = model_fingerprint(reader, "dilbert", "fp16", 192)
    other_k = model_fingerprint(DilBertReader(reader.model, tokenizer, layers=1), "dilbert", "fp16", 192)
    assert base.differences(other_k) == ["layers"]
    assert base.differences(model_fingerprint(reader, "dilbert", "int8", 192)) == ["encoding"]
    assert base.differences(model_fingerprint(reader, "dilbert", "fp16", 256)) == ["max_length"]
