"""The training loop reads a step's loss off the device only at log lines, checkpoints and the end.

A read (`.item()`, `float`, formatting, `.tolist()`) waits for the device to finish everything queued, so a
read per step would stop a GPU's host from preparing the next step while this one computes. The steps' losses
are wrapped in a tensor subclass that counts reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from dilstore.reader.training import qa
from dilstore.reader.training.qa import TrainingConfig, train_qa
from tests.fixtures.qa_training_fixtures import SMALL_WINDOWS

READS = (torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__format__, torch.Tensor.tolist)


class CountedReads(torch.Tensor):
    """A tensor whose reads to the host, and those of tensors computed from it, are counted."""

    reads: ClassVar[int] = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in READS:
            CountedReads.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize(("log_every", "save_every", "reads"), [(2, 0, 2 + 1), (4, 0, 1 + 1), (4, 1, 1 + 3 + 1)])
def test_a_steps_loss_is_read_only_at_log_lines_checkpoints_and_the_end(
    tiny_base: Path, squad_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    log_every: int, save_every: int, reads: int,
) -> None:  # fmt: skip
    original = qa.accumulate_gradients
    monkeypatch.setattr(qa, "accumulate_gradients", lambda *a, **k: original(*a, **k).as_subclass(CountedReads))
    CountedReads.reads = 0
    config = TrainingConfig(layers=1, max_steps=4, batch_size=3, log_every=log_every, save_every=save_every,
                            save_every_minutes=0, seed=3, **SMALL_WINDOWS)  # fmt: skip
    result = train_qa(tiny_base, squad_file, tmp_path, config, command="a", progress=True)
    assert result.steps == 4 and len(result.losses) == 4
    assert all(isinstance(loss, float) and loss > 0 for loss in result.losses)
    assert CountedReads.reads == reads, "log lines + checkpoints (none at the last step) + one read of all at the end"


def test_each_log_line_shows_the_mean_loss_of_the_steps_since_the_line_before(
    tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Learning curves are read from these lines (benchmarks/gpu_reader_schedule.py): 5 steps logged every 2 give
    lines at steps 2, 4 and 5, each the mean of its own steps' losses."""
    config = TrainingConfig(layers=1, max_steps=5, batch_size=3, log_every=2, save_every=0, save_every_minutes=0,
                            seed=3, **SMALL_WINDOWS)  # fmt: skip
    result = train_qa(tiny_base, squad_file, tmp_path, config, command="a", progress=False)
    lines = [line.split() for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert [line[1] for line in lines] == ["2/5", "4/5", "5/5"]
    means = [sum(result.losses[0:2]) / 2, sum(result.losses[2:4]) / 2, result.losses[4]]
    assert [float(line[3]) for line in lines] == pytest.approx(means, abs=5e-5)
