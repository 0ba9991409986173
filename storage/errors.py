"""The one exception type that carries a user-facing message, and the one "must be at least 1" check.

It lives in the lowest layer so that every layer above can raise it and the
command line can turn it into a clear message and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

from collections.abc import Mapping


class DilstoreError(Exception):
    """A problem with the user's input or files, explained in the message."""


def require_at_least_one(values: Mapping[str, int | None], *, dashed: bool = True) -> None:
    """A DilstoreError naming the first value below 1; None means unset.

    Names are spelt as their command-line flags (`batch_size` → batch-size)
    unless not `dashed`, for settings objects whose errors name the field.
    """
    for name, value in values.items():
        if value is not None and value < 1:
            label = name.replace("_", "-") if dashed else name
            raise DilstoreError(f"{label} must be at least 1, got {value}")
