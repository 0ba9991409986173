"""`train qa --freeze-lower --store-encoding ENC`: training on the passage states a low-bit store returns.

Checked: the cache keeps the round trip's output for passages and leaves
questions alone; a run trains its codebook on a seeded sample of its own
passage windows, saves it to OUTPUT/codebook and reads it back on resume
(a given codebook is used as it is); a whole tiny run keeps the lower layers
bit for bit and records its encoding; and the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dilstore.reader.data.qa_batches import collate_features
from dilstore.reader.data.qa_features import QAFeature
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training import store_codec
from dilstore.reader.training.frozen_lower import CACHE_DTYPE, LowerStateCache
from dilstore.reader.training.qa import TrainingConfig, load_training_data, train_qa
from dilstore.reader.training.store_codec import passage_state_sample, training_round_trip
from dilstore.runners.cli import main
from dilstore.storage.codebook import CODEBOOK_DIR, codebook_sample_tokens, read_codebook, write_codebook
from dilstore.storage.encodings import round_trip, train_codebook
from dilstore.storage.errors import DilstoreError
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def reader(tiny_base: Path) -> DilBertReader:
    return DilBertReader.from_pretrained(tiny_base, layers=1)


@pytest.fixture(scope="module")
def features(squad_file: Path, reader: DilBertReader) -> list[QAFeature]:
    return load_training_data(reader.tokenizer, squad_file, TrainingConfig(layers=1, **SMALL_WINDOWS)).features


def windows(features: list[QAFeature]) -> list[list[int]]:
    return [feature.passage.token_ids.tolist() for feature in features]


def test_the_cache_keeps_the_round_trip_of_passages_and_plain_questions(
    reader: DilBertReader, features: list[QAFeature]
) -> None:
    batch = collate_features(features, reader.tokenizer.pad_token_id)
    plain_questions, plain_passages = LowerStateCache(reader).states(features, batch)
    questions, passages = LowerStateCache(reader, lambda states: 2 * states + 1).states(features, batch)
    torch.testing.assert_close(questions, plain_questions, atol=0, rtol=0)
    valid = batch.passage_mask.bool()
    expected = (2 * plain_passages.float() + 1).to(CACHE_DTYPE)  # fp16 both ways: a step of rounding apart
    torch.testing.assert_close(passages[valid], expected[valid], atol=2e-3, rtol=2e-3)
    assert not passages[~valid].any()


def test_the_codebook_sample_is_seeded_and_drawn_from_at_most_so_many_distinct_windows(
    reader: DilBertReader, features: list[QAFeature], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = windows(features)
    first = passage_state_sample(reader, rows, CPU)
    np.testing.assert_array_equal(first, passage_state_sample(reader, rows[::-1] + rows, CPU))  # order, repeats
    distinct = {tuple(row) for row in rows}
    assert first.shape == (sum(len(row) for row in distinct), reader.hidden_size)  # few tokens: all of them
    monkeypatch.setattr(store_codec, "CODEBOOK_SAMPLE_UNITS", 2)
    monkeypatch.setattr(store_codec, "CODEBOOK_SAMPLE_TOKENS", 10)
    small = passage_state_sample(reader, rows, CPU)
    assert small.shape == (10, reader.hidden_size)
    assert not np.array_equal(small, passage_state_sample(reader, rows, CPU, seed=1))


def test_a_run_saves_its_codebook_and_a_resumed_run_reads_it_back(
    reader: DilBertReader, features: list[QAFeature], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    states = np.random.default_rng(0).standard_normal((20, reader.hidden_size)).astype(np.float32)  # (T, d)
    through = training_round_trip(reader, windows(features), "2bit", None, tmp_path, CPU, resume=False)
    saved, shape = read_codebook(tmp_path / CODEBOOK_DIR, "2bit")
    assert shape == (reader.hidden_size,)
    sample = passage_state_sample(reader, windows(features), CPU)  # (N, d)
    trained = train_codebook("2bit", sample)
    assert codebook_sample_tokens(tmp_path / CODEBOOK_DIR) == len(sample)  # what a store given it reads (codes51 F1)
    for name, values in trained.items():
        np.testing.assert_array_equal(saved[name], values)
    np.testing.assert_array_equal(through(states), round_trip("2bit", saved)(states))

    def no_sampling(*args, **kwargs):
        raise AssertionError("a resumed run must read its codebook back, not train another")

    monkeypatch.setattr(store_codec, "passage_state_sample", no_sampling)
    resumed = training_round_trip(reader, windows(features), "2bit", None, tmp_path, CPU, resume=True)
    np.testing.assert_array_equal(resumed(states), through(states))
    given = {name: values if name in ("allocation", "rotation") else values * 2  # another one: its axes stay unit
             for name, values in saved.items()}
    write_codebook(tmp_path / "given", "2bit", given, shape)
    fresh = training_round_trip(reader, windows(features), "2bit", tmp_path / "given", tmp_path, CPU, resume=False)
    np.testing.assert_array_equal(read_codebook(tmp_path / CODEBOOK_DIR, "2bit")[0]["mean"], given["mean"])
    assert codebook_sample_tokens(tmp_path / CODEBOOK_DIR) is None  # the given one records none
    np.testing.assert_array_equal(fresh(states), round_trip("2bit", given)(states))
    with pytest.raises(DilstoreError, match="1bit"):
        training_round_trip(reader, windows(features), "1bit", None, tmp_path, CPU, resume=True)  # a 2bit codebook


def test_a_codebook_trained_on_few_states_is_warned_of_before_training(
    reader: DilBertReader, features: list[QAFeature], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(left55b F2) A codebook of a few hundred training states was saved without a word, unlike `precompute`'s:
    the upper layers trained on less error than a store gives, and `precompute --codebook` refused it only later."""
    count = len(passage_state_sample(reader, windows(features), CPU))
    training_round_trip(reader, windows(features), "2bit", None, tmp_path / "a", CPU, resume=False)
    err = capsys.readouterr().err
    assert f"warning: the 2bit codebook was trained on only {count:,} token states" in err
    assert "fewer than the 2,000 a codebook needs" in err and "--codebook OUTPUT/codebook` will refuse it" in err
    monkeypatch.setattr(store_codec, "MIN_REUSE_TOKENS", count)  # enough to reuse, too few to skip the measurement
    training_round_trip(reader, windows(features), "2bit", None, tmp_path / "b", CPU, resume=False)
    err = capsys.readouterr().err
    assert f"only {count:,} token states" in err and "will refuse it" not in err
    monkeypatch.setattr(store_codec, "SMALL_SAMPLE_TOKENS", count)
    training_round_trip(reader, windows(features), "2bit", None, tmp_path / "c", CPU, resume=False)
    training_round_trip(reader, windows(features), "2bit", None, tmp_path / "a", CPU, resume=True)  # read back
    assert capsys.readouterr().err == ""


