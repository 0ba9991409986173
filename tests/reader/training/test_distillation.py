"""`train qa --teacher`: DeFormer-style distillation of a k>0 reader from a k=0 teacher.

The losses are checked against their definitions, the whole loss against
plain training when the teacher equals the student, and the command's
refusals; the tiny random reader keeps every run to a second or two.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.qa import (
    Distillation,
    TrainingConfig,
    accumulate_gradients,
    distillation_loss,
    load_training_data,
    representation_loss,
    train_qa,
)
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory, tiny_base: Path, squad_file: Path) -> Path:
    """A k=0 tiny reader, briefly trained so that its head is not at its initialisation."""
    output = tmp_path_factory.mktemp("teacher")
    config = TrainingConfig(layers=0, max_steps=3, batch_size=4, learning_rate=1e-3, log_every=1000, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, output, config, command="test teacher", progress=False)
    return output


logits_pairs = st.integers(min_value=1, max_value=4).flatmap(
    lambda batch: st.integers(min_value=2, max_value=12).flatmap(
        lambda width: st.tuples(
            st.lists(st.floats(-20, 20), min_size=batch * width, max_size=batch * width),
            st.lists(st.floats(-20, 20), min_size=batch * width, max_size=batch * width),
            st.just((batch, width)),
        )
    )
)


@settings(max_examples=50, deadline=None)
@given(logits_pairs, st.floats(0.5, 4.0))
def test_distillation_loss_is_temperature_scaled_kl(pair, temperature: float) -> None:
    """T^2 * KL(teacher || student) at T, averaged over start and end; zero against itself, never negative."""
    student_values, teacher_values, shape = pair
    student = torch.tensor(student_values).reshape(shape)
    teacher = torch.tensor(teacher_values).reshape(shape)
    loss = distillation_loss((student, teacher), (teacher, student), temperature)
    p_teacher = torch.softmax(teacher / temperature, dim=-1)
    p_student = torch.softmax(student / temperature, dim=-1)
    kl_start = (p_teacher * (p_teacher.log() - p_student.log())).sum(-1).mean()
    kl_end = (p_student * (p_student.log() - p_teacher.log())).sum(-1).mean()
    expected = temperature**2 * (kl_start + kl_end) / 2
    assert float(loss) == pytest.approx(float(expected), rel=1e-4, abs=1e-5)
    assert float(loss) >= -1e-6
    assert float(distillation_loss((student, student), (student, student), temperature)) == pytest.approx(0, abs=1e-6)


def test_distillation_loss_is_kl_of_the_student_from_the_teacher_not_the_reverse() -> None:
    """Hinton et al.'s direction, T^2 * sum p_teacher (log p_teacher - log p_student), with the same pair on start and
    end, so that the two directions cannot cancel out in the mean (they give 0.7163 and 0.6856 here)."""
    student = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    teacher = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    temperature = 2.0
    loss = float(distillation_loss((student, student), (teacher, teacher), temperature))
    p_teacher = torch.softmax(teacher / temperature, dim=-1)
    p_student = torch.softmax(student / temperature, dim=-1)
    teacher_first = float(temperature**2 * (p_teacher * (p_teacher.log() - p_student.log())).sum())
    student_first = float(temperature**2 * (p_student * (p_student.log() - p_teacher.log())).sum())
    assert abs(teacher_first - student_first) > 0.03
    assert loss == pytest.approx(teacher_first, rel=1e-5)
    assert loss == pytest.approx(0.716273, abs=1e-5)


def test_distillation_loss_gives_padding_no_weight() -> None:
    """Positions at the dtype's minimum in both (padding) change nothing."""
    lowest = torch.finfo(torch.float32).min
    student = torch.tensor([[1.0, 2.0, 0.5]])
    teacher = torch.tensor([[0.0, 3.0, 1.0]])
    padded_student = torch.cat([student, torch.full((1, 2), lowest)], dim=1)
    padded_teacher = torch.cat([teacher, torch.full((1, 2), lowest)], dim=1)
    plain = distillation_loss((student, student), (teacher, teacher), 2.0)
    padded = distillation_loss((padded_student, padded_student), (padded_teacher, padded_teacher), 2.0)
    assert torch.isfinite(padded)
    assert float(padded) == pytest.approx(float(plain), rel=1e-6)


def test_representation_loss_counts_valid_tokens_only() -> None:
    """The squared distance per valid token and dimension, averaged over layers; padding may differ freely."""
    student = [torch.zeros(1, 3, 2), torch.ones(1, 3, 2)]
    teacher = [torch.ones(1, 3, 2), torch.ones(1, 3, 2)]
    teacher[1][0, 2] = 100.0  # a padded position
    mask = torch.tensor([[1, 1, 0]])
    assert float(representation_loss(student, teacher, mask)) == pytest.approx((1.0 + 0.0) / 2)


def test_a_teacher_equal_to_the_student_adds_nothing(teacher_dir: Path, squad_file: Path) -> None:
    """With the student's own weights and k as teacher (no dropout), the loss is the plain cross-entropy."""
    student = DilBertReader.from_pretrained(teacher_dir).train()
    teacher = DilBertReader.from_pretrained(teacher_dir).eval()
    data = load_training_data(student.tokenizer, squad_file, TrainingConfig(layers=0, **SMALL_WINDOWS))
    batches = [list(range(4))]
    device = torch.device("cpu")
    plain = accumulate_gradients(student, data, batches, device).item()
    student.zero_grad()
    distilled = accumulate_gradients(
        student, data, batches, device, distillation=Distillation(teacher, 2.0, 1.0, 1.0)
    ).item()
    assert distilled == pytest.approx(plain, rel=1e-5)


