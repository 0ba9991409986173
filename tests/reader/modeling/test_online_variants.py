"""Online layers tuned for a store encoding: `online-ENC.safetensors` beside a reader checkpoint (issue 15).

Checked: a variant holds exactly the online tensors (fp16) and loads back
into the checkpoint, offline weights untouched; writing refuses a tuned
reader whose offline weights moved; loading refuses a variant of other
weights or another encoding; and a store's reader gets the variant of the
store's own encoding only, unless asked not to (`--no-online-variant`).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.online_variants import (
    VARIANT_FORMAT,
    load_online_variant,
    variant_path,
    write_online_variant,
)
from dilstore.reader.serving import odqa, store_checks
from dilstore.reader.serving.odqa import load_store_model
from dilstore.runners.odqa_options import add_odqa_arguments, open_odqa_reader
from dilstore.storage.errors import DilstoreError
from dilstore.storage.reader import open_store
from tests.fixtures.odqa_fixtures import write_reader_checkpoint, write_store


def tuned(model_dir: Path, seed: int = 0) -> DilBertReader:
    """The checkpoint with noise added to every online tensor: a stand-in for `train qa --store-encoding`."""
    reader = DilBertReader.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    state = reader.model.state_dict()
    with torch.no_grad():
        for name in reader.online_state_names():
            state[name].add_(torch.randn(state[name].shape, generator=generator) * 0.1)
    return reader


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    return write_reader_checkpoint(tmp_path / "model")


def online(reader: DilBertReader) -> dict[str, torch.Tensor]:
    state = reader.model.state_dict()
    return {name: state[name].clone() for name in reader.online_state_names()}


def test_a_variant_holds_the_online_tensors_and_loads_back(model_dir: Path) -> None:
    base, trained = DilBertReader.from_pretrained(model_dir), tuned(model_dir)
    path = write_online_variant(trained, base, "2bit", model_dir)
    assert path == model_dir / "online-2bit.safetensors" == variant_path(model_dir, "2bit")
    assert {"bert.encoder.layer.1.output.dense.weight", "qa_outputs.weight"} <= set(base.online_state_names())
    assert not any(name.startswith(("bert.embeddings.", "bert.encoder.layer.0.")) for name in base.online_state_names())
    with safe_open(str(path), framework="pt") as handle:
        assert sorted(handle.keys()) == base.online_state_names()
        assert {handle.get_tensor(name).dtype for name in handle.keys()} == {torch.float16}  # noqa: SIM118
        assert handle.metadata()["format"] == VARIANT_FORMAT and handle.metadata()["encoding"] == "2bit"
    offline_before = {name: tensor.clone() for name, tensor in base.model.state_dict().items()
                      if name not in set(base.online_state_names())}  # fmt: skip
    assert load_online_variant(base, model_dir, "1bit") is None and base.online_variant is None
    assert load_online_variant(base, model_dir, "2bit") == path and base.online_variant == path.name
    for name, tensor in online(trained).items():
        torch.testing.assert_close(base.model.state_dict()[name], tensor.half().float(), atol=0, rtol=0)
    for name, tensor in offline_before.items():
        assert torch.equal(base.model.state_dict()[name], tensor), name


def test_writing_refuses_a_tuned_reader_whose_offline_weights_moved(model_dir: Path) -> None:
    base, trained = DilBertReader.from_pretrained(model_dir), tuned(model_dir)
    with torch.no_grad():
        trained.model.bert.encoder.layer[0].output.dense.bias.add_(1.0)
    with pytest.raises(DilstoreError, match=r"changed offline weights \(bert.encoder.layer.0.output.dense.bias\)"):
        write_online_variant(trained, base, "2bit", model_dir)
    with pytest.raises(DilstoreError, match="another k or config"):
        write_online_variant(DilBertReader.from_pretrained(model_dir, layers=0), base, "2bit", model_dir)
    assert not variant_path(model_dir, "2bit").exists()


def test_loading_refuses_a_variant_of_other_weights_or_another_encoding(model_dir: Path, tmp_path: Path) -> None:
    write_online_variant(tuned(model_dir), DilBertReader.from_pretrained(model_dir), "2bit", model_dir)
    other = write_reader_checkpoint(tmp_path / "other", seed=1)
    shutil.copy(variant_path(model_dir, "2bit"), variant_path(other, "2bit"))
    with pytest.raises(DilstoreError, match="does not belong to the checkpoint beside it: base_weights_sha256"):
        load_online_variant(DilBertReader.from_pretrained(other), other, "2bit")
    variant_path(model_dir, "2bit").rename(variant_path(model_dir, "1bit"))
    with pytest.raises(DilstoreError, match="encoding '2bit' \\(expected '1bit'\\)"):
        load_online_variant(DilBertReader.from_pretrained(model_dir), model_dir, "1bit")
    variant_path(model_dir, "1bit").write_bytes(b"not safetensors")
    with pytest.raises(DilstoreError, match="cannot read the online variant"):
        load_online_variant(DilBertReader.from_pretrained(model_dir), model_dir, "1bit")


def test_a_store_reader_gets_the_variant_of_the_store_encoding_only(model_dir: Path, tmp_path: Path) -> None:
    trained = tuned(model_dir)
    write_online_variant(trained, DilBertReader.from_pretrained(model_dir), "2bit", model_dir)
    plain = online(DilBertReader.from_pretrained(model_dir))
    for encoding in ("2bit", "fp16"):
        write_store(tmp_path / encoding, model_dir, encoding)
    swapped = load_store_model(open_store(tmp_path / "2bit"), model_dir)
    assert swapped.online_variant == "online-2bit.safetensors"
    for name, tensor in online(trained).items():
        torch.testing.assert_close(online(swapped)[name], tensor.half().float(), atol=0, rtol=0)
    for reader in (load_store_model(open_store(tmp_path / "2bit"), model_dir, online_variant=False),
                   load_store_model(open_store(tmp_path / "fp16"), model_dir)):  # fmt: skip
        assert reader.online_variant is None
        assert all(torch.equal(online(reader)[name], tensor) for name, tensor in plain.items())


def test_the_command_line_switch_reaches_open_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    opened = SimpleNamespace(store=SimpleNamespace(check_files=False))  # the command checks the store's files
    monkeypatch.setattr(odqa, "open_reader", lambda *args, **kwargs: seen.append(kwargs["online_variant"]) or opened)
    checked = []  # the store, index and model are checked before torch loads (ci59 F1): there is none at STORE here
    monkeypatch.setattr(store_checks, "check_reader_inputs", lambda store, model, index: checked.append(store))
    parser = argparse.ArgumentParser()
    add_odqa_arguments(parser)
    open_odqa_reader(parser.parse_args(["STORE"]))
    open_odqa_reader(parser.parse_args(["STORE", "--no-online-variant"]))
    assert seen == [True, False] and checked == ["STORE", "STORE"]


def test_the_python_api_switch_reaches_open_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dilstore.open_reader` had no way to read without the variant (lowbit39 L1)."""
    import dilstore

    seen = []
    monkeypatch.setattr(odqa, "open_reader", lambda *args, **kwargs: seen.append(kwargs["online_variant"]))
    dilstore.open_reader("STORE")
    dilstore.open_reader("STORE", online_variant=False)
    assert seen == [True, False]
    with pytest.raises(DilstoreError, match="online_variant must be True or False, got str 'no'"):
        dilstore.open_reader("STORE", online_variant="no")
