"""DilBert checkpoints: save/load round trips, k from metadata, and clear errors for bad directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from dilstore.reader.modeling.checkpoints import (
    METADATA_FILE,
    CheckpointMetadata,
    base_model_dir,
    read_metadata,
    write_metadata,
)
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.storage.errors import DilstoreError
from tests.fixtures.dilbert_tiny import TINY_CONFIGS, random_batch, tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(base_model_dir())


@pytest.fixture(scope="module")
def saved_bert(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT reader with k=2 saved as a dilstore checkpoint."""
    return DilBertReader(tiny_model("bert"), tokenizer, layers=2).save_pretrained(tmp_path_factory.mktemp("bert-k2"))


@pytest.fixture(scope="module")
def base_bert(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """A plain Hugging Face encoder directory (BertModel, no QA head, no dilstore.json)."""
    from transformers import BertModel

    directory = tmp_path_factory.mktemp("base-bert")
    torch.manual_seed(0)
    BertModel(TINY_CONFIGS["bert"]()).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def logits(reader: DilBertReader) -> tuple[torch.Tensor, torch.Tensor]:
    batch = random_batch([(3, 8), (5, 2)])
    with torch.no_grad():
        return reader(batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask)


@pytest.mark.parametrize("name", ["bert", "albert-grouped", "distilbert", "roberta"])
def test_save_then_load_gives_the_same_reader(name: str, tokenizer, tmp_path: Path) -> None:
    reader = DilBertReader(tiny_model(name), tokenizer, layers=1)
    reader.save_pretrained(tmp_path)
    loaded = DilBertReader.from_pretrained(tmp_path)
    assert (loaded.layers, loaded.num_layers, loaded.hidden_size) == (1, reader.num_layers, 32)
    assert loaded.kind == "dilbert" and loaded.tokenizer.sep_token_id == tokenizer.sep_token_id
    assert not loaded.training and not loaded.model.training, "a loaded reader is in eval mode"
    for before, after in zip(logits(reader), logits(loaded)):
        assert torch.equal(before, after)


def test_checkpoint_is_a_plain_hugging_face_directory_plus_dilstore_json(saved_bert: Path) -> None:
    assert {"config.json", "model.safetensors", "tokenizer.json", METADATA_FILE} <= {
        p.name for p in saved_bert.iterdir()
    }
    assert json.loads((saved_bert / METADATA_FILE).read_text()) == {
        "architecture": "bert",
        "format": 1,
        "kind": "dilbert",
        "layers": 2,
        "num_layers": 3,
    }
    from transformers import AutoModelForQuestionAnswering

    assert type(AutoModelForQuestionAnswering.from_pretrained(saved_bert)).__name__ == "BertForQuestionAnswering"


def test_explicit_layers_override_the_metadata(saved_bert: Path) -> None:
    assert DilBertReader.from_pretrained(saved_bert, layers=3).layers == 3


def test_base_model_needs_explicit_layers(base_bert: Path) -> None:
    with pytest.raises(DilstoreError, match=rf"{base_bert}.*without dilstore metadata.*layers"):
        DilBertReader.from_pretrained(base_bert)
    assert DilBertReader.from_pretrained(base_bert, layers=1).layers == 1


def test_base_model_head_is_initialised_reproducibly(base_bert: Path) -> None:
    """Two loads of a head-less base model agree, and loading leaves the caller's random stream alone."""
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = DilBertReader.from_pretrained(base_bert, layers=1)
    after_load = torch.rand(1)
    second = DilBertReader.from_pretrained(base_bert, layers=1)
    assert torch.equal(first.model.qa_outputs.weight, second.model.qa_outputs.weight)
    assert torch.equal(after_load, expected_next)


def test_fp16_stored_weights_load_as_fp32(saved_bert: Path, tmp_path: Path) -> None:
    """A checkpoint stored in fp16 (as the shipped default reader is) is upcast on load."""
    for path in saved_bert.iterdir():
        if path.suffix == ".safetensors":
            half = {
                name: tensor.half() if tensor.is_floating_point() else tensor
                for name, tensor in load_file(path).items()
            }
            save_file(half, tmp_path / path.name, metadata={"format": "pt"})
        else:
            (tmp_path / path.name).write_bytes(path.read_bytes())
    reader = DilBertReader.from_pretrained(tmp_path)
    assert {parameter.dtype for parameter in reader.parameters()} == {torch.float32}
    original = DilBertReader.from_pretrained(saved_bert)
    weight = original.model.bert.encoder.layer[0].attention.self.query.weight
    assert torch.equal(reader.model.bert.encoder.layer[0].attention.self.query.weight, weight.half().float())


@pytest.mark.parametrize("k", [-1, 4])
def test_k_outside_0_to_l_is_refused_on_load(saved_bert: Path, k: int) -> None:
    with pytest.raises(DilstoreError, match=r"0\.\.3 for this 3-layer bert model"):
        DilBertReader.from_pretrained(saved_bert, layers=k)


def copy_checkpoint(source: Path, destination: Path) -> Path:
    for path in source.iterdir():
        (destination / path.name).write_bytes(path.read_bytes())
    return destination


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(DilstoreError, match=f"model directory not found: {tmp_path / 'nowhere'}"):
        DilBertReader.from_pretrained(tmp_path / "nowhere")


def test_directory_without_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(DilstoreError, match=f"{tmp_path} is not a Hugging Face checkpoint: it has no config.json"):
        DilBertReader.from_pretrained(tmp_path, layers=1)


@pytest.mark.parametrize(
    ("file_name", "damage", "message"),
    [
        ("config.json", b"{not json", "cannot load a model from"),
        # A value of the wrong type: huggingface_hub's StrictDataclassFieldValidationError was a traceback (mut55).
        ("config.json", b'{"model_type": "bert", "hidden_size": "x"}',
         "cannot load a model from .*'hidden_size': TypeError: Field 'hidden_size' expected int"),
        ("model.safetensors", b"\x00\x01truncated", "cannot load a model from"),
        (METADATA_FILE, b"[1, 2", "cannot read dilstore metadata"),
        (METADATA_FILE, b'{"format": 99}', "unsupported format 99"),
        (METADATA_FILE, b'{"format": 1, "kind": "dilbert"}', "missing field"),
        (METADATA_FILE, b'{"format":1,"kind":"earl-s1","architecture":"bert","layers":1,"num_layers":3}', "'earl-s1'"),
        (METADATA_FILE, b'{"format":1,"kind":"dilbert","architecture":"bert","layers":"2","num_layers":3}', "integer"),
    ],
)
def test_corrupt_checkpoint_gives_a_clear_error(
    saved_bert: Path, tmp_path: Path, file_name: str, damage: bytes, message: str
) -> None:
    directory = copy_checkpoint(saved_bert, tmp_path)
    (directory / file_name).write_bytes(damage)
    with pytest.raises(DilstoreError, match=message) as caught:
        DilBertReader.from_pretrained(directory)
    assert str(directory) in str(caught.value)


def test_missing_weights_give_a_clear_error(saved_bert: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(saved_bert, tmp_path)
    (directory / "model.safetensors").unlink()
    with pytest.raises(DilstoreError, match=f"cannot load a model from {directory}"):
        DilBertReader.from_pretrained(directory)


@pytest.mark.parametrize("change", ["drop", "add", "drop-head"])
def test_weights_that_do_not_fit_the_model_are_refused(saved_bert: Path, tmp_path: Path, change: str) -> None:
    """transformers filled a missing weight at random and dropped an unknown one with a warning the commands hide:
    a store built so verified as whole, with wrong states."""
    directory = copy_checkpoint(saved_bert, tmp_path)
    weights = load_file(directory / "model.safetensors")
    name = (
        "qa_outputs.bias" if change == "drop-head" else next(key for key in weights if key.endswith("LayerNorm.bias"))
    )
    if change == "add":
        weights["extra.weight"] = weights.pop(name).clone()
        name = "extra.weight"
    else:
        del weights[name]
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    word = "unknown" if change == "add" else "missing"
    with pytest.raises(DilstoreError, match=f"^cannot load a model from {directory}: its weights do not fit its "
                       f"config: .*{word} '{name}'"):  # fmt: skip
        DilBertReader.from_pretrained(directory)


def test_a_base_model_may_lack_only_the_head(base_bert: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(base_bert, tmp_path)
    weights = load_file(directory / "model.safetensors")
    del weights[next(key for key in weights if key.endswith("LayerNorm.bias"))]
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    DilBertReader.from_pretrained(base_bert, layers=1)  # no head, a pooler it does not use: loads
    with pytest.raises(DilstoreError, match="its weights do not fit its config: missing '.*LayerNorm.bias'"):
        DilBertReader.from_pretrained(directory, layers=1)


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(DilstoreError, match="'gpt2' is not supported.*albert, bert, distilbert, roberta"):
        DilBertReader.from_pretrained(tmp_path, layers=1)


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_a_segment_of_the_model_s_segment_positions_fits_and_one_more_token_does_not(name: str) -> None:
    """Each segment's positions start at the architecture's first (RoBERTa: pad_token_id + 1): the limit checked
    before a run must be the tokens the model then encodes, or a long run stops at its first long passage."""
    from dilstore.reader.modeling.architectures import architecture_for, require_segment_limit, segment_positions

    model = tiny_model(name)
    architecture = architecture_for(model.config.model_type)
    positions = segment_positions(model.config)

    def encode(length: int) -> torch.Tensor:
        ids = torch.full((1, length), 5, dtype=torch.long)
        return architecture.encode_segment(model, ids, torch.ones_like(ids), architecture.passage_segment, 1)

    assert encode(positions).shape[:2] == (1, positions)
    require_segment_limit(model.config, positions, "passage", "--max-length")
    with pytest.raises(DilstoreError, match="longer than this model's"):
        encode(positions + 1)
    with pytest.raises(DilstoreError, match=rf"the passage limit {positions + 1} \(--max-length\) is more than"):
        require_segment_limit(model.config, positions + 1, "passage", "--max-length")


def test_base_model_dir_is_the_packaged_minilm() -> None:
    config = json.loads((base_model_dir() / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("bert", 6, 384)


@settings(max_examples=25, deadline=None)
@given(
    kind=st.text(min_size=1, max_size=12),
    architecture=st.sampled_from(["bert", "albert", "distilbert", "roberta"]),
    layers=st.integers(0, 48),
    extra=st.integers(0, 48),
)
def test_metadata_round_trips(kind: str, architecture: str, layers: int, extra: int, tmp_path_factory) -> None:
    directory = tmp_path_factory.mktemp("metadata")
    metadata = CheckpointMetadata(kind=kind, architecture=architecture, layers=layers, num_layers=layers + extra)
    write_metadata(directory, metadata)
    assert read_metadata(directory) == metadata


@pytest.mark.parametrize(
    ("name", "value"), [("layers", True), ("layers", False), ("num_layers", True), ("layers", 1.0)]
)
def test_a_layer_count_that_is_not_an_integer_is_refused(name: str, value: object, tmp_path: Path) -> None:
    """JSON's true is a Python int too: `"layers": true` read as k = 1, a reader split where no run trained it."""
    document = {"format": 1, "kind": "dilbert", "architecture": "bert", "layers": 1, "num_layers": 3, name: value}
    (tmp_path / "dilstore.json").write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(DilstoreError, match=rf"dilstore\.json: {name} must be an integer, got {value!r}$"):
        read_metadata(tmp_path)


def pickled(source: Path, destination: Path) -> Path:
    """`source` with its model.safetensors turned into a pickle pytorch_model.bin, as an untrusted folder may be."""
    shutil.copytree(source, destination)
    weights = destination / "model.safetensors"
    torch.save(load_file(weights), destination / "pytorch_model.bin")
    weights.unlink()
    return destination


def test_a_pickle_checkpoint_is_never_loaded(saved_bert: Path, base_bert: Path, tmp_path: Path) -> None:
    """With no model.safetensors, transformers loaded a pytorch_model.bin (a pickle) as the model (hostile46 F5)."""
    from dilstore.reader.modeling.earl_checkpoints import load_base_encoder

    with pytest.raises(DilstoreError, match=r"^cannot load a model from .*reader: .*model\.safetensors"):
        DilBertReader.from_pretrained(pickled(saved_bert, tmp_path / "reader"))
    with pytest.raises(DilstoreError, match=r"^cannot load an encoder from .*base: .*model\.safetensors"):
        load_base_encoder(pickled(base_bert, tmp_path / "base"))


def test_metadata_nested_too_deep_is_named(saved_bert: Path, tmp_path: Path) -> None:
    """A dilstore.json nested 100,000 deep raised RecursionError through precompute (hostile46 F4)."""
    from dilstore.reader.text.files import read_json

    copy = Path(shutil.copytree(saved_bert, tmp_path / "deep"))
    (copy / "dilstore.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    with pytest.raises(DilstoreError, match="cannot read dilstore metadata: maximum recursion depth"):
        DilBertReader.from_pretrained(copy)
    with pytest.raises(DilstoreError, match=r"dilstore\.json: its JSON is nested too deep to read$"):
        read_json(copy / "dilstore.json")


def test_metadata_with_a_number_too_long_for_python_is_named(tmp_path: Path) -> None:
    """(fuzz60 F3) A number of over 4,300 digits in dilstore.json raised Python's ValueError through a model's load."""
    from dilstore.reader.modeling.checkpoints import read_metadata

    (tmp_path / "dilstore.json").write_text('{"kind": ' + "5" * 5000 + "}", encoding="utf-8")
    with pytest.raises(DilstoreError, match=r"dilstore\.json: cannot read dilstore metadata: Exceeds the limit"):
        read_metadata(tmp_path)


@pytest.mark.parametrize(("change", "message"), [
    ({"num_hidden_layers": 10**6}, r"config\.json asks for 1000000 layers, but its weights hold \d+$"),
    ({"vocab_size": 10**9}, r"config\.json asks for word embeddings of 1000000000 x \d+, but its weights hold"),
    ({"intermediate_size": 10**6}, r"config\.json asks for feed-forward layers of 1000000 x \d+, but its weights"),
])  # fmt: skip
def test_a_config_asking_for_more_than_the_weights_hold_is_refused_before_the_build(
    saved_bert: Path, base_bert: Path, tmp_path: Path, change: dict, message: str
) -> None:
    """config.json was trusted: 10**6 layers took 4 GB and 87 s to a MemoryError (hostile46 F6)."""
    from dilstore.reader.modeling.earl_checkpoints import load_base_encoder

    for name, source, load in (("reader", saved_bert, DilBertReader.from_pretrained),
                               ("base", base_bert, load_base_encoder)):  # fmt: skip
        copy = Path(shutil.copytree(source, tmp_path / name))
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(DilstoreError, match=message):
            load(copy)


def test_weights_of_another_shape_than_the_config_are_named(saved_bert: Path, tmp_path: Path) -> None:
    """It said only "For details look at the above report!", a report quiet commands hide (hostile46 F10)."""
    copy = Path(shutil.copytree(saved_bert, tmp_path / "reader"))
    config = json.loads((copy / "config.json").read_text())
    positions = config["max_position_embeddings"]
    (copy / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions + 1}))
    message = (r"its weights do not fit its config: \d+ of another shape than config\.json gives, e\.g\. "
               rf"'.*position_embeddings\.weight': \({positions}, \d+\) in the file, \({positions + 1}, \d+\) by")
    with pytest.raises(DilstoreError, match=message):
        DilBertReader.from_pretrained(copy)
