"""The shared stage timer of the serving paths: wall-clock seconds per named stage."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_ADDING = threading.Lock()  # one for every timer: an addition is rare next to the work it counts


class StageTimer:
    """A base for dataclasses whose float fields are stage times: `with timer.measure("stage"): ...`."""

    def add(self, **amounts: float) -> None:
        """Add each amount to the field of its name, all under one lock: a timer shared by threads (a RerankStats
        given to `rerank` calls on a pool) lost counts and seconds to `+=`, whose read and write another thread's
        addition can fall between (left55 F12)."""
        with _ADDING:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    @contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        """Add the time spent inside the block to `stage`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(**{stage: time.perf_counter() - started})
