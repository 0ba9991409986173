"""NaN states in a 2bit/1bit run's sampling pass (codes51 F4): they were a scipy traceback naming no passage; they
are refused as the shard writers refuse them, naming the passage."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from dilstore.runners import cli
from tests.fixtures.pipeline_fixtures import save_tiny_reader

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reader(tmp_path_factory.mktemp("tiny-reader"))


def precompute(inputs: Path, model: Path, output: Path, *extra: str) -> int:
    return cli.main(["precompute", "--input", str(inputs), "--output", str(output), "--model", str(model),
                     "--max-length", str(MAX_LENGTH), "--threads", "1", "--workers", "1", "--no-progress",
                     "--encoding", "2bit", *extra])  # fmt: skip


def test_nan_states_in_the_sampling_pass_are_refused_naming_the_passage(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    """fp16 and int8 refuse them with the passage id; 2bit's sampling pass was a scipy ValueError traceback."""
    model = shutil.copytree(tiny_dir, tmp_path / "nan-model")
    weights = load_file(model / "model.safetensors")
    embeddings = weights["bert.embeddings.word_embeddings.weight"].copy()
    embeddings[29145] = float("nan")  # "zebra"
    save_file({**weights, "bert.embeddings.word_embeddings.weight": embeddings}, model / "model.safetensors")
    inputs = tmp_path / "nan.jsonl"
    inputs.write_text("".join(json.dumps(row) + "\n" for row in [
        {"id": "good", "title": "", "text": "the river valley city"},
        {"id": "bad", "title": "", "text": "the zebra crossed the river"},
    ]), encoding="utf-8")  # fmt: skip
    assert precompute(inputs, model, tmp_path / "store", "--split", "none") == 2
    error = capsys.readouterr().err
    assert re.search(r"error: passage 'bad': token \d+ has NaN or infinite states", error), error
    assert "Traceback" not in error
