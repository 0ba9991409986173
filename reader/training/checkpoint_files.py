"""Where a training run keeps its settings and periodic checkpoints, by name only: no torch.

A stopped command says where its run goes on from (runners/training_options.resume_hint), and a stop can come
while torch is still being imported; importing it again then fails inside the half-imported module. So the
names and the lookup of the newest complete checkpoint live here, apart from reader/training/state.py, which
writes and reads the checkpoints' tensors.
"""

from __future__ import annotations

import re
from pathlib import Path

RUN_CONFIG_FILE = "run_config.json"  # RUN/run_config.json: the run's settings, inputs and command
CHECKPOINTS_DIR = "checkpoints"  # RUN/checkpoints/step-NNNNNNN: the periodic checkpoints
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"  # written last: a step folder without it is incomplete
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_directory(checkpoints: Path, step: int) -> Path:
    """The folder a periodic checkpoint at `step` lives in."""
    return Path(checkpoints) / f"step-{step:07d}"


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """The complete periodic checkpoint with the highest step, or None when there is none."""
    candidates = []
    if Path(checkpoints).is_dir():
        for path in Path(checkpoints).iterdir():
            match = STEP_DIR.match(path.name)
            if match and (path / STATE_JSON).is_file():
                candidates.append((int(match.group(1)), path))
    return max(candidates)[1] if candidates else None
