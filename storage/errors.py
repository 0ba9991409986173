"""The exception type that carries a user-facing message (and its one kind for a run stopped by a signal), and the
one "must be at least 1" check.

It lives in the lowest layer so that every layer above can raise it and the
command line can turn it into a clear message and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

from collections.abc import Mapping


class DilstoreError(Exception):
    """A problem with the user's input or files, explained in the message."""


class StoppedBySignal(DilstoreError):
    """A long run stopped, as asked, by SIGTERM or SIGINT after saving what it needs to continue.

    Not the user's mistake: the command line prints the message (where the run
    can go on from) and exits with 128 + the signal's number, as a shell reports it.
    """

    def __init__(self, message: str, signal_number: int) -> None:
        super().__init__(message)
        self.signal_number = signal_number


def require_at_least_one(values: Mapping[str, int | None], *, dashed: bool = True) -> None:
    """A DilstoreError naming the first value below 1; None means unset.

    Names are spelt as their command-line flags (`batch_size` → batch-size)
    unless not `dashed`, for settings objects whose errors name the field.
    """
    for name, value in values.items():
        if value is not None and value < 1:
            label = name.replace("_", "-") if dashed else name
            raise DilstoreError(f"{label} must be at least 1, got {value}")
