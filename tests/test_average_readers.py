"""benchmarks/average_readers.py: the uniform weight average of readers of one kind, with clear refusals."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dilstore.storage.errors import DilstoreError
from tests.fixtures.benchmarks import benchmark_module

CONFIG = {"model_type": "bert", "hidden_size": 4}
KIND = {"kind": "dilbert", "layers": 4, "num_layers": 6}


def write_reader(folder: Path, tensors: dict[str, torch.Tensor], kind: dict | None = None) -> Path:
    """A reader folder with `tensors` as its weights and the given dilstore.json (KIND by default)."""
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
    (folder / "dilstore.json").write_text(json.dumps(kind or KIND), encoding="utf-8")
    (folder / "tokenizer.json").write_text(f'{{"from": "{folder.name}"}}', encoding="utf-8")
    return folder


def test_the_average_is_the_float32_mean_stored_as_fp16_with_its_sources_in_the_record(tmp_path: Path, capsys) -> None:
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(3, 4, generator=generator, dtype=torch.float32) for _ in range(3)]
    readers = [
        write_reader(tmp_path / f"r{i}", {"w": w.half(), "position_ids": torch.arange(5)})
        for i, w in enumerate(weights)
    ]
    (readers[-1] / "dilstore_training.json").write_text('{"command": "round 3"}', encoding="utf-8")
    output = tmp_path / "soup"
    with benchmark_module("average_readers") as average_readers:
        assert average_readers.main([*map(str, readers), "--output", str(output)]) == 0
    averaged = load_file(output / "model.safetensors")
    expected = torch.stack([w.half().float() for w in weights]).mean(dim=0).half()
    assert averaged["w"].dtype == torch.float16 and torch.equal(averaged["w"], expected)
    assert torch.equal(averaged["position_ids"], torch.arange(5))
    assert json.loads((output / "dilstore.json").read_text()) == KIND
    assert json.loads((output / "tokenizer.json").read_text()) == {"from": "r0"}
    training = json.loads((output / "dilstore_training.json").read_text())
    assert training["command"] == "round 3", "the newest (last) reader's training record is carried"
    record = training["averaged_from"]
    assert [source["reader"] for source in record["sources"]] == [str(reader) for reader in readers]
    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    assert [source["sha256"] for source in record["sources"]] == [digest(r / "model.safetensors") for r in readers]
    assert record["output_sha256"] == digest(output / "model.safetensors")
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == record


def test_readers_of_another_kind_or_shape_are_refused_by_name(tmp_path: Path) -> None:
    first = write_reader(tmp_path / "a", {"w": torch.zeros(2, 2, dtype=torch.float16)})
    other_k = write_reader(tmp_path / "b", {"w": torch.zeros(2, 2, dtype=torch.float16)}, {**KIND, "layers": 3})
    other_shape = write_reader(tmp_path / "c", {"w": torch.zeros(2, 3, dtype=torch.float16)})
    other_names = write_reader(tmp_path / "d", {"v": torch.zeros(2, 2, dtype=torch.float16)})
    other_ids = write_reader(tmp_path / "e", {"w": torch.zeros(2, 2, dtype=torch.float16)})
    listed = write_reader(tmp_path / "f", {"w": torch.ones(2, 2, dtype=torch.float16)})
    (listed / "config.json").write_text("[1]", encoding="utf-8")
    save_file({"w": torch.zeros(2, 2, dtype=torch.int64)}, first.parent / "ints-a.safetensors")
    save_file({"w": torch.ones(2, 2, dtype=torch.int64)}, first.parent / "ints-b.safetensors")
    with benchmark_module("average_readers") as average_readers:
        cases = [
            ([first, other_k], re.escape(f"{other_k / 'dilstore.json'} differs from")),
            ([first, other_shape], re.escape(f"{other_shape}/model.safetensors: tensor 'w' is (2, 3), (2, 2) in")),
            ([first, other_names], "other tensors than .*, e.g. 'v' \\(2 differ\\)"),
            ([first, tmp_path / "missing"], "missing: no config.json; give reader folders"),
            ([first], "give 2 or more readers to average, not 1"),
            ([first, other_ids], re.escape(f"{other_ids} holds the weights of {first}: a reader given twice")),
            ([first, listed], re.escape(f"{listed / 'config.json'}: not a JSON object")),
        ]
        for readers, message in cases:
            with pytest.raises(DilstoreError, match=message):
                average_readers.average_readers(readers, tmp_path / "out")
        with pytest.raises(DilstoreError, match="integer tensor 'w' differs"):
            average_readers.average_weights([first.parent / "ints-a.safetensors", first.parent / "ints-b.safetensors"])
        with pytest.raises(DilstoreError, match="exists already"):
            average_readers.average_readers([first, other_ids], tmp_path / "a")
        with pytest.raises(SystemExit, match="average_readers: give 2 or more readers"):
            average_readers.main([str(first), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_readers_saved_by_other_transformers_versions_still_average(tmp_path: Path) -> None:
    """The shipped reader (saved by transformers 5.17 on a GPU) and a checkpoint saved here (5.23) were refused as
    readers of another kind: their config.json differ only in `transformers_version`."""
    gpu = write_reader(tmp_path / "gpu", {"w": torch.zeros(2, 2, dtype=torch.float16)})
    here = write_reader(tmp_path / "here", {"w": torch.ones(2, 2, dtype=torch.float16)})
    for reader, version in ((gpu, "5.17.0"), (here, "5.23.0")):
        (reader / "config.json").write_text(json.dumps({**CONFIG, "transformers_version": version}), encoding="utf-8")
    with benchmark_module("average_readers") as average_readers:
        average_readers.average_readers([gpu, here], tmp_path / "soup")
    assert torch.equal(load_file(tmp_path / "soup" / "model.safetensors")["w"], torch.full((2, 2), 0.5).half())
