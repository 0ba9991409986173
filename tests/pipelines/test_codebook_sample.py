"""What a 2bit/1bit codebook's sample means for the runs that reuse it (codes51 F1, F4).

A codebook trained on a few passages fits them and few others: appended passages got a relative error of 0.955
and F1 9.7 instead of 73.6, with exit 0 and `verify` OK. The build now says so, the codebook records its sample,
and an --append or a --codebook run measures such a codebook on its own states and refuses it where a codebook
trained on them would code them far better. NaN states in the sampling pass were a scipy traceback naming no
passage; they are refused as the shard writers refuse them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from dilstore.pipelines import codebook as codebook_module
from dilstore.runners import cli
from dilstore.storage import codebook as codebooks
from dilstore.storage.codebook import CODEBOOK_DIR, read_codebook, write_codebook
from dilstore.storage.verify import verify_store
from tests.fixtures.pipeline_fixtures import save_tiny_reader, wiki_like_documents, write_jsonl

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_reader(tmp_path_factory.mktemp("tiny-reader"))


def documents(count: int, prefix: str, seed: int) -> list[dict[str, str]]:
    return [{**document, "id": f"{prefix}-{number}"} for number, document in enumerate(wiki_like_documents(count,
                                                                                                          seed=seed))]


def precompute(inputs: Path, model: Path, output: Path, *extra: str) -> int:
    return cli.main(["precompute", "--input", str(inputs), "--output", str(output), "--model", str(model),
                     "--max-length", str(MAX_LENGTH), "--threads", "1", "--workers", "1", "--no-progress",
                     "--encoding", "2bit", *extra])  # fmt: skip


def test_a_codebook_of_a_few_passages_is_told_at_build_and_refused_for_appends_and_reuse_it_fits_poorly(
    tiny_dir: Path, tmp_path: Path, capsys
) -> None:
    small = write_jsonl(tmp_path / "small.jsonl", documents(1, "small", seed=0))
    more = write_jsonl(tmp_path / "more.jsonl", documents(100, "more", seed=1))
    store = tmp_path / "store"
    assert precompute(small, tiny_dir, store) == 0
    said = capsys.readouterr().err
    assert said.count("the codebook was trained on only") == 1, said
    count = codebooks.codebook_sample_tokens(store / CODEBOOK_DIR)
    assert count is not None and 0 < count < codebook_module.SMALL_SAMPLE_TOKENS
    assert f"the codebook was trained on only {count:,} token states" in said
    assert "--append" in said and "--codebook" in said
    manifest = (store / "manifest.json").read_bytes()
    assert precompute(more, tiny_dir, store, "--append") == 2
    refused = capsys.readouterr().err
    assert f"cannot append to {store}" in refused and f"was trained on only {count:,} token states" in refused
    assert re.search(r"relative error (\d\.\d{3}) on a sample of this run's states, against (\d\.\d{3})", refused)
    assert (store / "manifest.json").read_bytes() == manifest and not (store / "appends").exists()
    assert verify_store(store).ok
    assert precompute(more, tiny_dir, tmp_path / "reuse", "--codebook", str(store / CODEBOOK_DIR)) == 2
    refused = capsys.readouterr().err
    assert "does not fit this run" in refused and "leave --codebook out" in refused
    assert not (tmp_path / "reuse").exists()


def test_a_codebook_of_a_full_sample_is_not_measured_again_and_a_copy_keeps_its_count(
    tiny_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measuring costs a sampling pass and a training (about as long again as a 60-passage append): a codebook that
    records SMALL_SAMPLE_TOKENS states or more is not measured; one that records none (stores built before) is."""
    more = write_jsonl(tmp_path / "more.jsonl", documents(100, "more", seed=1))
    small = write_jsonl(tmp_path / "small.jsonl", documents(1, "small", seed=0))
    store = tmp_path / "store"
    assert precompute(more, tiny_dir, store) == 0
    assert "trained on only" not in capsys.readouterr().err
    count = codebooks.codebook_sample_tokens(store / CODEBOOK_DIR)
    assert count is not None and count >= codebook_module.SMALL_SAMPLE_TOKENS
    with monkeypatch.context() as patch:
        patch.setattr(codebook_module, "codebook_fit", lambda *args: pytest.fail("measured"))
        assert precompute(small, tiny_dir, store, "--append") == 0
        assert precompute(small, tiny_dir, tmp_path / "reuse", "--codebook", str(store / CODEBOOK_DIR)) == 0
    assert codebooks.codebook_sample_tokens(tmp_path / "reuse" / CODEBOOK_DIR) == count
    unrecorded = tmp_path / "unrecorded"  # as written before the count was recorded
    arrays, shape = read_codebook(store / CODEBOOK_DIR, "2bit")
    write_codebook(unrecorded, "2bit", arrays, shape)
    measured = []
    monkeypatch.setattr(codebook_module, "codebook_fit", lambda *args: measured.append(args) or None)
    assert precompute(small, tiny_dir, tmp_path / "reuse-unrecorded", "--codebook", str(unrecorded)) == 0
    assert len(measured) == 1


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
