"""The options of every dilstore progress bar (tqdm): a live bar on a terminal, a line now and then in a log.

On a stderr that is no terminal (CI, `> log 2>&1`, a systemd journal) tqdm still redrew its bar with a carriage
return up to ten times a second: an hour of `evaluate-qa` or a day of `precompute` left one line of megabytes of
frames in the log, which `less`, `grep` and CI viewers show as one garbled line or thousands of lines (obs57 F1).
There each bar writes one plain line per LOG_INTERVAL_SECONDS instead, and its last state when it ends.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

Bar = TypeVar("Bar")

# In a log: at most one progress line per bar this often, besides its first and last.
LOG_INTERVAL_SECONDS = 30.0
# The wall clock when this module was imported, less the monotonic clock then: steady_time's origin.
_STEADY_ORIGIN = time.time() - time.monotonic()


def steady_time() -> float:
    """Seconds since the epoch that never step: the wall clock read once, at import, and the monotonic clock since.

    tqdm times its bars with time.time(): after a wall clock stepped back an
    hour (an NTP step, a date set by hand) a bar stood still and a log got no
    progress line for that hour, as if the run hung, and a clock set forward
    put that much into its elapsed time and rate (time58 F5). Epoch-like
    values, not the monotonic clock's own, so that tqdm's monitor thread,
    which reads time.time(), still compares like with like.
    """
    return _STEADY_ORIGIN + time.monotonic()


class _SteadyClock:
    """A tqdm class mixin: the bar is timed by `steady_time`, whatever tqdm's __init__ sets."""

    @property
    def _time(self) -> Callable[[], float]:
        return steady_time

    @_time.setter
    def _time(self, _clock: Callable[[], float]) -> None:
        """tqdm's __init__ sets time.time here: kept out."""


@functools.cache
def steady_bar(bar_class: type[Bar]) -> type[Bar]:
    """`bar_class` (tqdm's, or tqdm.auto's) timed by `steady_time`: every dilstore progress bar is made with it."""
    return type(bar_class.__name__, (_SteadyClock, bar_class), {"__module__": __name__})


class _Lines:
    """A stream for tqdm that writes each frame of a bar as one line, without tqdm's carriage returns and padding.

    On a closed stderr (`2>&-`, which Python makes `sys.stderr = None`) it writes nothing: tqdm wrote to None, and
    every command whose main thread draws its bar (verify, index, compact, evaluate-qa, rerank, train; precompute's
    polling thread died alone) ended at its first frame, exit 1 with no word, where the others say what went wrong
    on stdout (read57 F3).
    """

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        frame = text.replace("\r", "").rstrip(" ")
        if frame.strip() and self.stream is not None:
            self.stream.write(frame if frame.endswith("\n") else frame + "\n")
        return len(text)

    def flush(self) -> None:
        if self.stream is not None:
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def redrawn_in_place(stream: TextIO) -> bool:
    """Whether a bar on `stream` is redrawn where it stands: a terminal, or a Jupyter kernel's output (ipykernel's
    OutStream, which says it is no terminal, and whose notebook draws a carriage return in place), also behind the
    wrappers that keep its writes (runners.quiet.DiagnosticStream, `_Lines`: their `stream`).

    A notebook calling `dilstore.precompute`, `verify` or an evaluation got one line per 30 s, a bar that looked
    stuck, where it had been redrawn live (read57 F2); tqdm.auto's notebook widget too was redrawn only as often.
    """
    for _ in range(4):  # a wrapper of a wrapper at most, with room
        if is_terminal(stream) or type(stream).__module__.partition(".")[0] == "ipykernel":
            return True
        stream = getattr(stream, "__dict__", {}).get("stream")
        if stream is None:
            return False
    return False


def bar_options(stream: TextIO | None = None, mininterval: float = 0.1) -> dict[str, Any]:
    """tqdm's `file`, `mininterval` (and `maxinterval`) and `dynamic_ncols` for a bar on `stream` (stderr by
    default): redrawn at most every `mininterval` seconds on a terminal or in a notebook (`redrawn_in_place`), one
    line every LOG_INTERVAL_SECONDS elsewhere, nowhere on a closed stderr (None)."""
    stream = sys.stderr if stream is None else stream
    if stream is not None and redrawn_in_place(stream):
        return {"file": stream, "mininterval": mininterval, "dynamic_ncols": True}
    # maxinterval too: tqdm's monitor thread otherwise redraws a bar left alone for 10 s (its default).
    interval = max(mininterval, LOG_INTERVAL_SECONDS)
    return {"file": _Lines(stream), "mininterval": interval, "maxinterval": interval, "dynamic_ncols": False}
