"""`train qa --freeze-lower`: the store as a training cache (frozen layers 1..k, cached fp16 layer-k states).

Checked: the cache returns exactly the fp16-rounded eval-mode states of the
reader's own encoders, each distinct window encoded once; training changes
only layers k+1..l and the head, bit for bit; the cached training path gives
the logits of the uncached one; and the refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoTokenizer

from dilstore.reader.data.qa_features import QAFeature
from dilstore.reader.modeling.checkpoints import base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.frozen_lower import CACHE_DTYPE, LowerStateCache, freeze_lower_layers
from dilstore.reader.training.qa import TrainingConfig, load_training_data, train_qa
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.dilbert_tiny import tiny_model
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS, write_tiny_checkpoint


@pytest.fixture(scope="module")
def dropout_reader(tmp_path_factory: pytest.TempPathFactory) -> DilBertReader:
    """A tiny k=1 reader with dropout 0.3 in train mode: cached states must not carry dropout noise."""
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-dropout"), dropout=0.3)
    return DilBertReader.from_pretrained(directory, layers=1).train()


@pytest.fixture(scope="module")
def features(squad_file: Path, dropout_reader: DilBertReader) -> list[QAFeature]:
    """Every training window of the handful (questions share paragraphs; one paragraph spans several windows)."""
    return load_training_data(dropout_reader.tokenizer, squad_file, TrainingConfig(layers=1, **SMALL_WINDOWS)).features


def direct_states(reader: DilBertReader, rows: list[list[int]], passages: bool) -> list[torch.Tensor]:
    """Each row encoded alone in eval mode, rounded to the cache's dtype: (n, d) each."""
    reader.eval()
    encode = reader.encode_passages if passages else reader.encode_questions
    with torch.no_grad():
        out = [
            encode(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))[0].to(CACHE_DTYPE) for row in rows
        ]
    reader.train()
    return out


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_cached_states_are_the_encoders_fp16_eval_states_padded_like_the_batch(
    dropout_reader: DilBertReader, features: list[QAFeature], data: st.DataObject
) -> None:
    cache = LowerStateCache(dropout_reader)
    for _ in range(data.draw(st.integers(1, 3))):
        chosen = data.draw(st.lists(st.sampled_from(features), min_size=1, max_size=6))
        batch = load_batch(chosen, dropout_reader)
        questions, passages = cache.states(chosen, batch)
        assert questions.shape == (*batch.question_ids.shape, dropout_reader.hidden_size)
        assert passages.shape == (*batch.passage_ids.shape, dropout_reader.hidden_size)
        for side, mask, rows, is_passage in (
            (questions, batch.question_mask, [f.question.token_ids.tolist() for f in chosen], False),
            (passages, batch.passage_mask, [f.passage.token_ids.tolist() for f in chosen], True),
        ):
            for row, (states, expected) in enumerate(zip(side, direct_states(dropout_reader, rows, is_passage))):
                length = int(mask[row].sum())
                # Batched and one-row encodings differ by float noise only, far below fp16's step here.
                torch.testing.assert_close(states[:length], expected, atol=2e-3, rtol=2e-3)
                assert not states[length:].any()
    assert dropout_reader.training, "the cache restores train mode"


def test_a_reader_in_eval_mode_stays_in_eval_mode_after_the_cache_encodes(
    tiny_base: Path, features: list[QAFeature]
) -> None:
    """The cache encodes in eval mode and puts back the mode it found: a reader in eval mode (the codebook's sample
    is encoded before training starts) must not come back with its dropout on."""
    reader = DilBertReader.from_pretrained(tiny_base, layers=1).eval()
    LowerStateCache(reader).states(features[:2], load_batch(features[:2], reader))
    assert not reader.training and not any(module.training for module in reader.modules())
    reader.train()
    LowerStateCache(reader).states(features[:2], load_batch(features[:2], reader))
    assert reader.training


def load_batch(chosen: list[QAFeature], reader: DilBertReader):
    from dilstore.reader.data.qa_batches import collate_features

    return collate_features(chosen, reader.tokenizer.pad_token_id)