def test_a_different_teacher_adds_a_positive_loss(teacher_dir: Path, squad_file: Path) -> None:
    """A k=1 student started from the k=0 teacher differs from it above layer 1, so both terms are positive."""
    student = DilBertReader.from_pretrained(teacher_dir, layers=1).train()
    teacher = DilBertReader.from_pretrained(teacher_dir).eval()
    data = load_training_data(student.tokenizer, squad_file, TrainingConfig(layers=1, **SMALL_WINDOWS))
    batches = [list(range(4))]
    device = torch.device("cpu")
    plain = accumulate_gradients(student, data, batches, device).item()
    only_logits = accumulate_gradients(
        student, data, batches, device, distillation=Distillation(teacher, 2.0, 1.0, 0.0)
    ).item()
    both = accumulate_gradients(
        student, data, batches, device, distillation=Distillation(teacher, 2.0, 1.0, 1.0)
    ).item()
    assert plain < only_logits < both


def test_cli_distils_and_records_the_teacher(
    teacher_dir: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "student"
    status = main(
        [
            "train", "qa", "--model", str(teacher_dir), "--teacher", str(teacher_dir), "--layers", "1",
            "--train", str(squad_file), "--output", str(output), "--max-steps", "2", "--batch-size", "4",
            "--max-seq-length", "48", "--doc-stride", "16", "--max-question-length", "24",
            "--distillation-temperature", "3", "--no-progress", "--json",
        ]
    )  # fmt: skip
    assert status == 0, capsys.readouterr().err
    config = json.loads((output / "run_config.json").read_text())["config"]
    assert config["teacher"] == str(teacher_dir)
    assert config["distillation_temperature"] == 3.0
    assert DilBertReader.from_pretrained(output).layers == 1


def test_a_teacher_with_more_layers_apart_is_refused(teacher_dir: Path, squad_file: Path, tmp_path: Path) -> None:
    student_k1 = tmp_path / "k1"
    DilBertReader.from_pretrained(teacher_dir, layers=1).save_pretrained(student_k1)
    config = TrainingConfig(layers=0, max_steps=1, batch_size=4, teacher=str(student_k1), **SMALL_WINDOWS)
    with pytest.raises(DilstoreError, match="k=1, more than the student's k=0"):
        train_qa(teacher_dir, squad_file, tmp_path / "out", config, command="test", progress=False)


def test_a_teacher_with_as_many_layers_apart_as_the_student_is_taken(teacher_dir: Path, tmp_path: Path) -> None:
    """k no larger than the student's: a teacher of the same k is the student's own online part, and is taken."""
    from dilstore.reader.training.qa import load_teacher

    teacher_k1 = tmp_path / "k1"
    DilBertReader.from_pretrained(teacher_dir, layers=1).save_pretrained(teacher_k1)
    student = DilBertReader.from_pretrained(teacher_dir, layers=1)
    assert load_teacher(teacher_k1, student, torch.device("cpu")).layers == 1


def test_a_base_model_as_teacher_is_refused_for_its_untrained_head(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """It was told to give its k with --layers, which the command already had (the student's)."""
    config = TrainingConfig(layers=1, max_steps=1, batch_size=4, teacher=str(tiny_base), **SMALL_WINDOWS)
    with pytest.raises(DilstoreError, match=rf"--teacher {tiny_base} is a base model without dilstore metadata, and "
                                            "its QA head is untrained"):  # fmt: skip
        train_qa(tiny_base, squad_file, tmp_path / "out", config, command="test", progress=False)


def test_a_student_without_online_layers_is_refused(teacher_dir: Path, squad_file: Path, tmp_path: Path) -> None:
    """k = l leaves no layer states to match: the first step died with an IndexError, whatever the weights."""
    layers = DilBertReader.from_pretrained(teacher_dir).num_layers
    config = TrainingConfig(layers=layers, max_steps=1, batch_size=4, teacher=str(teacher_dir),
                            representation_weight=0.0, **SMALL_WINDOWS)  # fmt: skip
    with pytest.raises(DilstoreError, match=rf"--teacher: the student has k={layers} of {layers} layers, none online"):
        train_qa(teacher_dir, squad_file, tmp_path / "out", config, command="test", progress=False)


def test_cli_reports_a_missing_teacher(squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-teacher"
    status = main(
        ["train", "qa", "--layers", "1", "--train", str(squad_file), "--output", str(tmp_path / "o"),
         "--teacher", str(missing)]
    )  # fmt: skip
    assert status == 2
    assert f"--teacher {missing}: no such directory" in capsys.readouterr().err


@pytest.mark.parametrize("changes", [{"distillation_temperature": 0.0}, {"representation_weight": -1.0}])
def test_config_rejects_bad_distillation_settings(changes: dict) -> None:
    with pytest.raises(DilstoreError, match="distillation temperature must be positive"):
        TrainingConfig(layers=1, **changes)