def test_a_given_codebook_of_few_states_is_warned_of_before_training(
    reader: DilBertReader, features: list[QAFeature], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(left56 F4) `--codebook DIR` of a small store's codebook, which records the few states it was trained on, was
    taken without a word, where a codebook the run trains on as few is warned of."""
    sample = passage_state_sample(reader, windows(features), CPU)  # (N, d)
    arrays = train_codebook("2bit", sample)
    for count in (300, store_codec.MIN_REUSE_TOKENS, store_codec.SMALL_SAMPLE_TOKENS):
        given = tmp_path / f"given-{count}"
        write_codebook(given, "2bit", arrays, sample.shape[1:], sample_tokens=count)
        training_round_trip(reader, windows(features), "2bit", given, tmp_path / f"run-{count}", CPU, resume=False)
        err = capsys.readouterr().err
        if count == store_codec.SMALL_SAMPLE_TOKENS:
            assert err == ""
            continue
        assert f"warning: --codebook {given} (2bit) was trained on only {count:,} token states" in err
        assert ("`dilstore precompute --codebook` refuses it" in err) == (count < store_codec.MIN_REUSE_TOKENS)
        assert codebook_sample_tokens(tmp_path / f"run-{count}" / CODEBOOK_DIR) == count  # the copy records it


def test_a_tiny_run_keeps_the_lower_layers_and_records_its_encoding(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    config = TrainingConfig(layers=1, epochs=3, batch_size=4, learning_rate=5e-3, log_every=1000, freeze_lower=True,
                            store_encoding="1bit", **SMALL_WINDOWS)  # fmt: skip
    train_qa(tiny_base, squad_file, tmp_path / "run", config, command="test", progress=False)
    before = DilBertReader.from_pretrained(tiny_base, layers=1)
    after = load_file(tmp_path / "run" / "model.safetensors")
    online = set(before.online_state_names())
    state = before.model.state_dict()
    assert online and all(torch.equal(after[name], state[name]) for name in state if name not in online)
    assert not any(torch.equal(after[name], state[name]) for name in online if name.endswith("dense.weight"))
    record = json.loads((tmp_path / "run" / "dilstore_training.json").read_text())
    assert record["config"]["store_encoding"] == "1bit"
    assert read_codebook(tmp_path / "run" / CODEBOOK_DIR, "1bit")[1] == (before.hidden_size,)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"store_encoding": "2bit"}, "needs --freeze-lower"),
        ({"freeze_lower": True, "codebook": "x"}, "give --store-encoding too"),
        ({"freeze_lower": True, "store_encoding": "3bit"}, "unknown encoding '3bit'"),
    ],
)
def test_config_refusals(fields: dict, message: str) -> None:
    with pytest.raises(DilstoreError, match=message):
        TrainingConfig(layers=1, **fields)


def test_cli_refuses_a_store_encoding_without_frozen_lower_layers_and_a_missing_codebook(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file),
              "--output", str(tmp_path / "o"), "--max-steps", "1", "--no-progress"]  # fmt: skip
    assert main([*common, "--store-encoding", "2bit"]) == 2
    assert "needs --freeze-lower" in capsys.readouterr().err
    missing = tmp_path / "no-codebook"
    assert main([*common, "--freeze-lower", "--store-encoding", "2bit", "--codebook", str(missing)]) == 2
    assert f"--codebook {missing}: no such directory" in capsys.readouterr().err