def test_each_distinct_window_is_encoded_once(
    dropout_reader: DilBertReader, features: list[QAFeature], monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = {"questions": 0, "passages": 0}
    for side, name in (("questions", "encode_questions"), ("passages", "encode_passages")):
        original = getattr(dropout_reader, name)

        def counting(ids: torch.Tensor, mask: torch.Tensor, original=original, side=side) -> torch.Tensor:
            encoded[side] += ids.shape[0]
            return original(ids, mask)

        monkeypatch.setattr(dropout_reader, name, counting)
    cache = LowerStateCache(dropout_reader)
    batch = load_batch(features, dropout_reader)
    first = cache.states(features, batch)
    distinct_passages = len({tuple(f.passage.token_ids.tolist()) for f in features})
    distinct_questions = len({tuple(f.question.token_ids.tolist()) for f in features})
    assert distinct_passages < len(features), "the handful's questions share paragraph windows"
    assert encoded == {"questions": distinct_questions, "passages": distinct_passages}
    assert cache.sizes == {"cached_questions": distinct_questions, "cached_passage_windows": distinct_passages}
    again = cache.states(features[::-1], load_batch(features[::-1], dropout_reader))
    assert encoded == {"questions": distinct_questions, "passages": distinct_passages}
    torch.testing.assert_close(again[1], first[1].flip(0), atol=0, rtol=0)


def test_the_cached_path_gives_the_uncached_logits(tiny_base: Path, features: list[QAFeature]) -> None:
    reader = DilBertReader.from_pretrained(tiny_base, layers=1).eval()
    batch = load_batch(features, reader)
    questions, passages = LowerStateCache(reader).states(features, batch)
    with torch.no_grad():
        cached = reader.forward_from_states(questions, batch.question_mask, passages, batch.passage_mask)
        plain = reader.forward_with_states(batch.question_ids, batch.question_mask, batch.passage_ids,
                                           batch.passage_mask)  # fmt: skip
    valid = torch.cat([batch.question_mask, batch.passage_mask], dim=1).bool()
    for got, want in zip(cached[:2], plain[:2]):
        torch.testing.assert_close(got[valid], want[valid], atol=5e-3, rtol=5e-3)  # fp16 rounding of the inputs


def test_training_changes_only_the_upper_layers_and_the_head(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    config = TrainingConfig(layers=1, epochs=40, batch_size=4, learning_rate=5e-3, log_every=1000, freeze_lower=True,
                            **SMALL_WINDOWS)  # fmt: skip
    result = train_qa(tiny_base, squad_file, tmp_path / "run", config, command="test", progress=False)
    assert sum(result.losses[-3:]) < 0.5 * sum(result.losses[:3])
    before = DilBertReader.from_pretrained(tiny_base, layers=1).model.state_dict()
    after = load_file(tmp_path / "run" / "model.safetensors")
    frozen = [name for name in before if name.startswith(("bert.embeddings.", "bert.encoder.layer.0."))]
    trained = [name for name in before if name.startswith(("bert.encoder.layer.1.", "qa_outputs."))]
    assert frozen and trained
    for name in frozen:
        assert torch.equal(after[name], before[name]), name
    assert all(not torch.equal(after[name], before[name]) for name in trained if name.endswith("weight"))
    record = json.loads((tmp_path / "run" / "dilstore_training.json").read_text())
    assert record["config"]["freeze_lower"] is True
    assert 0 < record["cached_passage_windows"] < record["train_features"]


def test_k0_and_shared_layer_weights_are_refused(tiny_base: Path) -> None:
    with pytest.raises(DilstoreError, match="needs k of at least 1"):
        freeze_lower_layers(DilBertReader.from_pretrained(tiny_base, layers=0))
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    albert = DilBertReader(tiny_model("albert"), tokenizer, layers=1)  # one layer group: all layers share weights
    with pytest.raises(DilstoreError, match="shares weights between layers 1..1 and the layers above"):
        freeze_lower_layers(albert)


def test_layers_shared_only_with_the_layer_just_above_k_are_refused() -> None:
    """ALBERT with 4 layers in 2 groups runs layers 1-2 with group 0 and layers 3-4 with group 1: at k=1, layer 2
    (the first online one) shares layer 1's weights, and freezing them would freeze it too; at k=2 nothing is shared."""
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    grouped = DilBertReader(tiny_model("albert-grouped"), tokenizer, layers=1)
    with pytest.raises(DilstoreError, match="shares weights between layers 1..1 and the layers above"):
        freeze_lower_layers(grouped)
    assert all(parameter.requires_grad for parameter in grouped.model.parameters()), "nothing frozen when refused"
    apart = DilBertReader(tiny_model("albert-grouped"), tokenizer, layers=2)
    freeze_lower_layers(apart)
    group_0, group_1 = apart.model.base_model.encoder.albert_layer_groups
    assert not any(parameter.requires_grad for parameter in group_0.parameters())
    assert all(parameter.requires_grad for parameter in group_1.parameters())


def test_cli_refuses_freeze_lower_at_k0(squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_tiny_checkpoint(tmp_path / "base")
    status = main(["train", "qa", "--model", str(model), "--layers", "0", "--freeze-lower", "--train", str(squad_file),
                   "--output", str(tmp_path / "o"), "--max-steps", "1", "--no-progress"])  # fmt: skip
    assert status == 2
    assert "--freeze-lower needs k of at least 1" in capsys.readouterr().err
