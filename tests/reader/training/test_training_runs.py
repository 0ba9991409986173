"""Where training runs live and how often they checkpoint: a killed run loses minutes, not hours.

The tiny random reader keeps each run to a second or two.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS

from dilstore.reader.training.qa import TrainingConfig, train_qa
from dilstore.reader.training.state import latest_checkpoint
from dilstore.runners.cli import main
from dilstore.storage.errors import DilstoreError


def test_checkpoints_are_saved_by_time_without_a_step_interval(
    tiny_base: Path, squad_file: Path, tmp_path: Path
) -> None:
    """With save_every=0 and a tiny time interval, every step but the last leaves a resumable checkpoint."""
    config = TrainingConfig(
        layers=1, max_steps=3, batch_size=2, save_every=0, save_every_minutes=1e-9, keep_checkpoints=10, **SMALL_WINDOWS
    )
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    steps = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert steps == ["step-0000001", "step-0000002"]


def test_no_time_checkpoint_when_disabled(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    config = TrainingConfig(layers=1, max_steps=3, batch_size=2, save_every=0, save_every_minutes=0, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    assert latest_checkpoint(tmp_path / "checkpoints") is None


def test_resume_may_change_the_checkpoint_interval(tiny_base: Path, squad_file: Path, tmp_path: Path) -> None:
    config = TrainingConfig(layers=1, max_steps=2, batch_size=2, save_every=1, **SMALL_WINDOWS)
    train_qa(tiny_base, squad_file, tmp_path, config, command="t", progress=False)
    resumed = train_qa(
        tiny_base, squad_file, tmp_path, replace(config, save_every_minutes=1.0), command="t", resume=True,
        progress=False,
    )  # fmt: skip
    assert resumed.steps == 2


def test_negative_minutes_are_refused() -> None:
    with pytest.raises(DilstoreError, match="save-every-minutes must be 0"):
        TrainingConfig(layers=1, save_every_minutes=-1)


def test_cli_runs_go_outside_the_work_tree_by_default(
    tiny_base: Path, squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Without --output, `train qa` writes to $DILSTORE_RUNS/qa-kK, and --resume finds the run there again."""
    monkeypatch.setenv("DILSTORE_RUNS", str(tmp_path / "runs"))
    arguments = [
        "train", "qa", "--model", str(tiny_base), "--layers", "1", "--train", str(squad_file), "--max-steps", "2",
        "--batch-size", "2", "--save-every", "1", "--max-seq-length", "48", "--doc-stride", "16",
        "--max-question-length", "24", "--no-progress", "--json",
    ]  # fmt: skip
    assert main(arguments) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["output"] == str(tmp_path / "runs" / "qa-k1")
    assert (tmp_path / "runs" / "qa-k1" / "model.safetensors").is_file()
    assert main([*arguments, "--resume"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["train_steps"] == 2
