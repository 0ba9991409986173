"""A micro-batch's windows in length-sorted chunks (reader/training/length_chunks.py) give one pass's outputs.

Against the reference, one forward pass over the whole padded micro-batch: the logits everywhere, the
states on real tokens, and the training step's loss and gradients (shared normalisation with a teacher, and
with frozen lower layers; dropout off). The tiny random reader and the handful of SQuAD questions keep it
to seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.data.qa_batches import collate_features
from dilstore.reader.data.qa_features import QAFeature
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.frozen_lower import LowerStateCache, freeze_lower_layers
from dilstore.reader.training.length_chunks import (
    CPU_CHUNK_WINDOWS,
    default_chunk_windows,
    forward_in_chunks,
    length_chunks,
)
from dilstore.reader.training.qa import (
    Distillation,
    TrainingConfig,
    TrainingData,
    accumulate_gradients,
    load_training_data,
    train_qa,
)
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS
from tests.fixtures.training_runs import cut_after_last_checkpoint
from tests.reader.training.test_shared_norm import write_handful_triples


@pytest.fixture(scope="module")
def windows(tiny_base: Path, squad_file: Path) -> list[QAFeature]:
    """The handful's training windows: questions and passages of many lengths."""
    reader = DilBertReader.from_pretrained(tiny_base, layers=1)
    return load_training_data(reader.tokenizer, squad_file, TrainingConfig(layers=1, **SMALL_WINDOWS)).features


@settings(max_examples=30, deadline=None)
@given(picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=12), chunk=st.integers(1, 13), k=st.integers(0, 2))
def test_chunks_give_the_logits_and_real_token_states_of_one_pass(
    tiny_base: Path, windows: list[QAFeature], picks: list[int], chunk: int, k: int
) -> None:
    reader = DilBertReader.from_pretrained(tiny_base, layers=k).eval()
    features = [windows[pick % len(windows)] for pick in picks]
    batch = collate_features(features, reader.tokenizer.pad_token_id)
    inputs = (batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask)
    with torch.no_grad():
        start, end, states = reader.forward_with_states(*inputs)  # (b, nq + np) ×2, states (b, nq + np, d)
        chunked = forward_in_chunks(
            lambda _, sub: reader.forward_with_states(sub.question_ids, sub.question_mask, sub.passage_ids,
                                                      sub.passage_mask),
            features, batch, reader.tokenizer.pad_token_id, chunk,
        )  # fmt: skip
    torch.testing.assert_close(chunked[0], start, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked[1], end, atol=1e-5, rtol=1e-5)
    real = torch.cat([batch.question_mask, batch.passage_mask], dim=1).bool()  # (b, nq + np)
    assert len(chunked[2]) == len(states)
    for ours, reference in zip(chunked[2], states, strict=True):
        torch.testing.assert_close(ours[real], reference[real], atol=1e-5, rtol=1e-5)  # padding: masked by every loss


def test_chunks_are_length_sorted_and_cover_every_window_once(windows: list[QAFeature]) -> None:
    chunks = length_chunks(windows, 3)
    assert sorted(index for chunk in chunks for index in chunk) == list(range(len(windows)))
    assert all(len(chunk) <= 3 for chunk in chunks)
    lengths = [len(windows[i].question) + len(windows[i].passage) for chunk in chunks for i in chunk]
    assert lengths == sorted(lengths)


def assert_chunks_change_nothing(
    reader: DilBertReader, data: TrainingData, micro_batches: list[list[int]], chunk: int, **options: object
) -> None:
    """One optimizer step's loss and gradients with chunks of `chunk` windows equal those of one pass each."""

    def step(chunk_windows: int) -> tuple[float, dict[str, torch.Tensor]]:
        reader.zero_grad(set_to_none=True)
        loss = accumulate_gradients(reader, data, micro_batches, torch.device("cpu"), chunk_windows=chunk_windows,
                                    **options)  # fmt: skip
        return loss.item(), {name: p.grad.clone() for name, p in reader.named_parameters() if p.grad is not None}

    whole_loss, whole = step(0)
    chunked_loss, chunked = step(chunk)
    assert whole and chunked.keys() == whole.keys()
    assert chunked_loss == pytest.approx(whole_loss, rel=1e-5)
    for name, gradient in whole.items():
        torch.testing.assert_close(chunked[name], gradient, atol=1e-6, rtol=1e-4, msg=name)


def _shared_norm_data(reader: DilBertReader, squad_file: Path, tmp_path: Path) -> TrainingData:
    triples = write_handful_triples(tmp_path / "ranking")
    config = TrainingConfig(layers=1, shared_norm=str(triples), shared_norm_negatives=2, **SMALL_WINDOWS)
    return load_training_data(reader.tokenizer, squad_file, config)


def test_a_shared_norm_step_with_a_teacher_has_the_loss_and_gradients_of_one_pass(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    student = DilBertReader.from_pretrained(tiny_base, layers=1).eval()  # eval: no dropout, so passes compare
    teacher = DilBertReader.from_pretrained(tiny_base, layers=0).eval().requires_grad_(False)
    distillation = Distillation(teacher, temperature=2.0, alpha=1.0, beta=1.0)
    data = _shared_norm_data(student, squad_file, tmp_path)
    assert_chunks_change_nothing(student, data, [[0, 1], [2, 3]], 2, distillation=distillation)


def test_the_frozen_lower_path_in_chunks_has_the_loss_and_gradients_of_one_pass(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """With --freeze-lower each chunk reads its windows' cached layer-k states at the chunk's own widths."""
    reader = DilBertReader.from_pretrained(tiny_base, layers=1)
    freeze_lower_layers(reader)
    reader.eval()
    data = _shared_norm_data(reader, squad_file, tmp_path)
    assert_chunks_change_nothing(reader, data, [[0, 1, 2]], 3, lower_cache=LowerStateCache(reader))


def test_a_resumed_run_may_change_the_chunk_size(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    """The chunk size changes how a step is computed, not what: a run may resume with another."""
    settings = {"layers": 1, "max_steps": 2, "batch_size": 2, "save_every": 1, **SMALL_WINDOWS}
    train_qa(tiny_base, squad_file, tmp_path, TrainingConfig(**settings, chunk_windows=0), command="t", progress=False)
    cut_after_last_checkpoint(tmp_path)
    resumed = train_qa(tiny_base, squad_file, tmp_path, TrainingConfig(**settings, chunk_windows=3), command="t",
                       resume=True, progress=False)  # fmt: skip
    assert resumed.steps == 2


def test_a_negative_chunk_size_is_refused() -> None:
    with pytest.raises(DilstoreError, match="chunk-windows must be 0"):
        TrainingConfig(layers=1, chunk_windows=-1)


def test_the_default_is_chunks_on_a_cpu_and_one_pass_on_a_gpu() -> None:
    assert default_chunk_windows("cpu") == CPU_CHUNK_WINDOWS > 0
    assert default_chunk_windows("cuda") == 0
    assert default_chunk_windows("cuda:1") == 0


def test_the_cli_help_states_the_library_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["train", "qa", "--help"])
    assert exited.value.code == 0
    assert f"default: {CPU_CHUNK_WINDOWS} on a CPU" in " ".join(capsys.readouterr().out.split())
