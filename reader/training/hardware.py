"""The machine a run is on, in words: the CPU's model name.

Without torch, so that a storage benchmark (benchmarks/bench_scale.py) describes its machine with the same function
as a training run's record (reader/training/loop.py `hardware_description`), not a copy of its own (dup55 D4).
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as Linux gives it in `cpuinfo`; where there is none, what `platform` knows, often only
    the architecture ("x86_64" said nothing of the machine a card's run was trained on, train52)."""
    try:
        lines = cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()
