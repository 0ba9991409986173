"""The shared stage timer of the serving paths: wall-clock seconds per named stage."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StageTimer:
    """A base for dataclasses whose float fields are stage times: `with timer.measure("stage"): ...`."""

    @contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        """Add the time spent inside the block to `stage`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, stage, getattr(self, stage) + time.perf_counter() - started)
